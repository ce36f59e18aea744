"""Why an RL run learns or stalls: its per-step facts and per-family correct rates.

    .venv/bin/python bench/rl_diagnostics.py runs/demo-.../rl

Reads a finished (or running) run directory, changes nothing, and prints one row
per step from ``metrics.jsonl``: the training batch's correct and format rates,
the share of trajectories that ran code, the share of sandbox calls that failed,
the share of groups whose samples all scored alike (no learning signal), the
sampled tokens' mean -logprob (an entropy estimate; runs since 2026-12-06), and
the gradient norm. Then, for the demo dataset, the correct rate per problem
family: per training step from the journaled rollouts (``rollouts/``), and per
evaluated step of ``train.eval_every`` (``eval/step_*.jsonl``, the learning
curve's points), so a family no policy solves, or one that RL unlearns, shows.
Issue 43, part 3 asks for exactly these.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

from retool.data.demo import SPLITS, demo_problems

COLUMNS = (
    ("reward/correct", "correct", "{:.0%}"),
    ("reward/format", "format", "{:.0%}"),
    ("rollout/tool_use_rate", "ran code", "{:.0%}"),
    ("sandbox/error_rate", "calls failed", "{:.0%}"),
    ("rollout/degenerate_group_rate", "alike groups", "{:.0%}"),
    ("rollout/sampled_nll", "-logprob", "{:.3f}"),
    ("optim/grad_norm", "grad norm", "{:.3f}"),
)


def _families() -> dict[str, str]:
    """Demo problem id -> its family, over every split."""
    return {p.id: p.family for split in SPLITS for p in demo_problems(split)}


def _rate(hits: list[bool]) -> str:
    return f"{sum(hits) / len(hits):.0%} ({len(hits)})" if hits else "-"


def _family_table(title: str, rows: dict[int, dict[str, list[bool]]]) -> None:
    names = sorted({family for by_family in rows.values() for family in by_family})
    if not names:
        return
    print(f"\n{title}")
    print("step " + "".join(f"{name:>18}" for name in names))
    for step in sorted(rows):
        cells = "".join(f"{_rate(rows[step].get(name, [])):>18}" for name in names)
        print(f"{step:>4} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    run_dir: Path = args.run_dir
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in metrics if "reward/correct" in m]
    shown = [c for c in COLUMNS if any(c[0] in m for m in metrics)]
    print("step " + "".join(f"{label:>14}" for _, label, _ in shown))
    for m in metrics:
        cells = "".join(f"{fmt.format(m[key]) if key in m else '-':>14}" for key, _, fmt in shown)
        print(f"{m['step']:>4} {cells}")

    family = _families()
    batches: dict[int, dict[str, list[bool]]] = {}
    for path in sorted((run_dir / "rollouts").glob("step_*.jsonl*")):
        step = int(re.findall(r"\d+", path.name)[0])
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle if line.strip()]
        by_family: dict[str, list[bool]] = defaultdict(list)
        for record in records:
            if record.get("example_id") in family:
                by_family[family[record["example_id"]]].append(bool(record["correct"]))
        batches[step] = dict(by_family)
    _family_table("training batches, correct per family (trajectories)", batches)

    evals: dict[int, dict[str, list[bool]]] = {}
    for path in sorted((run_dir / "eval").glob("step_*.jsonl")):
        step = int(re.findall(r"\d+", path.name)[0])
        by_family = defaultdict(list)
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row.get("problem_id") in family and "correct" in row:
                by_family[family[row["problem_id"]]].append(bool(row["correct"]))
        evals[step] = dict(by_family)
    _family_table("train.eval_every's evaluations, correct per family (samples)", evals)


if __name__ == "__main__":
    main()
