"""Starting ``torchrun`` from a test: two ranks on this CPU, one thread each; the RL
run the jobs share, and what a test reads of a job (its lines, its ranks, its run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from tests.builders import run_toml

ROOT = Path(__file__).resolve().parents[2]

RL = run_toml(
    rollout={"group_size": 4},
    train={"grad_clip_norm": 1.0, "micro_batch_tokens": 1500, "micro_batch_items": 3},
)


def environment() -> dict[str, str]:
    """The test's environment for a child, without a torchrun place of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def torchrun(*args: str, ranks: int = 2, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --nproc-per-node RANKS --standalone ARGS``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    return subprocess.run(
        [*command, "--standalone", *args],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=timeout,
        cwd=ROOT,
    )


def python(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The same program in one process, without torchrun."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=timeout,
        cwd=ROOT,
    )


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


def wait_for_a_commit(job: subprocess.Popen[str], run: Path, within: float = 240) -> None:
    """Until ``run`` holds a committed step, while ``job`` runs (then a signal tests
    something: the job is past its start and has something to keep)."""
    deadline = time.monotonic() + within
    while not committed(run):
        assert job.poll() is None and time.monotonic() < deadline, "no step committed"
        time.sleep(0.1)


def saved(run: Path) -> list[str]:
    root = run / "checkpoints" / "state"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def final_weights(run: Path) -> dict:
    path = run / "checkpoints" / "state" / "step_000002" / "trainable.safetensors"
    return load_file(str(path))
