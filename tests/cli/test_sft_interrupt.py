"""Ctrl-C and SIGTERM in the first seconds of ``retool sft`` on SmolLM2.

The moments that aborted the interpreter ("terminate called without an
active exception", SIGABRT or SIGSEGV) before the fix: while the model loads
and during the first training call, both of which run in a compute worker
thread (:mod:`retool.backends.local.threads`). Each interrupt must end the
command with 128 + signal, one final ``retool: ...`` line naming the signal,
and neither a traceback nor an abort. Measured on the 2-core AMD EPYC (AVX2)
development machine, under load from other jobs: before the fix 2 of 6
SIGINTs sent 0.2-3 s after the model had loaded aborted (at 2.0 and 3.0 s);
after it none of 6. Slow (SmolLM2 loads once per interrupt, three interrupts).
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

_SCRIPT = Path(sys.executable).with_name("retool")
RETOOL = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "retool"]

CONFIG = """
[model]
base_model = "smollm2-135m-instruct"
lora_rank = 4

[train]
steps = 2
questions_per_batch = 2
save_every = 0
"""

# (what to wait for, seconds after it, signal)
# Three moments keep the test to one SmolLM2 load each: the loading itself and the two
# moments that aborted before the fix (2 and 3 s after loading, in the first training call).
MOMENTS = [
    ("run directory", 0.3, signal.SIGINT),  # the model is loading
    ("model loaded", 2.0, signal.SIGINT),  # the first forward_backward
    ("model loaded", 3.0, signal.SIGTERM),
]


def conversations(count: int) -> str:
    lines = []
    for i in range(count):
        a, b = 1234 + i, 5678 + 3 * i
        messages = [
            {"role": "user", "content": f"What is {a} * {b}? Give the exact integer."},
            {"role": "assistant", "content": "Let me compute it.", "code": f"print({a} * {b})"},
            {"role": "tool", "content": f"{a * b}\n"},
            {"role": "assistant", "content": f"The product is \\boxed{{{a * b}}}."},
        ]
        lines.append(json.dumps({"id": f"c{i}", "messages": messages}))
    return "\n".join(lines) + "\n"


def _interrupt(tmp: Path, index: int, mark: str, delay: float, signum: int) -> str | None:
    run = tmp / f"run{index}"
    proc = subprocess.Popen(
        [*RETOOL, "sft", "--config", str(tmp / "sft.toml"), "--data", str(tmp / "demos.jsonl"),
         "--run-dir", str(run), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    label = f"{signal.Signals(signum).name} {delay} s after {mark}"
    target = run if mark == "run directory" else run / "log.txt"  # log.txt: after loading
    try:
        deadline = time.monotonic() + 600
        while not target.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is not None:
            return f"{label}: ended before the signal ({proc.returncode}): {proc.stderr.read()}"
        time.sleep(delay)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    problems = []
    if proc.returncode != 128 + signum:
        problems.append(f"exit status {proc.returncode}, expected {128 + signum}")
    for bad in ("terminate called", "Traceback", "Fatal Python error", "Exception ignored"):
        if bad in err:
            problems.append(f"{bad!r} on stderr")
    lines = [line for line in err.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("retool:")]
    if len(ours) != 1 or lines[-1] != ours[0] or signal.Signals(signum).name not in ours[0]:
        problems.append(f"not one final 'retool: ...' line naming the signal: {lines[-3:]}")
    return f"{label}: {'; '.join(problems)}" if problems else None


@pytest.mark.slow(seconds=55)
def test_interrupts_in_the_first_seconds_of_sft_on_smollm2_exit_cleanly(tmp_path):
    (tmp_path / "sft.toml").write_text(CONFIG)
    (tmp_path / "demos.jsonl").write_text(conversations(8))
    failures = [
        failure
        for index, moment in enumerate(MOMENTS)
        if (failure := _interrupt(tmp_path, index, *moment)) is not None
    ]
    assert not failures, "\n".join(failures)
