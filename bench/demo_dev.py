"""Demo settings chosen on ``demo:dev`` only: RL variants from one SFT checkpoint.

    .venv/bin/python bench/demo_dev.py --sft runs/demo-.../sft \\
        [--variant off:rollout.dynamic_sampling=false] \\
        [--variant on:rollout.dynamic_sampling=true] [--reuse off=runs/demo-.../rl] \\
        [--config configs/demo.toml] [--output runs/dev-...]

Every choice the demo makes (dynamic sampling, budgets, demonstrations) is made
on ``demo:dev``, never on the two held-out splits, and per minute of CPU. This
script does that for RL-phase settings: from the same SFT checkpoint it trains
one RL run per variant (the demo's own ``[train]`` and ``[rollout]`` settings
plus the variant's ``--set``s, the demo's RL step count), evaluates the SFT
checkpoint and each RL checkpoint on ``demo:dev`` with the demo's evaluation
settings (the same problems, samples and seeds for every policy), then prints a
table (correct rate with its 95% CI, RL wall time, filtered groups and extra
questions from the run's metrics) and each variant paired against SFT and
against the first variant (``retool eval compare``). ``--reuse LABEL=RUN_DIR``
evaluates an RL run trained earlier from the same SFT checkpoint instead of
training it again (its wall time is read from its metrics). Every command is
printed as it runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from retool.config import load_config
from retool.evaluation.results import load_results
from retool.evaluation.summary import summarize

RETOOL = [sys.executable, "-m", "retool"]


def _run(argv: list[str]) -> str:
    print("$ retool " + " ".join(argv), flush=True)
    done = subprocess.run([*RETOOL, *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"retool {argv[0]} failed with status {done.returncode}")
    return done.stdout


def _rl_facts(run_dir: Path) -> dict[str, float]:
    """Wall time of the RL steps and dynamic sampling's counters, from metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    return {
        "steps": len(rows),
        "wall_s": sum(r["time/step_s"] for r in rows),
        "filtered": sum(r.get("rollout/filtered_groups", 0) for r in rows),
        "extra": sum(r.get("rollout/extra_questions", 0) for r in rows),
        "trained_steps": sum(1 for r in rows if not r.get("train/update_skipped", 0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft", required=True, help="the SFT checkpoint every variant starts from")
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--variant", action="append", default=[], help="LABEL:KEY=VALUE[,...]")
    parser.add_argument("--reuse", action="append", default=[], help="LABEL=RUN_DIR")
    parser.add_argument("--dataset", default="demo:dev")
    parser.add_argument("--output", default=time.strftime("runs/dev-%Y%m%d-%H%M%S"))
    args = parser.parse_args()
    if args.dataset != "demo:dev" and not args.dataset.startswith("demo:dev"):
        raise SystemExit(
            "choices are made on demo:dev only, never on a held-out split: --dataset must be it"
        )
    config = load_config(args.config)
    demo = config.demo
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--config", args.config, "--no-progress"]

    def evaluate(label: str, model: str) -> Path:
        path = out / f"{label}.jsonl"
        argv = ["eval", *common, "--model", model, "--dataset", args.dataset]
        argv += ["--val-n", str(demo.eval_n), "--output", str(path)]
        argv += ["--temperature", repr(demo.eval_temperature), "--top-p", repr(demo.eval_top_p)]
        if demo.eval_limit:
            argv += ["--limit", str(demo.eval_limit)]
        started = time.monotonic()
        _run(argv)
        print(f"  {label}: evaluated in {time.monotonic() - started:.0f} s", flush=True)
        return path

    runs: dict[str, Path] = {}
    for item in args.reuse:
        label, _, run_dir = item.partition("=")
        runs[label] = Path(run_dir)
    for item in args.variant:
        label, _, sets = item.partition(":")
        run_dir = out / f"rl-{label}"
        argv = ["train", *common, "--set", f"train.steps={demo.rl_steps}"]
        for setting in filter(None, sets.split(",")):
            argv += ["--set", setting]
        argv += ["--run-dir", str(run_dir), "--init-from", args.sft]
        _run(argv)
        runs[label] = run_dir
    files = {"sft": evaluate("sft", args.sft)}
    for label, run_dir in runs.items():
        files[label] = evaluate(label, str(run_dir))
    print(
        f"\n{args.dataset}: the demo's evaluation settings ({demo.eval_limit} problems x "
        f"{demo.eval_n} samples, temperature {demo.eval_temperature})"
    )
    print(
        f"{'policy':<8}{'correct (95% CI)':<24}{'RL wall':>9}{'trained':>9}"
        f"{'filtered':>10}{'extra q':>9}"
    )
    for label, path in files.items():
        results = load_results(path)
        summary = summarize(results.rows, results.n)
        low, high = summary.average_at_n_ci
        cell = f"{100 * summary.average_at_n:.1f} [{100 * low:.1f}, {100 * high:.1f}]"
        if label in runs:
            facts = _rl_facts(runs[label])
            extra = (
                f"{facts['wall_s'] / 60:>8.1f}m{facts['trained_steps']:>5}/{facts['steps']}"
                f"{facts['filtered']:>10.0f}{facts['extra']:>9.0f}"
            )
        else:
            extra = ""
        print(f"{label:<8}{cell:<24}{extra}")
    labels = list(runs)
    for label in labels:
        print(f"\n{label} - SFT:")
        print(_run(["eval", "compare", str(files["sft"]), str(files[label])]))
    for label in labels[1:]:
        print(f"\n{label} - {labels[0]}:")
        print(_run(["eval", "compare", str(files[labels[0]]), str(files[label])]))


if __name__ == "__main__":
    main()
