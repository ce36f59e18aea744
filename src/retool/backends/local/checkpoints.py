"""The local trainer's checkpoint directories: their layout, writing and reading.

A training state (``save_state``) is one directory of three files:

* ``trainable.safetensors`` - the trainable weights by parameter name (the
  LoRA adapters, or every weight for full fine-tuning);
* ``state.pt`` - the optimizer state (None before the first step) and the
  torch, Python and NumPy generator states, so a resumed run draws what the
  uninterrupted one would have;
* ``retool_state.json`` - format, base model, LoRA shape, step count: what a
  service needs to rebuild the client before loading the weights.

A sampler directory (``save_weights_for_sampler``) is a PEFT adapter or a full
HF model directory plus ``retool_sampler.json`` (base model, merged or not).

Every directory is written under a temporary name and renamed into place
(:func:`atomic_directory`), so a crash or a full disk never leaves half a
checkpoint: the previous one, or none, stays. A damaged file reads as one
``BackendError`` naming it, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from retool.data.files import write_failure
from retool.errors import BackendError

STATE_FORMAT = 1
TRAINABLE_FILE = "trainable.safetensors"
TRAINING_STATE_FILE = "state.pt"
STATE_META_FILE = "retool_state.json"
SAMPLER_META_FILE = "retool_sampler.json"


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``final``; rename it into place if the block succeeds.

    A failure (or a crash) leaves ``final`` as it was: either the previous
    complete checkpoint or nothing.
    """
    from safetensors import SafetensorError

    # A full disk surfaces as OSError, SafetensorError or torch's RuntimeError
    # ("unexpected pos"): one BackendError naming the checkpoint, the previous one kept.
    unwritable = (OSError, SafetensorError, RuntimeError)
    then = "the previous checkpoint is kept: rerun with --resume"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    except OSError as exc:
        raise BackendError(write_failure(final, "checkpoint", exc, then)) from None
    try:
        yield tmp
    except unwritable as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BackendError(write_failure(final, "checkpoint", exc, then)) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    trash = None
    try:
        if final.exists():
            trash = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.rename(final, trash)
        os.rename(tmp, final)
    except OSError as exc:
        raise BackendError(write_failure(final, "checkpoint", exc, then)) from None
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    """Every random generator a training step or a rollout draws from."""
    return {
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
    }


def restore_rng(state: Mapping[str, Any]) -> None:
    """Put back the generators of :func:`rng_state`."""
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])


def write_state(
    directory: Path,
    trainable: Mapping[str, torch.Tensor],
    optimizer: dict[str, Any] | None,
    meta: Mapping[str, Any],
) -> None:
    """Fill ``directory`` (a fresh one, from :func:`atomic_directory`) with a training state.

    ``optimizer`` is the optimizer's ``state_dict()`` (None before any step);
    ``meta`` the description :func:`read_state_meta` returns, less its format.
    """
    from safetensors.torch import save_file

    save_file(dict(trainable), str(directory / TRAINABLE_FILE))
    torch.save({"optimizer": optimizer, **rng_state()}, directory / TRAINING_STATE_FILE)
    record = {"format": STATE_FORMAT, **meta}
    (directory / STATE_META_FILE).write_text(json.dumps(record, indent=2))


def read_state_meta(root: Path) -> dict[str, Any]:
    """The ``retool_state.json`` of a training state, checked for its format."""
    meta_path = root / STATE_META_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise BackendError(f"{root}: not a retool checkpoint (no {STATE_META_FILE})") from None
    except json.JSONDecodeError as exc:
        raise BackendError(f"{meta_path}: corrupt ({exc.msg})") from None
    except (OSError, ValueError) as exc:  # a directory, not UTF-8, a 5000-digit integer
        raise BackendError(f"{meta_path}: unreadable ({str(exc)[:120]})") from None
    if not isinstance(meta, dict):
        raise BackendError(f"{meta_path}: corrupt (not a JSON object)")
    if meta.get("format") != STATE_FORMAT:
        raise BackendError(f"{meta_path}: unsupported checkpoint format {meta.get('format')}")
    return meta


def read_trainable(root: Path) -> dict[str, torch.Tensor]:
    """The trainable weights of a training state, by parameter name (on the CPU)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(root / TRAINABLE_FILE))
    except (SafetensorError, OSError) as exc:  # truncated, overwritten or missing
        raise BackendError(
            f"{root / TRAINABLE_FILE}: damaged weights file ({str(exc)[:120]}); "
            "resume from an earlier checkpoint (remove this one's line from "
            "checkpoints.jsonl) or start a new run"
        ) from None


def read_training_state(root: Path) -> dict[str, Any]:
    """The optimizer state and generator states of a training state (``write_state``)."""
    try:
        # map_location: a checkpoint saved on a GPU resumes on a CPU-only host too
        # (load_state_dict moves the optimizer's state to its parameters' device).
        state: dict[str, Any] = torch.load(
            root / TRAINING_STATE_FILE, weights_only=False, map_location="cpu"
        )
    # truncated or missing: torch's own words (EINVAL, with no file name, for some cuts)
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise BackendError(
            f"{root / TRAINING_STATE_FILE}: damaged optimizer state ({str(exc)[:120]}); resume "
            "from an earlier checkpoint or start a new run"
        ) from None
    return state


def write_sampler_meta(directory: Path, base_model: str, merged: bool) -> None:
    """``retool_sampler.json``: what ``create_sampling_client(model_path)`` loads."""
    (directory / SAMPLER_META_FILE).write_text(
        json.dumps({"base_model": base_model, "merged": merged})
    )
