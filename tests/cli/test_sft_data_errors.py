"""``retool sft`` with a data file that loads but does not train: refused before step 1.

A careless user's file: every line is valid JSON of the right shape, but one
conversation, late in the file, is too long for ``train.max_train_tokens`` (or
cannot be written in the run's dialect). Checked only when a step drew it, the
run stopped there after committing the earlier steps, and the repaired file
then no longer matched the run (``--resume`` refused it): a dead end. Now the
whole file is rendered before step 1: one line naming ``file:line``, exit 2,
no run directory; the repaired file then trains with the same command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.builders import TINY_RUN, run_toml

USER = {"role": "user", "content": "What is 2^10?"}
CALL = {"role": "assistant", "content": "Let me compute.", "code": "print(2**10)"}
TOOL = {"role": "tool", "content": "1024\n"}
ANSWER = {"role": "assistant", "content": "The answer is \\boxed{1024}"}


def _retool(*args: str) -> subprocess.CompletedProcess[str]:
    entry = Path(sys.executable).parent / "retool"
    return subprocess.run(
        [str(entry), *args], capture_output=True, text=True, timeout=300, check=False
    )


def _write(path: Path, bad: dict | None, at: int = 7) -> Path:
    """Nine short conversations, ``bad`` (if any) replacing the one at line ``at``."""
    lines = []
    for i in range(1, 10):
        record = {"id": f"c{i}", "messages": [USER, CALL, TOOL, ANSWER]}
        lines.append(json.dumps(bad if (bad is not None and i == at) else record))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


ESSAY = {"id": "essay", "messages": [USER, CALL, TOOL, {**ANSWER, "content": "so " * 900}]}


def test_a_line_too_long_late_in_the_file_stops_nothing_and_writes_nothing(tmp_path):
    config = tmp_path / "sft.toml"
    # one step of 2 of the 9 conversations: the refusal must not depend on which it draws
    config.write_text(run_toml(TINY_RUN, train={"steps": 1, "questions_per_batch": 2}))
    data = _write(tmp_path / "demos.jsonl", ESSAY)  # fine JSON, fine shape: it loads
    run_dir = tmp_path / "run"
    args = ("sft", "--config", str(config), "--data", str(data), "--run-dir", str(run_dir))
    done = _retool(*args, "--no-progress")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"retool: error: {data}:7: "), done.stderr
    assert "conversation 'essay' renders to" in lines[0]
    assert "more than train.max_train_tokens = 1024" in lines[0]
    assert not run_dir.exists()  # no step committed, no skeleton left behind
    # repaired, the same command trains (no --resume dead end)
    _write(data, None)
    again = _retool(*args, "--no-progress")
    assert again.returncode == 0, again.stderr
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1
