"""``retool train`` and ``retool sft`` under ``torchrun --nproc-per-node 2``, on this CPU,
and a serving rank killed mid-run.

Rank 0 runs the command; rank 1 only serves the trainer's calls. What a user
would check: the command ends with 0, prints each step once, writes the same
run directory a one-process run writes (the same files, the same weights up to
float rounding), and its checkpoints load in one process (``--resume``,
``--init-from``) as well as under torchrun again.

The attack: ``kill -9`` of the serving rank after a step was committed, in the
middle of the run (a collective in flight, or the driver rolling out). It must
end the job non-zero well within the collective timeout, with exactly one line
of ours naming the dead rank (torchrun's SIGTERM to rank 0 comes as well: it
must not add a "stopped by SIGTERM" line) and no traceback of ours; the
committed steps stay, and ``torchrun ... --resume`` ends with the weights of the
uninterrupted two-rank run, which the RL test shares (one torchrun job instead
of two: each costs two ranks' imports, about 7 s each on a 2-core host).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.builders import TINY_RUN, run_toml
from tests.distributed.common import (
    ARGS,
    RL,
    ROOT,
    committed,
    environment,
    final_weights,
    launcher,
    ours,
    python,
    rank_pid,
    torchrun,
    wait_for_a_commit,
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


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[Path, Path, str]:
    """The uninterrupted two-rank RL run: (config, run directory, the job's stdout)."""
    tmp = tmp_path_factory.mktemp("whole")
    config = tmp / "run.toml"
    config.write_text(RL)
    run = tmp / "two"
    ran = torchrun("-m", "retool", "train", "--config", str(config), "--run-dir", str(run), *ARGS)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return config, run, ran.stdout


@pytest.mark.slow(seconds=55)  # three runs of the tiny model, one of them under torchrun
def test_rl_run_under_torchrun_is_the_one_process_run(tmp_path, whole):
    config, ran, stdout = whole
    two, one = tmp_path / "two", tmp_path / "one"
    shutil.copytree(ran, two)  # the kill test reads the original
    args = ("train", "--config", str(config), *ARGS)
    assert stdout.count("step 1/2") == 1 and stdout.count("step 2/2") == 1  # rank 0 only
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


@pytest.mark.slow(seconds=75)  # three runs of the tiny model under torchrun
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


@pytest.mark.slow(seconds=70)  # two torchrun jobs, and the shared uninterrupted one
def test_kill_9_of_a_serving_rank_stops_the_job_and_resume_is_exact(tmp_path, whole):
    config, uninterrupted, _ = whole
    run = tmp_path / "killed"
    job = subprocess.Popen(
        launcher(config, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(), cwd=ROOT,
    )  # fmt: skip
    try:
        wait_for_a_commit(job, run)
        victim = rank_pid(job.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=60)  # stopped within a minute, no hang
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 128 + signal.SIGKILL  # the launcher: the first failure's status
    lines = ours(err)  # one line: not also rank 0's "stopped by SIGTERM" (torchrun's stop)
    assert len(lines) == 1 and f"rank 1 (pid {victim}) stopped" in lines[0], err[-3000:]
    assert lines[0].startswith("retool: error:") and "--resume" in lines[0]
    assert "Traceback" not in err  # neither ours nor the launcher's
    steps = committed(run)
    assert steps and steps == list(range(1, len(steps) + 1))
    assert steps[-1] < 2, "the job finished before the kill: nothing was tested"

    # Resumed with plain torchrun: the launcher changes how the job ends, nothing else.
    more = torchrun("-m", "retool", "train", "--config", str(config), "--run-dir", str(run),
                    *ARGS, "--resume")  # fmt: skip
    assert more.returncode == 0, more.stderr[-3000:]
    a, b = final_weights(uninterrupted), final_weights(run)
    assert sorted(a) == sorted(b)
    gap = max(float((b[n] - a[n]).abs().max()) for n in a)
    print(f"kill/resume gap (max abs, float32): {gap:.3g}")
    assert gap <= 1e-6
