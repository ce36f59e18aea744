"""The unchanged RL loop (``retool train``) on PyTRIO and Tinker through their fake services.

Two steps with a checkpoint each, then ``--resume`` for a third: the rollout
samples through ``sample_async``, the loop trains, checkpoints land as pointer
directories in the run directory, and the resumed run continues from the last
one through ``create_training_client_from_state_with_optimizer`` (a new
service-side run restoring weights and optimizer state).
"""

from __future__ import annotations

import json

import pytest

from retool.config import (
    DataConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)


def config(backend: str, base_model: str, run_dir, steps: int) -> RunConfig:
    return RunConfig(
        model=ModelConfig(backend=backend, base_model=base_model, lora_rank=8),
        data=DataConfig(train="demo:train"),
        rollout=RolloutConfig(
            group_size=2,
            max_assistant_turns=1,
            max_code_calls=1,
            max_trajectory_tokens=400,
            max_assistant_tokens=8,
            max_tool_response_tokens=32,
            min_observation_tokens=8,
        ),
        reward=RewardConfig(function="tests.backends.remote.fakes:alternating_reward"),
        train=TrainConfig(
            steps=steps,
            questions_per_batch=2,
            save_every=1,
            max_train_tokens=400,
            run_dir=str(run_dir),
        ),
    )


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("backend", ["pytrio", "tinker"])
def test_train_checkpoint_and_resume(backend, request, tmp_path):
    from retool.training.loop import train

    fake = request.getfixturevalue(f"fake_{backend}")
    base = "Qwen/Qwen3-4B" if backend == "pytrio" else fake.base_model
    run_dir = tmp_path / "run"
    train(config(backend, base, run_dir, 2), progress=False)
    saved = lines(run_dir / "checkpoints.jsonl")
    assert [c["step"] for c in saved] == [1, 2]
    pointer = json.loads((run_dir / saved[-1]["state_path"] / "retool_state.json").read_text())
    assert pointer["backend"] == backend and pointer["steps"] == 2
    assert pointer["remote_path"] in fake.checkpoints

    train(config(backend, base, run_dir, 3), resume=True, progress=False)
    metrics = lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["optim/step"] for m in metrics] == [1, 2, 3]  # the step counter was restored
    assert all(m["train/loss_tokens"] > 0 and "train/loss:sum" in m for m in metrics)
    if backend == "pytrio":
        resumed = list(fake.runs.values())
        resumed = [r for r in resumed if r.cuid.startswith("tr")][-1]
        assert fake.init_payloads[-1]["load_optimizer"] is True
    else:
        resumed = list(fake.models.values())[-1]
        assert resumed.restored_optimizer is True
    assert resumed.source == pointer["remote_path"]
    assert resumed.optimizer_steps == 3  # the service's optimizer went on from step 2


@pytest.mark.parametrize("backend", ["pytrio"])  # tinker passes too (2026-12-06), in 32 s
def test_overlapped_steps_sample_with_the_pipelines_policy(backend, request, tmp_path):
    """``train.max_off_policy_steps = 1`` on a service: each step's sampling client is the
    one saved after step ``s - 2``, used from the rollout thread while the loop trains."""
    import dataclasses
    import gzip

    from retool.training.loop import train

    fake = request.getfixturevalue(f"fake_{backend}")
    base = "Qwen/Qwen3-4B" if backend == "pytrio" else fake.base_model
    run_dir = tmp_path / "run"
    lagged = config(backend, base, run_dir, 3)
    lagged = dataclasses.replace(
        lagged, train=dataclasses.replace(lagged.train, max_off_policy_steps=1)
    )
    train(lagged, progress=False)
    metrics = lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["rollout/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    for step, version in ((1, 0), (2, 0), (3, 1)):
        path = run_dir / "rollouts" / f"step_{step:06d}.jsonl.gz"
        records = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
        assert {r["policy_version"] for r in records} == {version}
    assert [c["step"] for c in lines(run_dir / "checkpoints.jsonl")] == [1, 2, 3]
