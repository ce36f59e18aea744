"""``rollout.drop_void`` in the RL loop on ``tiny-random``: what is dropped trains nothing.

The trajectory budget is set a few tokens above the step's longest first
prompt, so every turn is cut by it (``budget_exhausted``: void) unless the
random model ends it first. The rewards are ``even_length``'s (mixed groups),
so without the filter those trajectories train; with it, none does, the
metrics count them, and the records keep their rewards. The finer rules (which
ends are void, the group means) are pinned in ``tests/rollout/test_void.py``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from retool.training.run_dir import RunDirectory
from tests.builders import run_toml
from tests.training.test_loop import ROOT, train_here

VOID_ENDS = {"budget_exhausted", "observation_too_long", "invalid"}


@pytest.fixture(autouse=True)
def importable_rewards(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def records(run_dir: Path) -> list[dict]:
    with gzip.open(run_dir / "rollouts" / "step_000001.jsonl.gz", "rt") as handle:
        return [json.loads(line) for line in handle]


def one_step(tmp: Path, name: str, budget: int, *sets: str) -> tuple[dict, list[dict], str]:
    config = tmp / f"{name}.toml"
    config.write_text(
        run_toml(
            rollout={
                "group_size": 4,
                "max_assistant_tokens": 64,
                "max_tool_response_tokens": 32,
                "min_observation_tokens": 16,
                "max_trajectory_tokens": budget,
            },
            train={"steps": 1, "max_train_tokens": 1024},
        )
    )
    run = train_here(config, tmp / name, sets)
    (metrics,) = run.metrics()
    return metrics, records(run.path), (run.path / "log.txt").read_text()


@pytest.mark.slow
def test_dropped_trajectories_keep_their_rewards_but_train_nothing(tmp_path):
    # The step's first prompts, measured with room to spare; then a budget just above them.
    _, roomy, _ = one_step(tmp_path, "roomy", 1024)
    budget = max(r["tokens"]["prompt"] for r in roomy) + 4
    kept, kept_rows, _ = one_step(tmp_path, "kept", budget)
    dropped, rows, log = one_step(tmp_path, "dropped", budget, "rollout.drop_void=true")

    void = [r["stop_reason"] in VOID_ENDS for r in rows]
    assert sum(void) >= 4, [r["stop_reason"] for r in rows]  # the premise: the budget cuts
    assert [r["stop_reason"] for r in kept_rows] == [r["stop_reason"] for r in rows]
    assert [r["reward"] for r in kept_rows] == [r["reward"] for r in rows]  # same samples
    assert dropped["rollout/void_rate"] == kept["rollout/void_rate"] == sum(void) / len(rows)
    assert dropped["rollout/dropped_void"] == sum(void)
    assert "rollout/dropped_void" not in kept
    assert f"dropped {sum(void)} void" in log
    # Void records keep their rewards but have advantage 0; nothing else changed.
    for row, kept_row, is_void in zip(rows, kept_rows, void, strict=True):
        assert row["advantage"] == (0.0 if is_void else kept_row["advantage"])
    assert any(r["advantage"] != 0 for r, v in zip(kept_rows, void, strict=True) if v)
    # One datum per trajectory with a non-zero advantage: the void ones are gone.
    assert dropped["train/datums"] == sum(r["advantage"] != 0 for r in rows)
    assert kept["train/datums"] == sum(r["advantage"] != 0 for r in kept_rows)
    assert dropped["train/datums"] < kept["train/datums"]
    assert RunDirectory(tmp_path / "dropped").metrics()  # the step was committed
