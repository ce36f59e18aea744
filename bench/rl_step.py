"""Time RL steps of the demo configuration and print where each step's time goes.

    .venv/bin/python bench/rl_step.py [--steps 2] [--config configs/demo.toml]
                                      [--init-from CHECKPOINT] [--set section.key=value ...]

Runs ``retool.training.loop.train`` on the config (the demo by default) for
``--steps`` steps in a temporary run directory, then reads the run directory's
``metrics.jsonl``: the loop's own phases (``time/<phase>_s``: snapshot, rollout,
datums, training, checkpoint), the rollout's counters, and, measured here by
timing the sampling engine's methods, how much of the rollout the sampler was
busy (prefill, decode steps) and how long the sandbox calls took. A rollout
much longer than the sampler's busy time shows an idle sampler (waiting for
tools or scoring), and the per-step model call against the whole decode step shows
the engine's own overhead. Prints whether each step is within the 40 s target.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

TARGET_S = 40.0


class EngineClock:
    """Seconds the sampling engine spent in prefill (``_admit``), decode steps (``_step``)
    and the model call inside them; rows and cache width summed over the decode steps."""

    def __init__(self) -> None:
        import torch

        from retool.backends.local.engine import SamplingEngine

        try:
            from retool.backends.local.decode import LeanDecoder
        except ImportError:  # an older tree (A/B runs against a baseline checkout)
            LeanDecoder = None

        self._lock = threading.Lock()
        self._reset()
        clock = self

        # On CUDA a model call returns once its kernels are queued: wait for them.
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

        def timed(original, key: str, wait=lambda: None):
            def run(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    wait()
                    with clock._lock:
                        clock.seconds[key] += time.perf_counter() - started

            return run

        original_step = SamplingEngine._step

        def step(engine):
            with clock._lock:
                clock.steps += 1
                clock.rows += len(engine._rows)
                clock.width += engine._batch.width if engine._batch is not None else 0
            return original_step(engine)

        SamplingEngine._step = timed(step, "decode")
        SamplingEngine._admit = timed(SamplingEngine._admit, "prefill")
        if LeanDecoder is not None:
            LeanDecoder.step = timed(LeanDecoder.step, "model", sync)

    def _reset(self) -> None:
        self.seconds = {"prefill": 0.0, "decode": 0.0, "model": 0.0}
        self.steps = self.rows = self.width = 0

    def take(self) -> dict[str, float]:
        with self._lock:
            out = {**self.seconds, "steps": self.steps, "rows": self.rows, "width": self.width}
            self._reset()
        return out


def tool_seconds(run_dir: Path, step: int) -> tuple[float, int]:
    """Sum of sandbox wall time over the step's tool calls, and their count."""
    import gzip

    path = run_dir / "rollouts" / f"step_{step:06d}.jsonl.gz"
    if not path.exists():
        return 0.0, 0
    total, calls = 0.0, 0
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            for observation in record.get("observations", []):
                if not observation.get("shared"):
                    total += float(observation.get("latency_s", 0.0))
                    calls += 1
    return total, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--init-from", default=None, help="checkpoint to start from (e.g. SFT)")
    parser.add_argument("--set", action="append", default=[], help="config override")
    args = parser.parse_args()

    from retool.config import load_config
    from retool.training.loop import train

    config = load_config(args.config, [f"train.steps={args.steps}", *args.set])
    clock = EngineClock()
    per_step: dict[int, dict[str, float]] = {}

    # The engine clock is read when each step's metrics line is written (after the rollout).
    from retool.training import run_dir as run_dir_module

    original_complete = run_dir_module.RunDirectory.complete_step

    def complete_step(self, step, metrics, records):
        per_step[step] = clock.take()
        return original_complete(self, step, metrics, records)

    run_dir_module.RunDirectory.complete_step = complete_step

    with tempfile.TemporaryDirectory(prefix="retool-rl-step-") as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        train(config, run_dir=str(run_dir), progress=False, init_from=args.init_from)
        total = time.perf_counter() - started
        lines = [
            json.loads(line)
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        tools = {int(m["step"]): tool_seconds(run_dir, int(m["step"])) for m in lines}

    phases = sorted({k for m in lines for k in m if k.startswith("time/") and k != "time/step_s"})
    print(f"{len(lines)} steps of {args.config} in {total:.1f}s (incl. model load)")
    header = ["step", *(p[len("time/") : -2] for p in phases), "step_s", "<= 40 s"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for m in lines:
        cells = [str(m["step"]), *(f"{m.get(p, 0.0):.1f}" for p in phases)]
        cells += [f"{m['time/step_s']:.1f}", "yes" if m["time/step_s"] <= TARGET_S else "NO"]
        print("| " + " | ".join(cells) + " |")
    print()
    print("inside the rollout phase:")
    header = [
        "step",
        "rollout_s",
        "sampler prefill_s",
        "sampler decode_s",
        "of which model_s",
        "decode steps",
        "ms/step",
        "rows/step",
        "cache width",
        "sampler idle_s",
        "tool calls",
        "tool wall_s (sum)",
        "sampled tok",
        "tok/s",
        "turns",
        "reward",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for m in lines:
        step = int(m["step"])
        engine = per_step.get(step, {})
        steps = int(engine.get("steps", 0))
        busy = engine.get("prefill", 0.0) + engine.get("decode", 0.0)
        rollout = m.get("time/rollout_s", 0.0)
        seconds, calls = tools[step]
        cells = [
            str(step),
            f"{rollout:.1f}",
            f"{engine.get('prefill', 0.0):.1f}",
            f"{engine.get('decode', 0.0):.1f}",
            f"{engine.get('model', 0.0):.1f}",
            str(steps),
            f"{1e3 * engine.get('decode', 0.0) / max(steps, 1):.0f}",
            f"{engine.get('rows', 0) / max(steps, 1):.1f}",
            f"{engine.get('width', 0) / max(steps, 1):.0f}",
            f"{max(rollout - busy, 0.0):.1f}",
            str(calls),
            f"{seconds:.1f}",
            f"{m.get('rollout/sampled_tokens', 0.0):.0f}",
            f"{m.get('rollout/tokens_per_s', 0.0):.0f}",
            f"{m.get('rollout/turns', 0.0):.2f}",
            f"{m.get('reward/mean', 0.0):+.2f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print(f"load average at the end: {Path('/proc/loadavg').read_text().split()[:3]}")
    worst = max(m["time/step_s"] for m in lines)
    verdict = "yes" if worst <= TARGET_S else "no"
    print(f"RL STEP  slowest {worst:.1f}s | target <= {TARGET_S:.0f}s per step: {verdict}")


if __name__ == "__main__":
    main()
