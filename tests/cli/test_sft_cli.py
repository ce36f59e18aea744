"""``retool sft``: make-demos end to end, training-form validation and forwarding."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import retool.cli
from retool.training.sft_data import load_conversations


def _retool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "retool", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def _one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("retool: error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_make_demos_writes_a_loadable_file(tmp_path):
    output = tmp_path / "demos.jsonl"
    done = _retool(
        "sft", "make-demos", "--dataset", "demo:train", "--limit", "5", "--output", str(output)
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 5 conversations" in done.stdout and "demo:train" in done.stdout
    conversations = load_conversations(output)
    assert [c.id for c in conversations] == [f"demo-train-{i:04d}" for i in range(5)]
    repaired = sum(1 for c in conversations if c.code_calls == 2)
    assert f"{repaired} of them a failed first call and its fix" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demos.jsonl"]


def test_make_demos_failure_share_and_failed_calls_shown_as_context(tmp_path):
    output = tmp_path / "demos.jsonl"
    done = _retool(
        "sft", "make-demos", "--limit", "7", "--failure-share", "1", "--failed-calls", "context",
        "--output", str(output),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    conversations = load_conversations(output)
    repaired = [c for c in conversations if c.code_calls == 2]
    assert len(repaired) >= 6  # every problem whose wrong attempt really fails
    for conversation in repaired:
        assert conversation.messages[1]["train"] is False
        assert all("train" not in m for m in conversation.messages[2:])
    none = _retool(
        "sft", "make-demos", "--limit", "7", "--failure-share", "0", "--output", str(output)
    )
    assert none.returncode == 0 and "0 of them a failed first call" in none.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--output", "{dir}"], ["--output", "is a directory"]),
        (["--dataset", "demo:nope", "--output", "{out}"], ["demo split", "'nope'"]),
        (["--dataset", "demo:test", "--output", "{out}"], ["held out"]),
        (["--dataset", "demo:paraphrase", "--output", "{out}"], ["paraphrase", "held out"]),
        (["--dataset", "data.jsonl", "--output", "{out}"], ["reference solutions"]),
        (["--limit", "0", "--output", "{out}"], ["--limit must be >= 1"]),
        (["--output", "{dir}/missing/x.jsonl"], ["does not exist"]),
        (["--failure-share", "1.5", "--output", "{out}"], ["--failure-share", "<= 1"]),
        (["--failed-calls", "skip", "--output", "{out}"], ["--failed-calls", "'skip'"]),
    ],
    ids=[
        "output-dir",
        "unknown-split",
        "test-split",
        "paraphrase-split",
        "not-demo",
        "limit-0",
        "no-parent",
        "failure-share-above-1",
        "failed-calls-unknown",
    ],
)
def test_make_demos_bad_inputs_are_one_line_and_write_nothing(tmp_path, args, fragments):
    work = tmp_path / "work"
    work.mkdir()
    out = work / "demos.jsonl"
    filled = [a.format(dir=work, out=out) for a in args]
    _one_line_error(_retool("sft", "make-demos", *filled), *fragments)
    assert list(work.iterdir()) == []


def test_help_documents_both_forms():
    top = _retool("sft", "--help")
    assert top.returncode == 0
    for word in ("make-demos", "--data", "--resume", "--init-from", "--tracker", "--set"):
        assert word in top.stdout
    verb = _retool("sft", "make-demos", "--help")
    assert verb.returncode == 0
    for word in ("--dataset", "--output", "--limit", "--seed", "boxed"):
        assert word in verb.stdout
    assert "--data " not in verb.stdout


def test_training_form_validation(tmp_path):
    _one_line_error(_retool("sft"), "--data FILE.jsonl is required")
    _one_line_error(_retool("sft", "--data", str(tmp_path / "nope.jsonl")), "no such file")
    _one_line_error(_retool("sft", "--data", str(tmp_path)), "is a directory")
    out = tmp_path / "demos.jsonl"
    mixed = _retool("sft", "--data", "x.jsonl", "make-demos", "--output", str(out))
    _one_line_error(mixed, "--data belongs to `retool sft` training")
    assert not out.exists()


def test_training_form_calls_run_sft(tmp_path, monkeypatch, capsys):
    """The contract with retool.training.sft.run_sft, checked with a stand-in function."""
    calls = []

    class FakeRun:
        path = tmp_path / "run"

        def last_checkpoint(self):
            return None

    def run_sft(config, data_path, **kwargs):
        calls.append((config, data_path, kwargs))
        return FakeRun()

    # the command imports run_sft from its module when it runs (after checking its input)
    monkeypatch.setattr("retool.training.sft.run_sft", run_sft)
    data = tmp_path / "demos.jsonl"
    conversation = {
        "id": "c1",
        "messages": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "It is \\boxed{4}."},
        ],
    }
    data.write_text(json.dumps(conversation) + "\n")
    (tmp_path / "ckpt" / "step_000002").mkdir(parents=True)
    (tmp_path / "ckpt" / "step_000002" / "retool_state.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    code = retool.cli.main(
        [
            "sft",
            "--data",
            str(data),
            "--set",
            "train.steps=3",
            "--set",
            "train.learning_rate=0.001",
            "--run-dir",
            str(tmp_path / "run"),
            "--init-from",
            "ckpt/step_000002",
            "--tracker",
            "tensorboard",
        ]
    )
    assert code == 0, capsys.readouterr().err
    ((config, data_path, kwargs),) = calls
    assert config.train.steps == 3 and config.train.learning_rate == 0.001
    assert Path(data_path) == data
    assert kwargs == {
        "run_dir": str(tmp_path / "run"),
        "resume": False,
        "init_from": "ckpt/step_000002",
        "tracker": "tensorboard",
        "progress": True,
    }
    calls.clear()
    assert retool.cli.main(["sft", "--data", str(data)]) == 0
    ((config, _, kwargs),) = calls
    assert kwargs == {
        "run_dir": config.train.run_dir,  # resolved (and checked) before the model loads
        "resume": False,
        "init_from": None,
        "tracker": None,
        "progress": True,
    }


def test_bad_config_override_is_one_error(tmp_path):
    data = tmp_path / "demos.jsonl"
    data.write_text("{}\n")
    _one_line_error(_retool("sft", "--data", str(data), "--set", "train.steps=0"), "train.steps")
