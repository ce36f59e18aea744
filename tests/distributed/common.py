"""Starting ``torchrun`` from a test: two ranks on this CPU, one thread each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
