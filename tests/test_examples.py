"""examples/rl_loop.py runs: one RL step and an evaluation on ``tiny-random``, as a user runs it.

The example is documentation that executes; a renamed function or a changed
signature in the public API it uses would leave it broken without this test.
It runs as a subprocess from the repository root (the way the README says to
run it), with the training tests' mixed reward (``tests.training.rewards:
even_length``) so a random model gets non-zero advantages and the step really
calls ``forward_backward`` and ``optim_step``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rl_loop.py"
STEP = re.compile(
    r"^step 1: reward (?P<reward>[+-]\d\.\d+) correct \d+% code calls \d\.\d+ "
    r"datums (?P<datums>\d+)/(?P<total>\d+) loss (?P<loss>\S+) grad_norm (?P<grad>\S+)$",
    re.M,
)


def test_the_minimal_rl_loop_trains_one_step_and_evaluates_on_tiny_random():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    flags = "--model tiny-random --steps 1 --questions 2 --group-size 4 --max-tokens 16"
    flags += " --eval-problems 1 --eval-n 2 --reward tests.training.rewards:even_length"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *flags.split()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    step = STEP.search(done.stdout)
    assert step, done.stdout
    assert int(step["total"]) == 8  # 2 questions x 4 trajectories
    # the mixed reward gives some group two outcomes (a 2 x 4 batch of random text
    # almost always does), so datums were built and the update ran
    assert int(step["datums"]) > 0, done.stdout
    assert float(step["grad"]) > 0, done.stdout
    assert re.search(
        r"^eval demo:dev: 1 problems x 2: Average@2 \S+%  Pass@2 \S+%$", done.stdout, re.M
    )
