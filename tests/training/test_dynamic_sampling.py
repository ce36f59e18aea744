"""Dynamic sampling in the RL loop on ``tiny-random``: metrics, the progress line,
determinism, and a kill -9 in the middle of the refill followed by ``--resume``.

The reward ``tests.training.rewards:alike_for_half`` scores every answer -1
for about half the questions (their groups score alike: filtered) and by the
parity of the text's length for the others (groups that train), so a step
draws extra questions. The run is one step of 2 questions x 4 with up to 4
extras: at this seed it draws 2 (16 trajectories), which the fixture checks,
so a kill after the 10th journaled trajectory is one inside the refill.

Determinism at the engine level (the same slots and trajectories under four
timings) is pinned in ``tests/rollout/test_dynamic_sampling.py``; here the
killed and resumed run, two processes, must match the uninterrupted one.
The two tests that train are ``slow`` (one RL step each, the kill test three
in two processes).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from retool.training.display import step_summary
from retool.training.run_dir import RunDirectory
from tests.builders import run_toml
from tests.training.test_loop import ROOT, final_weights, retool, train_here

CONFIG = run_toml(
    rollout={"group_size": 4, "dynamic_sampling": True, "max_oversample": 4},
    reward={"function": "tests.training.rewards:alike_for_half"},
    train={
        "steps": 1,
        "grad_clip_norm": 1.0,
        "micro_batch_tokens": 1500,
        "micro_batch_items": 3,
        "save_every": 1,
    },
)
KILL_AT = "journal:1:10"  # 8 trajectories are the batch's: the 9th and 10th are extras'


@pytest.fixture(autouse=True)
def importable_rewards(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def samples(run_dir: Path) -> list[tuple]:
    """What a step sampled and trained on, without its timings."""
    with gzip.open(run_dir / "rollouts" / "step_000001.jsonl.gz", "rt") as handle:
        records = [json.loads(line) for line in handle]
    return [
        (
            r["question_index"],
            r["group_index"],
            r["example_id"],
            r["reward"],
            r["advantage"],
            json.dumps(r["tokens"]),
        )
        for r in records
    ]


STEP_KEYS = (  # what the step was: its groups, what trained, the spend they make
    "rollout/filtered_groups",
    "rollout/extra_questions",
    "rollout/trajectories",
    "rollout/degenerate_group_rate",
    "reward/mean",
    "train/datums",
    "train/tokens",
    "cost/prefill_tokens",
)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dynamic")
    config = tmp / "run.toml"
    config.write_text(CONFIG)
    run = train_here(config, tmp / "run")
    (metrics,) = run.metrics()
    # The premise of the kill below: this seed's step draws 2 extra questions.
    assert metrics["rollout/extra_questions"] == 2 and metrics["rollout/trajectories"] == 16
    return config, run.path


@pytest.mark.slow
def test_filtered_groups_and_extra_questions_are_counted_and_printed(uninterrupted):
    _, run_dir = uninterrupted
    (metrics,) = RunDirectory(run_dir).metrics()
    assert metrics["rollout/filtered_groups"] == 2
    assert metrics["rollout/degenerate_group_rate"] == 0.5  # 2 of the 4 groups sampled
    rows = samples(run_dir)
    assert sorted({r[0] for r in rows}) == [0, 1, 2, 3]  # 2 batch slots, then 2 reserve slots
    trained = {r[0] for r in rows if r[4] != 0}
    assert len(trained) == 2  # questions_per_batch informative groups train
    assert metrics["train/update_skipped"] == 0 and metrics["train/datums"] > 0
    # the step's line, as printed (Display.end_step) and logged
    assert "filtered 2 groups (+2 questions)" in (run_dir / "log.txt").read_text()


@pytest.mark.slow
def test_a_kill_mid_refill_then_resume_gives_the_same_step(tmp_path, uninterrupted):
    config, run_dir = uninterrupted
    resumed_dir = tmp_path / "run"
    args = ("train", "--config", str(config), "--run-dir", str(resumed_dir), "--no-progress")
    killed = retool(*args, kill_at=KILL_AT)
    assert killed.returncode == -9, killed.stderr
    journal = resumed_dir / "journal" / "step_000001.jsonl"
    slots = [json.loads(line)["question_index"] for line in journal.read_text().splitlines()]
    assert len(slots) == 10 and max(slots) >= 2  # extras had ended: the refill was under way
    run = train_here(config, resumed_dir, resume=True)
    assert run.completed_steps() == [1]
    (metrics,) = run.metrics()
    assert metrics["train/reused_groups"] >= 1
    assert samples(resumed_dir) == samples(run_dir)  # no group doubled, lost or replaced
    (expected_metrics,) = RunDirectory(run_dir).metrics()
    # (what was sampled again differs: rollout/sampled_tokens, sample_requests)
    for key in STEP_KEYS:
        assert metrics[key] == expected_metrics[key], key
    expected, weights = final_weights(run_dir, 1), final_weights(resumed_dir, 1)
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=1e-6)


def test_the_progress_line_shows_the_filter_only_when_it_is_on():
    metrics = {
        "time/step_s": 1.0,
        "reward/mean": 0.0,
        "reward/correct": 0.0,
        "rollout/code_calls": 0.0,
        "rollout/tokens_per_s": 1.0,
    }
    assert "filtered" not in step_summary(1, 2, metrics)
    line = step_summary(
        1, 2, {**metrics, "rollout/filtered_groups": 3.0, "rollout/extra_questions": 2.0}
    )
    assert line.endswith("filtered 3 groups (+2 questions)")
