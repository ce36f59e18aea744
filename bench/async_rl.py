"""Steps per minute of overlapped RL steps (``train.max_off_policy_steps = k``) against k = 0.

    .venv/bin/python bench/async_rl.py [--workload a|b|both] [--steps N]
        [--latency-ms 200] [--ks 0,1,2] [--init-from CHECKPOINT] [--set KEY=VALUE ...]

The same RL steps (same config, seeds and data) run once per k in ``--ks``, in
this process, each in a fresh run directory under a temporary directory, with
:func:`retool.training.loop.train`. Per k it prints the steady step rate (steps
per minute between the first and the last step's commit, so the model load and
the pipeline's fill are left out; the whole run's wall time beside it), its
ratio to k = 0, and the mean over steps of ``rollout/staleness_mean`` and
``train/sampler_kl`` (what the lag costs in policy mismatch).

Workloads:

* ``a``, latency-bound (the default ``--steps 8``): ``tiny-random`` (the
  tests' model) with the tests' custom reward ``tests.training.rewards:
  even_length`` (mixed rewards, so every step trains), behind a service that
  is ``--latency-ms`` away. This is a monkeypatch inside the bench process of
  ``retool.training.session.open_service``: the real local service is wrapped
  in :class:`FarService`, whose training client runs every ``forward``,
  ``forward_backward`` and ``optim_step`` one at a time in submission order,
  each after a sleep of one round trip (a remote trainer on one connection,
  as PyTRIO's dispatcher sends; ``bench/remote_pipeline.py`` describes the
  services), whose snapshot (``save_weights_and_get_sampling_client``) costs
  one round trip, and whose sampling client sleeps one round trip before
  every ``sample`` (concurrent requests overlap their waits; the rollout here
  asks for one question's group at a time, ``rollout.max_in_flight_samples =
  group_size``). The sleeps wait, they do not compute, so the two sides of a
  step overlap as they would against a remote service. Expected ratio:
  ``(rollout + rest) / max(rollout, rest)`` from k = 0's phase times, where
  ``rest`` is what the loop's thread does besides the rollout (snapshot,
  datums, training, checkpoint: ``time/step_s - time/rollout_s``); the table
  also prints the narrower ``(rollout + training) / max(rollout, training)``
  from ``time/rollout_s`` and ``time/training_s`` alone. k >= 2 can beat k = 1
  only where one side's time varies from step to step. The tiny model still
  computes (on a shared 2-core host, at 0 ms about 0.5 s of a step's rollout
  and 0.6 s of its training): run it with ``OMP_NUM_THREADS=1`` so that the
  two sides' torch threads do not oversubscribe the cores, and read the ratio
  against the expectation printed from the same run's k = 0.
* ``b``, the demo's local workload (the default ``--steps 3``):
  ``configs/demo.toml``'s RL settings on the bundled SmolLM2-135M-Instruct,
  from ``--init-from`` (the demo's SFT checkpoint, ``RUN/sft``, as ``retool
  demo`` starts its RL), else from the base model. From the base model every
  group scores alike (always wrong), so no step trains and the overlap has
  nothing to hide the rollout behind: measure from an SFT checkpoint.
  Sampling and training compete for the same CPU cores here, so the overlap
  can only gain what one side leaves idle. ``--set section.key=value`` goes to
  this workload's config (e.g. ``train.questions_per_batch=4`` for a shorter
  run).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the custom reward lives in tests/training/rewards.py

from retool.types import Future  # noqa: E402

# workload (a): the tests' tiny model and reward (tests/builders.py's TINY_RL), steps
# shaped so that rollout and training each take a few round trips: 4 sample requests
# (one question's group at a time); 16 trajectories trained in micro-batches of 4, an
# optim_step and a snapshot
TINY_SECTIONS: dict[str, dict[str, Any]] = {
    "model": {"device": "cpu"},
    "rollout": {"group_size": 4, "max_in_flight_samples": 4},
    "train": {
        "questions_per_batch": 4,
        "micro_batch_items": 4,
        "micro_batch_tokens": 4096,
        "save_every": 0,
    },
}
DEMO_CONFIG = ROOT / "configs" / "demo.toml"


# -- the far service of workload (a) ---------------------------------------------------
# the waits, looked up at each call (tests/bench/test_async_rl.py records them instead)
sleep = time.sleep
sleep_async = asyncio.sleep


class FarCalls:
    """One connection to a remote trainer: calls run one at a time in submission order,
    each ``latency`` seconds (a sleep) before the real call runs."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future]]
        self._queue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="far-trainer", daemon=True).start()

    def send(self, call: Callable[[], Any]) -> Future[Any]:
        inner: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((call, inner))
        return Future(inner)

    def _serve(self) -> None:
        while True:
            call, inner = self._queue.get()
            sleep(self.latency)
            try:
                inner.set_result(call())
            except BaseException as exc:
                inner.set_exception(exc)


