"""Packing benchmark: the reference's first-fit decreasing vs our exact dynamic program.

    .venv/bin/python bench/packing.py [--batches 1000] [--size 64] [--seed 0]

Limits are the reference's: ``max_items=32``, ``max_padded_tokens=64,000``.
Workloads (fixed seed, the same batches for both packers):

- ``chapter``: the chapter's example ``[8000, 7800, 3000 x 10]``.
- ``rollout``: batches of 64 trajectories of a code-interlaced rollout. A
  trajectory is a prompt of 300-600 tokens (uniform) and 1-4 assistant turns
  (probabilities 0.35 / 0.30 / 0.20 / 0.15: most answers need one or two code
  calls); each turn samples 50-1024 tokens (log-uniform: short code cells are
  common, long reasoning rarer), and every turn but the last is followed by an
  observation of 20-512 tokens (log-uniform: most outputs are a number or a
  line, some a traceback or a printed table). Lengths 370-6,232 tokens.
- ``long-tail``: the same with turns of 50-4096 sampled tokens (a reasoning
  model), each trajectory cut at the reference's 8,192-token context limit;
  here the 64,000 area limit binds (7 items of 8,192).

Packers: the reference's first-fit decreasing; ours with its default objective
(fewest micro-batches, then least padded area); ours minimising padded area
alone (``batch_overhead_tokens=0``), to show why that is not the default.

Reports padded area over the sum of lengths (1.00 = no padding; mean and worst
over the batches), micro-batches per batch and packing time per batch, printed
as a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from retool.training.packing import first_fit_decreasing, pack_micro_batches, padded_area

MAX_ITEMS = 32
MAX_PADDED_TOKENS = 64_000
CONTEXT_LIMIT = 8192
TURN_WEIGHTS = (0.35, 0.30, 0.20, 0.15)

Packer = Callable[..., list[list["Trajectory"]]]
PACKERS: dict[str, Packer] = {
    "first-fit decreasing (reference)": first_fit_decreasing,
    "exact DP (ours, default)": pack_micro_batches,
    "exact DP, area only (overhead 0)": partial(pack_micro_batches, batch_overhead_tokens=0),
}


@dataclass(frozen=True)
class Trajectory:
    id: int
    num_tokens: int


@dataclass(frozen=True)
class Row:
    workload: str
    packer: str
    ratio_mean: float
    ratio_worst: float
    batches_mean: float
    ms_mean: float
    ms_max: float
    areas: tuple[int, ...]


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def trajectory_length(rng: random.Random, max_turn_tokens: int) -> int:
    turns = rng.choices(range(1, 5), weights=TURN_WEIGHTS)[0]
    total = rng.randint(300, 600)
    total += sum(log_uniform(rng, 50, max_turn_tokens) for _ in range(turns))
    total += sum(log_uniform(rng, 20, 512) for _ in range(turns - 1))
    return min(total, CONTEXT_LIMIT)


def workloads(n_batches: int, size: int, seed: int) -> dict[str, list[list[Trajectory]]]:
    rng = random.Random(seed)

    def batches(max_turn_tokens: int) -> list[list[Trajectory]]:
        return [
            [Trajectory(i, trajectory_length(rng, max_turn_tokens)) for i in range(size)]
            for _ in range(n_batches)
        ]

    chapter = [Trajectory(i, n) for i, n in enumerate([8000, 7800] + [3000] * 10)]
    return {"chapter": [chapter], "rollout": batches(1024), "long-tail": batches(4096)}


def measure(workload: str, name: str, packer: Packer, batches: Sequence[list[Trajectory]]) -> Row:
    ratios, counts, times, areas = [], [], [], []
    for batch in batches:
        started = time.perf_counter()
        packed = packer(batch, max_items=MAX_ITEMS, max_padded_tokens=MAX_PADDED_TOKENS)
        times.append((time.perf_counter() - started) * 1000)
        areas.append(padded_area(packed))
        ratios.append(areas[-1] / sum(t.num_tokens for t in batch))
        counts.append(len(packed))
    return Row(
        workload,
        name,
        statistics.fmean(ratios),
        max(ratios),
        statistics.fmean(counts),
        statistics.fmean(times),
        max(times),
        tuple(areas),
    )


def main(n_batches: int, size: int, seed: int) -> None:
    rows = []
    for workload, batches in workloads(n_batches, size, seed).items():
        for name, packer in PACKERS.items():
            packer(batches[0])  # warm up
            rows.append(measure(workload, name, packer, batches))
    print(
        f"limits: max_items={MAX_ITEMS}, max_padded_tokens={MAX_PADDED_TOKENS:,}; "
        f"{n_batches} random batches of {size} trajectories per workload, seed {seed}\n"
    )
    print(
        "| workload | packer | padded / tokens (mean) | padded / tokens (worst) "
        "| micro-batches (mean) | ms per batch (mean) | ms per batch (max) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.workload} | {r.packer} | {r.ratio_mean:.3f} | {r.ratio_worst:.3f} "
            f"| {r.batches_mean:.2f} | {r.ms_mean:.3f} | {r.ms_max:.3f} |"
        )
    print()
    for workload in ("chapter", "rollout", "long-tail"):
        ffd, ours, _ = (r for r in rows if r.workload == workload)
        saved = 1 - sum(ours.areas) / sum(ffd.areas)
        better = sum(o < f for o, f in zip(ours.areas, ffd.areas, strict=True))
        worse = sum(o > f for o, f in zip(ours.areas, ffd.areas, strict=True))
        print(
            f"- {workload}: ours pads {saved:.1%} less area than FFD in total "
            f"(less on {better} of {len(ffd.areas)} batches, more on {worse}), with "
            f"{ours.batches_mean:.2f} micro-batches per batch against {ffd.batches_mean:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.batches, args.size, args.seed)
