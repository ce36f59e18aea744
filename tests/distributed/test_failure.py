"""Ctrl-C under torchrun: the job stops with one line, nothing committed is lost,
--resume continues; and a second job on the same run is refused.

The attack: Ctrl-C on the launcher (SIGINT to its process group). It must stop
as ``retool train`` does in one process: exit 130 (through ``python -m
retool.launch``: plain torchrun exits 1), one line, the last completed step
saved (the serving rank takes part in that save). The other failure, ``kill -9``
of the serving rank, is in ``test_commands.py``: it shares that file's
uninterrupted two-rank run (one torchrun job less for the suite).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.distributed.common import (
    RL,
    ROOT,
    committed,
    environment,
    launcher,
    ours,
    saved,
    torchrun,
    wait_for_a_commit,
)


@pytest.mark.slow(seconds=75)  # three torchrun jobs of the tiny model, one of them refused at once
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
        wait_for_a_commit(job, run)
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