class FarSampler:
    """A sampling client ``latency`` away: every sample request waits one round trip."""

    def __init__(self, inner: Any, latency: float) -> None:
        self.inner, self.latency = inner, latency

    def sample(self, prompt: Any, num_samples: int, sampling_params: Any) -> Future[Any]:
        def call() -> Any:
            sleep(self.latency)
            return self.inner.sample(prompt, num_samples, sampling_params).result()

        inner: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                inner.set_result(call())
            except BaseException as exc:
                inner.set_exception(exc)

        threading.Thread(target=run, name="far-sample", daemon=True).start()
        return Future(inner)

    async def sample_async(self, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
        await sleep_async(self.latency)
        return await self.inner.sample_async(prompt, num_samples, sampling_params)

    def __getattr__(self, name: str) -> Any:  # compute_logprobs, tokenizer, close...
        return getattr(self.inner, name)

    @property
    def max_context_tokens(self) -> int | None:
        return self.inner.max_context_tokens


class FarTrainer:
    """A training client ``latency`` away (:class:`FarCalls`); the rest passes through."""

    def __init__(self, inner: Any, latency: float) -> None:
        self.inner, self.latency = inner, latency
        self.calls = FarCalls(latency)

    def forward(self, data: Any, loss_fn: str, loss_fn_config: Any = None) -> Future[Any]:
        return self.calls.send(lambda: self.inner.forward(data, loss_fn, loss_fn_config).result())

    def forward_backward(self, data: Any, loss_fn: str, loss_fn_config: Any = None) -> Future[Any]:
        return self.calls.send(
            lambda: self.inner.forward_backward(data, loss_fn, loss_fn_config).result()
        )

    def optim_step(self, adam_params: Any) -> Future[Any]:
        return self.calls.send(lambda: self.inner.optim_step(adam_params).result())

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> FarSampler:
        sampler = self.calls.send(lambda: self.inner.save_weights_and_get_sampling_client(name))
        return FarSampler(sampler.result(), self.latency)

    def __getattr__(self, name: str) -> Any:  # checkpoints, tokenizer, ...
        return getattr(self.inner, name)

    @property
    def max_context_tokens(self) -> int | None:
        return self.inner.max_context_tokens


class FarService:
    """The real service, its training and sampling clients ``latency`` away."""

    def __init__(self, inner: Any, latency: float) -> None:
        self.inner, self.latency = inner, latency

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name.startswith("create_") and "training_client" in name:
            return lambda *a, **k: FarTrainer(attribute(*a, **k), self.latency)
        if name == "create_sampling_client":
            return lambda *a, **k: FarSampler(attribute(*a, **k), self.latency)
        return attribute


@contextlib.contextmanager
def far_service(latency: float) -> Iterator[None]:
    """``retool.training.session.open_service`` returns the real service behind
    :class:`FarService` while this is open (a bench-only monkeypatch)."""
    from retool.training import session

    original = session.open_service

    def open_far(*args: Any, **kwargs: Any) -> Any:
        return FarService(original(*args, **kwargs), latency)

    session.open_service = open_far
    try:
        yield
    finally:
        session.open_service = original


# -- running and summarizing -----------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """One k's run: its metrics lines and the commit time of each step."""

    k: int
    metrics: list[dict[str, float]]
    commits: list[float]  # time.monotonic() as each step's metrics line was written
    wall_s: float  # the whole train() call, model load included


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def steps_per_minute(measured: Measured) -> float:
    """Steady rate: steps between the first and the last commit (NaN for one step)."""
    if len(measured.commits) < 2:
        return float("nan")
    return 60.0 * (len(measured.commits) - 1) / (measured.commits[-1] - measured.commits[0])


def expected_ratio(metrics: Sequence[dict[str, float]]) -> tuple[float, float]:
    """From serial steps' phase times: ``(r + rest) / max(r, rest)`` with ``rest`` the
    loop thread's other phases, and ``(r + t) / max(r, t)`` with ``t`` the training alone
    (steps after the first, when there are more; the first loads lazily)."""
    lines = list(metrics[1:] or metrics)
    rollout = mean([m["time/rollout_s"] for m in lines])
    step = mean([m["time/step_s"] for m in lines])
    training = mean([m.get("time/training_s", 0.0) for m in lines])
    rest = step - rollout
    return step / max(rollout, rest), (rollout + training) / max(rollout, training)


def run_once(
    config_path: Path, settings: list[str], k: int, root: Path, init_from: str | None = None
) -> Measured:
    """``train()`` on the config with ``train.max_off_policy_steps = k`` in a fresh run dir."""
    from retool.config import load_config
    from retool.training import run_dir as run_dir_module
    from retool.training.loop import train

    config = load_config(str(config_path), [*settings, f"train.max_off_policy_steps={k}"])
    commits: list[float] = []
    original = run_dir_module.RunDirectory.complete_step

    def complete_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        commits.append(time.monotonic())
        return out

    run_dir_module.RunDirectory.complete_step = complete_step  # type: ignore[method-assign]
    log = root / f"k{k}.out"
    try:
        # the steps' summary lines go to a file: the table stays readable
        with log.open("w") as out, contextlib.redirect_stdout(out):
            started = time.monotonic()
            run = train(config, run_dir=str(root / f"k{k}"), progress=False, init_from=init_from)
            wall = time.monotonic() - started
    finally:
        run_dir_module.RunDirectory.complete_step = original  # type: ignore[method-assign]
    metrics = [json.loads(line) for line in run.metrics_path.read_text().splitlines() if line]
    return Measured(k, metrics, commits, wall)


def header() -> str:
    return (
        f"| {'k':>2} | {'steps/min':>9} | {'ratio':>5} | {'rollout s':>9} | {'training s':>10} "
        f"| {'step s':>6} | {'wall s':>6} | {'staleness':>9} | {'sampler_kl':>10} |\n"
        "| --: | --: | --: | --: | --: | --: | --: | --: | --: |"
    )


def row(measured: Measured, base: float | None) -> str:
    """One k's line; the phase columns are means over steps (the wait for the rollout
    under ``rollout s`` when k >= 1: the overlapped rollout's own time is not on the loop);
    ``sampler_kl`` over the steps that trained (a step with nothing to train has none)."""
    m = measured.metrics
    rate = steps_per_minute(measured)
    ratio = f"{rate / base:5.2f}" if base else "  -  "
    return (
        f"| {measured.k:>2} | {rate:9.2f} | {ratio} "
        f"| {mean([x['time/rollout_s'] for x in m]):9.2f} "
        f"| {mean([x.get('time/training_s', 0.0) for x in m]):10.2f} "
        f"| {mean([x['time/step_s'] for x in m]):6.2f} | {measured.wall_s:6.1f} "
        f"| {mean([x['rollout/staleness_mean'] for x in m]):9.2f} "
        f"| {mean([x['train/sampler_kl'] for x in m if 'train/sampler_kl' in x]):10.2e} |"
    )


def run_workload(
    name: str,
    config: Path | str,
    settings: list[str],
    ks: list[int],
    init_from: str | None = None,
) -> list[Measured]:
    """Each k in turn, its row printed as it ends; ``config`` a path, or TOML text."""
    print(f"\nworkload {name}", flush=True)
    print(header(), flush=True)
    base: float | None = None
    serial: Measured | None = None
    done = []
    with tempfile.TemporaryDirectory(prefix="retool-async-") as tmp:
        if isinstance(config, str):
            path = Path(tmp) / "run.toml"
            path.write_text(config, encoding="utf-8")
            config = path
        for k in ks:
            measured = run_once(config, settings, k, Path(tmp), init_from)
            done.append(measured)
            if k == 0:
                serial, base = measured, steps_per_minute(measured)
            print(row(measured, base), flush=True)
            if k != 0:
                overlapped = mean([m["time/rollout_overlapped_s"] for m in measured.metrics])
                print(f"|    (k = {k}: the rollout itself took {overlapped:.2f} s a step)")
    if serial is not None:
        full, narrow = expected_ratio(serial.metrics)
        print(
            f"expected ratio from k = 0's phases: {full:.2f} "
            "((rollout + rest of the step) / max of the two); "
            f"{narrow:.2f} ((rollout + training) / max of the two)",
            flush=True,
        )
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("a", "b", "both"), default="a")
    parser.add_argument("--steps", type=int, default=0, help="default: 8 for a, 3 for b")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="a: one round trip")
    parser.add_argument("--ks", default="0,1,2", help="comma-separated lags (0 first)")
    parser.add_argument("--init-from", default=None, help="b: checkpoint to start RL from")
    parser.add_argument("--set", action="append", default=[], help="b: config override")
    args = parser.parse_args(argv)
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        parser.error(f"--ks must be comma-separated integers, got {args.ks!r}")
    if min(ks) < 0 or args.steps < 0:
        parser.error("--ks and --steps must not be negative")
    print(
        f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
        flush=True,
    )
    if args.workload in ("a", "both"):
        steps = args.steps or 8
        latency = args.latency_ms / 1000
        settings = [f"train.steps={steps}"]
        title = f"a: tiny-random, {steps} steps, every service call {args.latency_ms:.0f} ms away"
        from tests.builders import run_toml

        with far_service(latency):
            run_workload(title, run_toml(**TINY_SECTIONS), settings, ks)
    if args.workload in ("b", "both"):
        steps = args.steps or 3
        settings = [*args.set, f"train.steps={steps}"]
        start = args.init_from or "the base model"
        title = f"b: configs/demo.toml RL on SmolLM2-135M from {start}, {steps} steps, local CPU"
        if args.set:
            title += f", --set {' '.join(args.set)}"
        run_workload(title, DEMO_CONFIG, settings, ks, args.init_from)


if __name__ == "__main__":
    main()
