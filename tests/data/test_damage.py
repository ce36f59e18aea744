"""Damaged inputs and full disks are one error naming the file.

Run-directory readers (metrics, manifest, journal, step_* names), long
integers in JSON/TOML, and writes that fail with ``ENOSPC`` (``/dev/full``:
an ``OSError`` with no file name, as a full disk gives a file already open).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool.data.files import writing
from retool.data.longints import json_loads, toml_loads
from retool.errors import ConfigError, DataError, RetoolError
from retool.training.run_dir import RunDirectory, step_of

BIG = "1" * 5000


def test_long_integers_are_refused_at_their_line_or_kept_as_text():
    with pytest.raises(json.JSONDecodeError, match="5000 digits") as caught:
        json_loads('{"a": 1,\n "b": ' + BIG + "}")
    assert caught.value.lineno == 2
    assert json_loads(f'{{"answer": {BIG}}}', big_int_as_text=True) == {"answer": BIG}
    assert json_loads('{"answer": 12}', big_int_as_text=True) == {"answer": 12}
    with pytest.raises(ConfigError, match=r"c\.toml:3: an integer of 5000 digits"):
        toml_loads(f"[a]\nx = 1\ny = {BIG}\n", "c.toml")


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("metrics.jsonl", b'{"loss": 1}\n{"step": 2}\n', "metrics.jsonl:1: no 'step' field"),
        ("metrics.jsonl", b'{"step": "1"}\n{"step": 2}\n', "'step' is not an integer"),
        ("metrics.jsonl", b'{"step": 1, "x": "\xff"}\n{"step": 2}\n', "metrics.jsonl:1: not UTF-8"),
        ("metrics.jsonl", b"[1]\n{}\n", "not a JSON object"),
        ("checkpoints.jsonl", b'{"step": 1, "state_path": "s"}\n', "no 'sampler_path' field"),
    ],
)
def test_damaged_run_files_name_file_and_line(tmp_path, name, content, says):
    run = RunDirectory(tmp_path)
    (tmp_path / name).write_bytes(content)
    read = run.metrics if name == "metrics.jsonl" else run.checkpoints
    with pytest.raises(RetoolError, match="the run directory is damaged") as caught:
        read()
    assert says in str(caught.value)


def test_a_torn_last_line_is_still_dropped(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n{"step": 2, "x": "\xe2\x82')
    assert RunDirectory(tmp_path).completed_steps() == [1]


def test_binary_junk_in_a_journal_says_to_delete_it(tmp_path):
    run = RunDirectory(tmp_path)
    journal = run.journal(3)
    journal.path.parent.mkdir(parents=True)
    journal.path.write_bytes(b'{"not": "a trajectory"}\n' + bytes(range(256)) + b"\n{}\n")
    with pytest.raises(RetoolError, match=r"delete .*step_000003\.jsonl"):
        journal.complete_groups([], 2)


def test_an_unexpected_step_file_name_is_named():
    assert step_of(Path("rollouts/step_000012.jsonl.gz")) == 12
    with pytest.raises(RetoolError, match=r"step_abc\.jsonl\.gz: unexpected file name"):
        step_of(Path("rollouts/step_abc.jsonl.gz"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_write_that_fails_with_no_file_name_names_the_file():
    where = writing("out/results.jsonl", "results row", then="rerun to continue")
    with open("/dev/full", "wb", buffering=0) as handle, pytest.raises(DataError) as caught, where:
        handle.write(b"x" * 10)
    message = str(caught.value)
    assert message.startswith("out/results.jsonl: cannot write the results row")
    assert "free disk space" in message and message.endswith("rerun to continue")


def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(tmp_path):
    from safetensors import SafetensorError

    from retool.backends.local.checkpoints import atomic_directory
    from retool.errors import BackendError

    final = tmp_path / "state" / "step_000002"
    final.mkdir(parents=True)
    (final / "kept").write_text("previous")
    refused = pytest.raises(BackendError, match=r"step_000002: cannot write the checkpoint")
    with refused, atomic_directory(final) as tmp:
        (tmp / "half").write_text("half")
        raise SafetensorError("I/O error: No space left on device (os error 28)")
    assert (final / "kept").read_text() == "previous"
    assert sorted(p.name for p in final.parent.iterdir()) == ["step_000002"]


def _full_at_fsync(monkeypatch):
    import retool.atomic

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(retool.atomic.os, "fsync", full)


def test_examples_that_cannot_be_written_keep_the_previous_file(tmp_path, monkeypatch):
    from retool.data import MathExample, write_jsonl

    path = tmp_path / "train.jsonl"
    path.write_text("previous\n")
    _full_at_fsync(monkeypatch)
    with pytest.raises(DataError, match=r"train.jsonl: cannot write it \(No space left"):
        write_jsonl(path, [MathExample("1", "q", "a")])
    assert path.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == [
        "train.jsonl"
    ]


def test_a_bad_item_late_in_a_stream_of_examples_leaves_the_previous_file(tmp_path):
    from retool.data import MathExample, write_jsonl

    path = tmp_path / "train.jsonl"
    path.write_text("previous\n")

    def items():
        for n in range(1000):
            yield MathExample(str(n), "q" * 100, "a")  # more than one buffer: some reach disk
        yield {"id": "late"}

    with pytest.raises(DataError, match="item 1000 is a dict"):
        write_jsonl(path, items())
    assert path.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == [
        "train.jsonl"
    ]


def test_conversations_that_cannot_be_written_keep_the_previous_file(tmp_path, monkeypatch):
    from retool.training.sft_data import Conversation, write_conversations

    path = tmp_path / "sft.jsonl"
    path.write_text("previous\n")
    conversation = Conversation(
        "c1", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    )
    _full_at_fsync(monkeypatch)
    with pytest.raises(RetoolError, match=r"sft.jsonl: cannot write \(No space left"):
        write_conversations(path, [conversation])
    assert path.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == [
        "sft.jsonl"
    ]
