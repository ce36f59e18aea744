"""Pointer directories of checkpoints kept by the service, and checkpoint names."""

from __future__ import annotations

import json

import pytest

from retool.backends.remote import checkpoints
from retool.errors import BackendError


def test_pointer_directories_round_trip_and_refuse_other_backends(tmp_path):
    checkpoint = checkpoints.RemoteCheckpoint("tinker", "tinker://run/weights/s1", "Qwen/Q", 16, 7)
    directory = checkpoints.write_pointer(
        tmp_path / "state" / "s1", checkpoints.STATE_FILE, checkpoint
    )
    assert (
        checkpoints.read_pointer(directory, checkpoints.STATE_FILE, "tinker", "tinker://")
        == checkpoint
    )
    checkpoints.write_pointer(directory, checkpoints.STATE_FILE, checkpoint)  # replaced, not nested
    assert sorted(p.name for p in directory.iterdir()) == [checkpoints.STATE_FILE]
    with pytest.raises(BackendError, match='saved on .tinker.; set model.backend = "tinker"'):
        checkpoints.read_pointer(directory, checkpoints.STATE_FILE, "pytrio", "")
    bare = checkpoints.read_pointer(
        "tinker://run/weights/s2", checkpoints.STATE_FILE, "tinker", "tinker://"
    )
    assert bare.remote_path == "tinker://run/weights/s2" and bare.steps == 0
    with pytest.raises(BackendError, match="not a tinker path"):
        checkpoints.read_pointer("trio://x/y", checkpoints.STATE_FILE, "tinker", "tinker://")
    local = tmp_path / "local"
    local.mkdir()
    (local / checkpoints.STATE_FILE).write_text(json.dumps({"format": 1, "base_model": "m"}))
    with pytest.raises(BackendError, match='a local checkpoint.*model.backend = "local"'):
        checkpoints.read_pointer(local, checkpoints.STATE_FILE, "pytrio", "")
    with pytest.raises(BackendError, match="no retool_state.json"):
        checkpoints.read_pointer(tmp_path, checkpoints.STATE_FILE, "pytrio", "")


def test_checkpoint_names_are_checked_before_any_request():
    checkpoints.check_checkpoint_name("step_000010", "pytrio")
    for bad in ("", "a/b", "has space", ".hidden", "x" * 201, "../up", "name.", 7):
        with pytest.raises(BackendError, match="checkpoint name"):
            checkpoints.check_checkpoint_name(bad, "pytrio")
