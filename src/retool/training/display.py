"""What a person watching a run sees: two progress bars and one summary line per step.

The bars are tqdm's (an outer one over steps, an inner one over the step's
trajectories or conversations), silent off a TTY; the summary line is printed
either way, to stdout, and also written to ``log.txt`` by the session.
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from retool.training.ticker import keep_ticking


class Display:
    """An outer bar over steps and an inner one over trajectories (tqdm; silent off a TTY).

    One summary line per step is printed either way.
    """

    def __init__(
        self, total_steps: int, first_step: int, per_step: int, enabled: bool, unit: str
    ) -> None:
        disable = None if enabled else True  # None: tqdm turns itself off when not a TTY
        self.per_step = per_step
        self.step: int | None = None  # the step the inner bar counts (new_step's)
        self.steps = tqdm(
            total=total_steps,
            initial=first_step,
            desc="steps",
            unit="step",
            disable=disable,
            position=0,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self.inner = tqdm(
            total=per_step,
            desc="step",
            unit=unit,
            disable=disable,
            position=1,
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        keep_ticking(self.inner, self.steps)  # elapsed time moves while a straggler decodes

    def phase(self, name: str) -> None:
        self.inner.set_description_str(name)

    def advance(self, count: int, total: int | None = None) -> None:
        if total is not None and total != self.inner.total:  # dynamic sampling's extras
            self.inner.total = total
        self.inner.update(count)

    def new_step(self, phase: str, step: int | None = None, done: int = 0) -> None:
        """A fresh inner bar for ``step``; ``done`` units of it already ended (an overlapped
        step's rollout runs ahead of the bar, :mod:`retool.training.overlap`)."""
        self.step = step
        self.inner.reset(total=self.per_step)
        if done:
            self.inner.update(done)
        self.inner.set_description_str(phase)

    def end_step(self, line: str, advance: bool = True) -> None:
        if advance:
            self.steps.update(1)
        tqdm.write(line, file=sys.stdout)

    def close(self) -> None:
        self.inner.close()
        self.steps.close()


def step_summary(step: int, total: int, metrics: dict[str, float]) -> str:
    """The RL step's line: time, loss and gradient norm, reward, tool use, throughput."""
    loss = metrics.get("train/loss:sum")
    # PPO's loss on freshly sampled tokens is ~0 by construction (ratio 1, advantages
    # centred per group), so it is printed to 3 significant digits, not as -0.0000,
    # with the gradient norm that shows the update is not.
    loss_text = "update skipped"
    if loss is not None:
        loss_text = f"loss {loss:+.3g}"
        if "optim/grad_norm" in metrics:
            loss_text += f"  grad norm {metrics['optim/grad_norm']:.3g}"
    line = (
        f"step {step}/{total}  {metrics['time/step_s']:.1f}s  {loss_text}  "
        f"reward {metrics['reward/mean']:+.3f}  correct {metrics['reward/correct']:.3f}  "
        f"code calls {metrics['rollout/code_calls']:.2f}  "
        f"{metrics['rollout/tokens_per_s']:.0f} tok/s"
    )
    if "rollout/filtered_groups" in metrics:  # rollout.dynamic_sampling is on
        line += (
            f"  filtered {metrics['rollout/filtered_groups']:.0f} groups"
            f" (+{metrics['rollout/extra_questions']:.0f} questions)"
        )
    if "rollout/dropped_void" in metrics:  # rollout.drop_void is on
        line += f"  dropped {metrics['rollout/dropped_void']:.0f} void"
    return line
