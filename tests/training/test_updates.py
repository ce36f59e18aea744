"""``train.updates_per_step``: the step's groups split into PPO mini-batches, one
``optim_step`` each (``retool.training.updates``), in units and in the RL loop on
``tiny-random``, with a kill between two updates of a step followed by ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from retool.config import load_config
from retool.errors import ConfigError
from retool.training.datum import TrainingDatum
from retool.training.loop import train
from retool.training.run_dir import RunDirectory
from retool.training.updates import merge_update_metrics, split_updates
from tests.builders import policy_datum, run_toml
from tests.training.test_loop import ROOT, final_weights, retool, train_here


@pytest.fixture(autouse=True)
def importable_rewards(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def item(slot: int, advantage: float = 1.0) -> TrainingDatum:
    datum = policy_datum([1, 2, 3, 4], advantage)
    return TrainingDatum(datum, num_tokens=3, loss_tokens=3, trajectory_index=slot)


def advantages(update: list[TrainingDatum]) -> list[float]:
    return [float(d.datum.loss_fn_inputs["advantages"].to_numpy()[0]) for d in update]


def test_one_update_is_the_step_unchanged():
    datums = [item(0), item(1), item(5)]
    (update,) = split_updates(datums, 1, group_size=4)
    assert update == datums  # the same objects: no rescaling
    assert split_updates([], 3, group_size=4) == [[]]  # nothing to train: one skipped update


def test_updates_hold_whole_groups_in_order_and_weigh_like_the_step():
    # group size 2; groups 0, 1, 3 and 4 train (slot 3 alone in group 1; group 2 is alike)
    datums = [item(0), item(1), item(3), item(6), item(7), item(8)]
    updates = split_updates(datums, 2, group_size=2)
    slots = [[d.trajectory_index for d in u] for u in updates]
    assert slots == [[0, 1, 3], [6, 7, 8]]  # groups {0,1},{3} | {6,7},{8}: never split
    # each update's datums scaled by D / D_k = 6 / 3
    assert advantages(updates[0]) == advantages(updates[1]) == [2.0] * 3
    uneven = split_updates(datums, 3, group_size=2)
    assert [[d.trajectory_index for d in u] for u in uneven] == [[0, 1, 3], [6, 7], [8]]
    assert advantages(uneven[1]) == [3.0] * 2  # 6 datums / 2
    assert advantages(uneven[2]) == [6.0]
    # more updates than groups: one per group
    assert len(split_updates(datums, 6, group_size=2)) == 4
    # inputs untouched
    assert advantages(datums) == [1.0] * 6


def test_the_scaled_updates_add_up_to_the_step_objective_times_k():
    rng = np.random.default_rng(0)
    datums = [item(s, float(a)) for s, a in zip(range(8), rng.normal(size=8), strict=True)]
    updates = split_updates(datums, 4, group_size=2)
    total = sum(sum(advantages(u)) for u in updates)
    assert total == pytest.approx(4 * sum(advantages(datums)), rel=1e-6)


def test_split_refuses_nonsense():
    with pytest.raises(ValueError, match=">= 1"):
        split_updates([item(0)], 0, group_size=4)


def test_metrics_add_counts_and_keep_the_mismatch_of_the_first_update():
    first = {
        "train/datums": 3.0,
        "train/micro_batches": 1.0,
        "train/tokens": 30.0,
        "train/padded_tokens": 36.0,
        "train/update_skipped": 0.0,
        "train/loss_tokens": 10.0,
        "train/clip_fraction": 0.0,
        "train/sampler_kl": 0.001,
        "train/loss:sum": -1.0,
    }
    second = dict(first, **{"train/clip_fraction": 0.3, "train/sampler_kl": 0.5})
    merged = merge_update_metrics(
        [first, second],
        [
            {"optim/grad_norm": 1.0, "optim/step": 1.0},
            {"optim/grad_norm": 3.0, "optim/step": 2.0},
        ],
    )
    assert merged["train/datums"] == 6 and merged["train/tokens"] == 60
    assert merged["train/micro_batches"] == 2 and merged["train/padded_tokens"] == 72
    assert merged["train/sampler_kl"] == 0.001  # before any update, not the moved policy's
    assert merged["train/clip_fraction"] == pytest.approx(0.15)  # over every call
    assert merged["train/loss:sum"] == -2.0 and merged["train/loss_tokens"] == 20
    assert merged["optim/grad_norm"] == 2.0 and merged["optim/step"] == 2.0
    assert merged["train/updates"] == 2 and merged["train/update_skipped"] == 0
    skipped = merge_update_metrics([dict(first, **{"train/update_skipped": 1.0})], [{}])
    assert skipped["train/updates"] == 0 and "optim/step" not in skipped


def test_config_bounds_updates_per_step(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(run_toml(train={"questions_per_batch": 2, "updates_per_step": 3}))
    with pytest.raises(
        ConfigError, match=r"updates_per_step \(3\) must be <= .*questions_per_batch \(2\)"
    ):
        load_config(path)
    with pytest.raises(ConfigError, match="updates_per_step"):
        load_config(path, ["train.updates_per_step=0"])


def write_config(tmp_path: Path, updates: int) -> Path:
    path = tmp_path / "run.toml"
    train_keys = {"questions_per_batch": 2, "updates_per_step": updates, "grad_clip_norm": 1.0}
    train_keys |= {"micro_batch_tokens": 1500, "micro_batch_items": 3, "save_every": 1}
    path.write_text(run_toml(rollout={"group_size": 4}, train=train_keys))
    return path


def test_each_step_takes_one_optimizer_step_per_update(tmp_path):
    one = train(
        load_config(write_config(tmp_path, 1)), run_dir=str(tmp_path / "one"), progress=False
    )
    two = train(
        load_config(write_config(tmp_path, 2)), run_dir=str(tmp_path / "two"), progress=False
    )
    m1, m2 = one.metrics(), two.metrics()
    assert [m["optim/step"] for m in m1] == [1.0, 2.0]
    assert [m["train/updates"] for m in m1] == [1.0, 1.0]
    assert [m["optim/step"] for m in m2] == [2.0, 4.0]  # the trainer's own counter
    assert [m["train/updates"] for m in m2] == [2.0, 2.0]
    # step 1 samples from the same initial weights: the same datums, split in two
    assert m2[0]["train/datums"] == m1[0]["train/datums"]
    assert m2[0]["train/tokens"] == m1[0]["train/tokens"]
    assert m2[0]["reward/mean"] == m1[0]["reward/mean"]
    # ...but two updates move the weights elsewhere than one
    w1, w2 = final_weights(one.path, 1), final_weights(two.path, 1)
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)
    records = [json.loads(line) for line in two.manifest_path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]  # a step is still one step of the run


@pytest.mark.slow  # runs three processes
def test_kill_between_two_updates_and_resume_matches_an_uninterrupted_run(tmp_path):
    config = write_config(tmp_path, 2)
    common = ("train", "--config", str(config), "--no-progress")
    train_here(config, tmp_path / "whole")  # the kill needs a process; the rest need none
    expected = final_weights(tmp_path / "whole", 2)
    run_dir = tmp_path / "run"
    args = (*common, "--run-dir", str(run_dir))
    killed = retool(*args, kill_at="optim:2:1")  # step 2: first update applied, second not
    assert killed.returncode == -9, killed.stderr
    run = RunDirectory(run_dir)
    assert run.completed_steps() == [1]
    train_here(config, run_dir, resume=True)
    assert run.completed_steps() == [1, 2]  # each step exactly once
    (step2,) = [m for m in run.metrics() if m["step"] == 2]
    assert step2["train/updates"] == 2 and step2["optim/step"] == 4.0
    assert step2["train/reused_groups"] == 2  # the whole rollout came from the journal
    weights = final_weights(run_dir, 2)
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=1e-6)
