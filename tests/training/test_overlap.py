"""Overlapped steps (``train.max_off_policy_steps``) on ``tiny-random``: which policy samples
each step, the staleness metrics, kill -9 / ``--resume`` exactness and a stale journal refused.

The runs use the custom reward ``tests.training.rewards:even_length`` so every step
trains (see tests/training/test_loop.py).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from retool.backends import service_client
from retool.config import load_config
from retool.data import load_dataset, take_batch
from retool.errors import ConfigError, StalePolicyError
from retool.reward import load_reward_function
from retool.rollout import rollout_batch
from retool.sandbox import open_sandbox
from retool.training.loop import train
from retool.training.overlap import sampling_version
from retool.training.run_dir import RunDirectory
from tests.builders import run_toml
from tests.training.test_loop import retool, train_here

ROOT = Path(__file__).resolve().parents[2]
CONFIG = run_toml(
    rollout={"group_size": 4},
    train={
        "steps": 3,
        "grad_clip_norm": 1.0,
        "micro_batch_tokens": 1500,
        "micro_batch_items": 3,
        "save_every": 1,
        "max_off_policy_steps": 1,
        "learning_rate": 0.01,  # big enough that one step visibly moves the logprobs
    },
)


@pytest.fixture(autouse=True)
def importable_rewards(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    return path


def rollouts(run_dir: Path, step: int) -> list[dict]:
    path = run_dir / "rollouts" / f"step_{step:06d}.jsonl.gz"
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]


def trainable(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    path = run_dir / "checkpoints" / "state" / f"step_{step:06d}" / "trainable.safetensors"
    return load_file(str(path))


def test_the_pipeline_order():
    assert [sampling_version(s, 0) for s in (1, 2, 3, 4)] == [0, 1, 2, 3]
    assert [sampling_version(s, 1) for s in (1, 2, 3, 4)] == [0, 0, 1, 2]
    assert [sampling_version(s, 2) for s in (1, 2, 3, 4, 5)] == [0, 0, 0, 1, 2]


def test_each_step_samples_with_the_pipelines_policy_and_logs_its_staleness(tmp_path):
    config = load_config(write_config(tmp_path))
    run = train(config, run_dir=str(tmp_path / "run"), progress=False)
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # step s samples with the weights after max(0, s - 2) steps; it trains the policy after
    # s - 1 steps: staleness 0, 1, 1 optimizer steps
    assert [m["rollout/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    assert [m["rollout/staleness_mean"] for m in metrics] == [0.0, 1.0, 1.0]
    assert all("train/sampler_kl" in m and "time/rollout_overlapped_s" in m for m in metrics)
    for step, version in ((1, 0), (2, 0), (3, 1)):
        assert {r["policy_version"] for r in rollouts(run.path, step)} == {version}
    # every checkpoint listed, and no journal left once the last one covers them
    assert [r.step for r in run.checkpoints()] == [1, 2, 3]
    assert list((run.path / "journal").iterdir()) == []

    # Step 3's rollout is what the policy after step 1 samples with step 3's seeds, and
    # not what the policy after step 2 samples.
    recorded = [r["final_text"] for r in rollouts(run.path, 3)]
    batch = take_batch(
        load_dataset(config.data.train), config.train.questions_per_batch, 2, config.data.seed
    )
    scorer = load_reward_function(config.reward.function)
    service = service_client(config.model, checkpoint_root=tmp_path / "scratch")
    sandbox = open_sandbox(config.sandbox)
    same = {}
    try:
        for step in (1, 2):
            state = run.path / "checkpoints" / "state" / f"step_{step:06d}"
            trainer = service.create_training_client_from_state(str(state))
            sampler = trainer.save_weights_and_get_sampling_client()
            result = rollout_batch(
                sampler,
                trainer.get_tokenizer(),
                sandbox,
                batch,
                config.rollout,
                step=3,
                scorer=scorer,
                context_limit=config.train.max_train_tokens,
            )
            sampler.close()
            same[step] = [t.final_text for t in result.trajectories] == recorded
    finally:
        sandbox.close()
    assert same == {1: True, 2: False}


def test_k0_records_the_previous_steps_policy_and_keeps_no_journal(tmp_path):
    config = load_config(write_config(tmp_path), ["train.max_off_policy_steps=0", "train.steps=2"])
    run = train(config, run_dir=str(tmp_path / "run"), progress=False)
    metrics = run.metrics()
    assert [m["rollout/staleness_max"] for m in metrics] == [0.0, 0.0]
    assert all("time/rollout_overlapped_s" not in m for m in metrics)
    assert {r["policy_version"] for r in rollouts(run.path, 2)} == {1}
    assert list((run.path / "journal").iterdir()) == []


def test_a_merged_vllm_engine_is_refused_with_a_lag(tmp_path):
    with pytest.raises(ConfigError, match='sampler.sync = "lora"'):
        load_config(write_config(tmp_path), ['sampler.engine="vllm"', 'sampler.sync="merged"'])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("overlap")
    config = write_config(tmp)
    train_here(config, tmp / "run")  # the killed runs below are processes
    return config, trainable(tmp / "run", 3)


@pytest.mark.slow  # runs several processes: started first under workers
@pytest.mark.parametrize(
    "kill_at",
    [
        "journal:3:5",  # step 3's rollout (policy after step 1) half journaled, step 2 training
        "committed:2",  # step 2 committed; its checkpoint waits for step 3's rollout
    ],
)
def test_kill_and_resume_with_a_lag_matches_an_uninterrupted_run(tmp_path, uninterrupted, kill_at):
    config, expected = uninterrupted
    run_dir = tmp_path / "run"
    args = ("train", "--config", str(config), "--run-dir", str(run_dir), "--no-progress")
    killed = retool(*args, kill_at=kill_at)
    assert killed.returncode == -9, killed.stderr
    run = RunDirectory(run_dir)
    listed = [r.step for r in run.checkpoints()]
    assert listed and max(listed) <= 1  # step 2's waits for step 3's rollout to be journaled
    if kill_at.startswith("journal"):
        refuses_a_journal_of_another_policy(run_dir, args)
    train_here(config, run_dir, resume=True)
    assert run.completed_steps() == [1, 2, 3]  # each step exactly once
    assert [r.step for r in run.checkpoints()] == [1, 2, 3]
    weights = trainable(run_dir, 3)
    assert weights.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=1e-6)
    assert {r["policy_version"] for r in rollouts(run_dir, 3)} == {1}


def refuses_a_journal_of_another_policy(run_dir: Path, args: tuple[str, ...]) -> None:
    """A copy of the killed run whose step 2 journal (replayed on resume: the policy that
    sampled it is older than the checkpoint) claims another policy: refused in one line."""
    copy = run_dir.with_name("forged")
    shutil.copytree(run_dir, copy)
    journal = copy / "journal" / "step_000002.jsonl"
    forged = [json.loads(line) for line in journal.read_text().splitlines()]
    for record in forged:
        record["policy_version"] = 1
    journal.write_text("".join(json.dumps(r) + "\n" for r in forged))
    forged_args = tuple(str(copy) if a == str(run_dir) else a for a in args)
    resumed = retool(*forged_args, "--resume")
    assert resumed.returncode != 0
    assert "policy after step 1" in resumed.stderr and "Traceback" not in resumed.stderr
    assert RunDirectory(copy).completed_steps() == [1]  # nothing trained on it


def test_a_finished_lagged_run_is_not_extended(tmp_path):
    """Its next steps would sample with policies it no longer holds: one line, nothing run."""
    run_dir = str(tmp_path / "run")
    train(load_config(write_config(tmp_path), ["train.steps=2"]), run_dir=run_dir, progress=False)
    longer = load_config(write_config(tmp_path), ["train.steps=3"])
    with pytest.raises(StalePolicyError, match="--init-from") as info:
        train(longer, run_dir=run_dir, resume=True, progress=False)
    assert "\n" not in str(info.value)
    assert RunDirectory(tmp_path / "run").completed_steps() == [1, 2]


def test_dynamic_sampling_and_several_updates_compose_with_a_lag(tmp_path):
    """Each step's rollout (its reserve questions included) is the one without a lag; only
    the policy moves: staleness counts optimizer steps (2 updates a step)."""
    settings = [
        "train.steps=3",
        "train.questions_per_batch=2",
        "train.updates_per_step=2",
        "rollout.dynamic_sampling=true",
        "rollout.max_oversample=2",
        'reward.function="tests.training.rewards:alike_for_half"',
    ]
    run = train(
        load_config(write_config(tmp_path), settings), run_dir=str(tmp_path / "run"), progress=False
    )
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["rollout/staleness_max"] for m in metrics] == [0.0, 2.0, 2.0]
    assert all("rollout/filtered_groups" in m for m in metrics)
    trained = [m for m in metrics if not m["train/update_skipped"]]
    assert trained  # two optimizer steps per step that trained
    assert [m["optim/step"] for m in trained] == [2.0 * (i + 1) for i in range(len(trained))]
