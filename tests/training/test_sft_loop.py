"""``retool sft`` on ``tiny-random``: demonstrations, steps, kill -9 and ``--resume``."""

from __future__ import annotations

import pytest
import torch

from retool.config import load_config
from retool.training.sft import run_sft
from tests.builders import TINY_RUN, run_toml
from tests.training.test_loop import final_weights, retool

CONFIG = run_toml(
    TINY_RUN,
    train={
        "steps": 2,
        "questions_per_batch": 4,
        "learning_rate": 0.002,
        "micro_batch_tokens": 1500,
        "micro_batch_items": 2,
        "save_every": 1,
    },
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft")
    demos = tmp / "demos.jsonl"
    made = retool(
        "sft", "make-demos", "--dataset", "demo:train", "--limit", "8", "--output", str(demos)
    )
    assert made.returncode == 0, made.stderr
    config = tmp / "sft.toml"
    config.write_text(CONFIG)
    run = tmp / "uninterrupted"
    # In this process (the killed and resumed runs below are processes): ~7 s less.
    run_sft(load_config(config), demos, run_dir=str(run), progress=False)
    return config, demos, final_weights(run, 2)


def test_sft_steps_lower_the_loss_on_assistant_tokens(setup, tmp_path):
    config_path, demos, _ = setup
    config = load_config(config_path, ["train.steps=3", "train.learning_rate=0.01"])
    run = run_sft(config, demos, run_dir=str(tmp_path / "run"), progress=False)
    metrics = run.metrics()
    assert [m["optim/step"] for m in metrics] == [1.0, 2.0, 3.0]
    assert all(m["train/loss_tokens"] > 0 and m["train/micro_batches"] == 2 for m in metrics)
    # Same batch order reshuffles per epoch; the NLL of the 8 demos falls as they are learned.
    assert metrics[-1]["train/loss:sum"] < metrics[0]["train/loss:sum"]


@pytest.mark.slow  # runs many processes: started first under workers
@pytest.mark.parametrize("kill_at", ["optim:2"])  # state:2 is covered by the RL test
def test_sft_kill_and_resume_matches_an_uninterrupted_run(setup, tmp_path, kill_at):
    config, demos, expected = setup
    args = (
        "sft",
        "--config",
        str(config),
        "--data",
        str(demos),
        "--run-dir",
        str(tmp_path / "run"),
        "--no-progress",
    )
    killed = retool(*args, kill_at=kill_at)
    assert killed.returncode == -9, killed.stderr
    # resumed in this process (`retool sft --resume`: tests/distributed/test_commands.py)
    run = run_sft(load_config(config), demos, run_dir=str(tmp_path / "run"), resume=True,
                  progress=False)  # fmt: skip
    assert run.completed_steps() == [1, 2]
    weights = final_weights(tmp_path / "run", 2)
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=1e-6)
