"""The local trainer's checkpoint directories: round trip, damage, interrupted writes."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from retool.backends.local.checkpoints import (
    STATE_META_FILE,
    TRAINABLE_FILE,
    TRAINING_STATE_FILE,
    atomic_directory,
    read_state_meta,
    read_trainable,
    read_training_state,
    restore_rng,
    write_state,
)
from retool.errors import BackendError

META = {"base_model": "tiny-random", "lora": None, "steps": 3, "max_context_tokens": 64}


def _state(tmp_path, optimizer=None):
    root = tmp_path / "state" / "step-3"
    weights = {"b.weight": torch.arange(6.0).reshape(2, 3), "a.bias": torch.tensor([-1.5])}
    with atomic_directory(root) as tmp:
        write_state(tmp, weights, optimizer, META)
    return root, weights


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_a_state_reads_back_and_its_generators_replay(tmp_path):
    root, weights = _state(tmp_path, optimizer={"state": {}, "param_groups": []})
    expected = _draws()  # what follows the save, uninterrupted
    _draws()  # the generators move on (a crash, another run)
    meta = read_state_meta(root)
    assert meta == {"format": 1, **META}
    loaded = read_trainable(root)
    assert loaded.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor)
    state = read_training_state(root)
    assert state["optimizer"] == {"state": {}, "param_groups": []}
    restore_rng(state)
    assert _draws() == expected


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "not a retool checkpoint"),
        (b"{not json", r"retool_state\.json: corrupt"),
        (json.dumps({**META, "format": 2}).encode(), "unsupported checkpoint format 2"),
        (json.dumps(META).encode(), "unsupported checkpoint format None"),
    ],
)
def test_a_damaged_description_is_one_error_naming_it(tmp_path, content, says):
    root, _ = _state(tmp_path)
    if content is None:
        (root / STATE_META_FILE).unlink()
    else:
        (root / STATE_META_FILE).write_bytes(content)
    with pytest.raises(BackendError, match=says):
        read_state_meta(root)


@pytest.mark.parametrize(
    ("name", "read", "says"),
    [
        (TRAINABLE_FILE, read_trainable, "trainable.safetensors: damaged weights file"),
        (TRAINING_STATE_FILE, read_training_state, "state.pt: damaged optimizer state"),
    ],
)
@pytest.mark.parametrize("keep", [0, 20, -7, None])
def test_a_truncated_or_missing_file_is_one_error_naming_it(tmp_path, name, read, says, keep):
    """-7 cuts state.pt's zip directory: torch raises OSError EINVAL with no file name."""
    root, _ = _state(tmp_path)
    if keep is None:
        (root / name).unlink()
    else:
        (root / name).write_bytes((root / name).read_bytes()[:keep])
    with pytest.raises(BackendError, match=says):
        read(root)


def test_a_replaced_checkpoint_keeps_nothing_of_the_previous_one(tmp_path):
    final = tmp_path / "state" / "step-3"
    with atomic_directory(final) as tmp:
        (tmp / "stale").write_text("previous")
    with atomic_directory(final) as tmp:
        (tmp / "fresh").write_text("new")
    assert [p.name for p in final.iterdir()] == ["fresh"]
    assert [p.name for p in final.parent.iterdir()] == ["step-3"]  # no .tmp- or .old- left


@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError])
def test_an_interrupted_write_leaves_the_previous_checkpoint_and_the_error(tmp_path, error):
    final = tmp_path / "state" / "step-3"
    with atomic_directory(final) as tmp:
        (tmp / "kept").write_text("previous")
    with pytest.raises(error), atomic_directory(final) as tmp:
        (tmp / "half").write_text("half")
        raise error("stop")
    assert [p.name for p in final.iterdir()] == ["kept"]
    assert [p.name for p in final.parent.iterdir()] == ["step-3"]


def test_a_checkpoint_root_that_is_a_file_is_one_error(tmp_path):
    (tmp_path / "state").write_text("not a directory")
    with (
        pytest.raises(BackendError, match="cannot write the checkpoint"),
        atomic_directory(tmp_path / "state" / "step-3"),
    ):
        pass
