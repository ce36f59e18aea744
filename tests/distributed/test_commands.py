"""``retool train`` and ``retool sft`` under ``torchrun --nproc-per-node 2``, on this CPU.

Rank 0 runs the command; rank 1 only serves the trainer's calls. What a user
would check: the command ends with 0, prints each step once, writes the same
run directory a one-process run writes (the same files, the same weights up to
float rounding), and its checkpoints load in one process (``--resume``,
``--init-from``) as well as under torchrun again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.builders import TINY_RUN, run_toml
from tests.distributed.common import python, torchrun

RL = run_toml(
    rollout={"group_size": 4},
    train={"grad_clip_norm": 1.0, "micro_batch_tokens": 1500, "micro_batch_items": 3},
)
SFT = run_toml(
    TINY_RUN,
    train={
        "steps": 2,
        "questions_per_batch": 4,
        "learning_rate": 0.002,
        "micro_batch_tokens": 1500,
        "micro_batch_items": 2,
    },
)


def weights(run: Path, step: int):
    return load_file(
        str(run / "checkpoints" / "state" / f"step_{step:06d}" / "trainable.safetensors")
    )


def files(run: Path) -> set[str]:
    return {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()}


def steps_of(run: Path) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.mark.slow  # four runs of the tiny model, two of them under torchrun
def test_rl_run_under_torchrun_is_the_one_process_run(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(RL)
    two, one = tmp_path / "two", tmp_path / "one"
    args = ("train", "--config", str(config), "--no-progress", "--set", "train.save_every=1")
    ran = torchrun("-m", "retool", *args, "--run-dir", str(two))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.count("step 1/2") == 1 and ran.stdout.count("step 2/2") == 1  # rank 0 only
    alone = python("-m", "retool", *args, "--run-dir", str(one))
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert files(two) == files(one)  # what rank 0 wrote: a one-process run's directory
    assert steps_of(two) == [1, 2]
    a, b = weights(one, 2), weights(two, 2)
    assert sorted(a) == sorted(b)
    for name in a:
        assert float((b[name] - a[name]).norm() / a[name].norm()) < 1e-5, name
    # The 2-rank run's checkpoint (weights and optimizer state) resumes in one process.
    more = python(
        "-m", "retool", *args, "--run-dir", str(two), "--resume", "--set", "train.steps=3"
    )
    assert more.returncode == 0, more.stderr[-3000:]
    assert steps_of(two) == [1, 2, 3]


@pytest.mark.slow  # three runs of the tiny model under torchrun
def test_sft_under_torchrun_resumes_under_torchrun_and_inits_an_rl_run(tmp_path):
    demos = tmp_path / "demos.jsonl"
    made = python(
        "-m", "retool", "sft", "make-demos", "--dataset", "demo:train", "--limit", "8",
        "--output", str(demos),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    config = tmp_path / "sft.toml"
    config.write_text(SFT)
    run = tmp_path / "sft"
    args = ("sft", "--config", str(config), "--data", str(demos), "--run-dir", str(run))
    ran = torchrun("-m", "retool", *args, "--no-progress")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert steps_of(run) == [1, 2]
    before = weights(run, 2)
    # Resumed under torchrun: the checkpoint is scattered to the ranks' shards again.
    more = torchrun("-m", "retool", *args, "--no-progress", "--resume", "--set", "train.steps=3")
    assert more.returncode == 0, more.stderr[-3000:]
    assert steps_of(run) == [1, 2, 3]
    after = weights(run, 3)
    assert any(float((after[n] - before[n]).abs().max()) > 0 for n in before)
    # The SFT checkpoint starts a one-process RL run (--init-from).
    rl = tmp_path / "rl.toml"
    rl.write_text(RL)
    init = python(
        "-m", "retool", "train", "--config", str(rl), "--run-dir", str(tmp_path / "rl"),
        "--init-from", str(run), "--no-progress", "--set", "train.steps=1",
    )  # fmt: skip
    assert init.returncode == 0, init.stderr[-3000:]
