"""A rank that dies under torchrun: the job stops, nothing committed is lost, --resume continues.

The attack: ``kill -9`` of the serving rank after a step was committed, in the
middle of the run (a collective in flight, or the driver rolling out). The
job must end non-zero well within the collective timeout, with our one line
naming the dead rank and no traceback of ours; the committed steps stay, and
``torchrun ... --resume`` ends with the weights of a run never interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.distributed.common import ROOT, environment, torchrun
from tests.distributed.test_commands import RL

ARGS = ("--no-progress", "--set", "train.save_every=1", "--set", "train.steps=3")


def launcher(config: Path, run: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "-m", "retool", "train", "--config", str(config), "--run-dir", str(run), *ARGS, *extra,
    ]  # fmt: skip


def rank_pid(parent: int, rank: int) -> int | None:
    """The pid of torchrun's child with ``RANK=rank`` (read from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == parent and f"RANK={rank}".encode() in (
                entry / "environ"
            ).read_bytes().split(b"\0"):
                return int(entry.name)
        except (OSError, IndexError, ValueError):
            continue
    return None


def committed(run: Path) -> list[int]:
    """The steps the run's journal holds (a step is committed once its line is there)."""
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["step"] for line in lines if line.endswith("}")]


def final_weights(run: Path) -> dict:
    path = run / "checkpoints" / "state" / "step_000003" / "trainable.safetensors"
    return load_file(str(path))


@pytest.mark.slow  # three torchrun jobs of the tiny model
def test_kill_9_of_a_serving_rank_stops_the_job_and_resume_is_exact(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(RL)
    whole = tmp_path / "whole"
    ran = torchrun("-m", "retool", "train", "--config", str(config), "--run-dir", str(whole), *ARGS)
    assert ran.returncode == 0, ran.stderr[-3000:]

    run = tmp_path / "killed"
    job = subprocess.Popen(
        launcher(config, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(), cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not committed(run):
            assert job.poll() is None and time.monotonic() < deadline, "no step committed"
            time.sleep(0.1)
        victim = rank_pid(job.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=60)  # stopped within a minute, no hang
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode != 0
    ours = [line for line in err.splitlines() if line.startswith("retool: error")]
    assert len(ours) == 1 and f"rank 1 (pid {victim})" in ours[0], err[-3000:]
    assert "src/retool/" not in err  # no traceback of ours (torchrun adds its own report)
    steps = committed(run)
    assert steps and steps == list(range(1, len(steps) + 1))
    assert steps[-1] < 3, "the job finished before the kill: nothing was tested"

    more = subprocess.run(
        launcher(config, run, "--resume"), capture_output=True, text=True, env=environment(),
        cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert more.returncode == 0, more.stderr[-3000:]
    a, b = final_weights(whole), final_weights(run)
    assert sorted(a) == sorted(b)
    gap = max(float((b[n] - a[n]).abs().max()) for n in a)
    print(f"kill/resume gap (max abs, float32): {gap:.3g}")
    assert gap <= 1e-6


@pytest.mark.slow  # one torchrun job of the tiny model
def test_ctrl_c_on_the_launcher_stops_every_rank_with_one_line_of_ours(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(RL)
    run = tmp_path / "run"
    job = subprocess.Popen(
        launcher(config, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(), cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not committed(run):
            assert job.poll() is None and time.monotonic() < deadline, "no step committed"
            time.sleep(0.1)
        os.killpg(job.pid, signal.SIGINT)  # a terminal's Ctrl-C: the launcher and its ranks
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode != 0  # torchrun's own status for a signal (rank 0 exits 130)
    ours = [line for line in err.splitlines() if line.startswith("retool:")]
    assert len(ours) == 1 and "SIGINT" in ours[0] and "--resume" in ours[0], err[-3000:]
    assert "src/retool/" not in err
    steps = committed(run)
    assert steps and steps == list(range(1, len(steps) + 1))  # committed steps kept whole


@pytest.mark.slow  # one torchrun job of the tiny model, and one that must refuse
def test_a_second_torchrun_job_on_a_locked_run_is_refused(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(RL)
    run = tmp_path / "run"
    args = ("--config", str(config), "--run-dir", str(run), "--no-progress")
    ran = torchrun("-m", "retool", "train", *args, "--set", "train.steps=1")
    assert ran.returncode == 0, ran.stderr[-3000:]
    holder = subprocess.Popen(  # another job's rank 0 holding the run (flock, as run_lock)
        [
            sys.executable, "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(300)\n",
            str(run / "lock"),
        ],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        second = torchrun(
            "-m", "retool", "train", *args, "--resume", "--set", "train.steps=2", timeout=120
        )
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode != 0
    ours = [line for line in second.stderr.splitlines() if line.startswith("retool:")]
    assert len(ours) == 1 and "lock" in ours[0].lower(), second.stderr[-3000:]
    assert committed(run) == [1]  # the refused job wrote nothing
