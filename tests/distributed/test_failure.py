"""A rank that dies, or a Ctrl-C, under torchrun: the job stops with one line, nothing
committed is lost, --resume continues.

The attacks: ``kill -9`` of the serving rank after a step was committed, in the
middle of the run (a collective in flight, or the driver rolling out), and
Ctrl-C on the launcher (SIGINT to its process group). A killed rank must end
the job non-zero well within the collective timeout, with exactly one line of
ours naming the dead rank (torchrun's SIGTERM to rank 0 comes as well: it must
not add a "stopped by SIGTERM" line) and no traceback of ours; the committed
steps stay, and ``torchrun ... --resume`` ends with the weights of a run never
interrupted. Ctrl-C must stop as ``retool train`` does in one process: exit
130 (through ``python -m retool.launch``: plain torchrun exits 1), one line,
the last completed step saved (the serving rank takes part in that save).
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

ARGS = ("--no-progress", "--set", "train.save_every=1", "--set", "train.steps=2")


def launcher(config: Path, run: Path, *extra: str, args: tuple[str, ...] = ARGS) -> list[str]:
    """``python -m retool.launch`` (torchrun's own ``main``) running ``retool train``."""
    return [
        sys.executable, "-m", "retool.launch", "--nproc-per-node", "2", "--standalone",
        "-m", "retool", "train", "--config", str(config), "--run-dir", str(run), *args, *extra,
    ]  # fmt: skip


def ours(err: str) -> list[str]:
    """The lines of ours on stderr (``retool:``; torchrun's report says "retool FAILED")."""
    return [line for line in err.splitlines() if line.startswith("retool:")]


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


def saved(run: Path) -> list[str]:
    root = run / "checkpoints" / "state"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def final_weights(run: Path) -> dict:
    path = run / "checkpoints" / "state" / "step_000002" / "trainable.safetensors"
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
    a, b = final_weights(whole), final_weights(run)
    assert sorted(a) == sorted(b)
    gap = max(float((b[n] - a[n]).abs().max()) for n in a)
    print(f"kill/resume gap (max abs, float32): {gap:.3g}")
    assert gap <= 1e-6


@pytest.mark.slow  # three torchrun jobs of the tiny model, one of them refused at once
def test_ctrl_c_on_the_launcher_exits_130_saves_the_step_and_resumes(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(RL)
    run = tmp_path / "run"
    # No checkpoint is due (save_every 10): the one of the last completed step is the
    # interrupt's own, which rank 0 can only write with the serving rank's shards.
    args = ("--no-progress", "--set", "train.save_every=10", "--set", "train.steps=2")
    job = subprocess.Popen(
        launcher(config, run, args=args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=environment(), cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not committed(run):
            assert job.poll() is None and time.monotonic() < deadline, "no step committed"
            time.sleep(0.1)
        os.killpg(job.pid, signal.SIGINT)  # a terminal's Ctrl-C on the launcher
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode == 130, err[-3000:]
    lines = ours(err)
    assert lines == ["retool: stopped by SIGINT; continue with --resume"], err[-3000:]
    assert "Traceback" not in err
    steps = committed(run)
    # Step 1, or 2 when the signal came in its commit window (deferred to its end).
    assert steps in ([1], [1, 2]), steps
    assert saved(run) == [f"step_{steps[-1]:06d}"]  # the last completed step, saved

    # The run is still one job's: while another holds its lock, a second job is refused.
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
            "-m", "retool", "train", "--config", str(config), "--run-dir", str(run), *args,
            "--resume", timeout=120,
        )  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode != 0
    lines = ours(second.stderr)
    assert len(lines) == 1 and "lock" in lines[0].lower(), second.stderr[-3000:]
    assert committed(run) == steps  # the refused job wrote nothing

    more = subprocess.run(
        launcher(config, run, "--resume", args=args), capture_output=True, text=True,
        env=environment(), cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert more.returncode == 0, more.stderr[-3000:]
    assert committed(run) == [1, 2]  # the interrupted step neither lost nor doubled
