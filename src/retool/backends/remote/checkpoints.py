"""Pointer directories: a checkpoint kept by the service, named in the run directory.

Design, and why:

* A remote checkpoint lives on the service; the run directory gets a small
  *pointer* directory for it (``checkpoints/state/<name>/retool_state.json``,
  ``checkpoints/sampler/<name>/retool_sampler.json``) naming the backend and
  the service URI, written atomically (a temporary sibling renamed into
  place). The run directory's manifest, ``--resume``, ``--init-from`` and
  ``retool eval --model RUN_DIR`` then work unchanged; resume goes through
  ``create_training_client_from_state_with_optimizer`` on both services
  (PyTRIO's ``load_state`` only works before the first training step).
* A pointer of another backend, a local checkpoint or a damaged file is
  refused in one line that says which backend to use; a bare service URI
  (``tinker://...``) is accepted where its scheme is the backend's.
* Checkpoint names are checked before any request (:func:`check_checkpoint_name`):
  what the services accept, and a safe directory name here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from retool.errors import BackendError

POINTER_FORMAT = "remote-1"  # format tag of a pointer directory's JSON file
STATE_FILE = "retool_state.json"
SAMPLER_FILE = "retool_sampler.json"

# A checkpoint name the services accept and that is a safe directory name here:
# PyTRIO's own pattern (pytrio/client/builders/training.py: CHECKPOINT_NAME_PATTERN_TEXT).
CHECKPOINT_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?$")
CHECKPOINT_NAME_MAX = 200  # pytrio/client/builders/training.py: CHECKPOINT_NAME_MAX_LENGTH


@dataclass(frozen=True)
class RemoteCheckpoint:
    """What a pointer directory records about a checkpoint kept by the service."""

    backend: str  # "pytrio" | "tinker"
    remote_path: str  # the service's URI for it
    base_model: str  # the model it was trained from
    lora_rank: int | None = None  # adapter rank (state checkpoints)
    steps: int = 0  # optimizer steps taken when it was saved (state checkpoints)


def check_checkpoint_name(name: str, backend: str) -> None:
    """Refuse a checkpoint name the service would reject (before any request)."""
    if not isinstance(name, str) or not CHECKPOINT_NAME.fullmatch(name):
        raise BackendError(
            f"{backend}: checkpoint name {name!r} must match {CHECKPOINT_NAME.pattern} "
            "(letters, digits, '.', '_', '-'; no '/' or spaces)"
        )
    if len(name) > CHECKPOINT_NAME_MAX:
        raise BackendError(
            f"{backend}: checkpoint name {name[:40]!r}... is {len(name)} characters, "
            f"more than {CHECKPOINT_NAME_MAX}"
        )


def write_pointer(directory: Path, file_name: str, checkpoint: RemoteCheckpoint) -> Path:
    """Write ``directory/file_name`` atomically (a temporary sibling renamed into place)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        record = {"format": POINTER_FORMAT, **asdict(checkpoint)}
        (tmp / file_name).write_text(json.dumps(record, indent=2), encoding="utf-8")
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def read_pointer(path: str | Path, file_name: str, backend: str, scheme: str) -> RemoteCheckpoint:
    """The checkpoint a local pointer directory names, or a bare service URI."""
    text = str(path)
    if "://" in text and not Path(text).exists():
        if scheme and not text.startswith(scheme):
            raise BackendError(f"{backend}: {text!r} is not a {backend} path ({scheme}...)")
        return RemoteCheckpoint(backend, text, "")
    record_path = Path(text) / file_name
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BackendError(
            f"{backend}: {text} is not a checkpoint of this run's service (no {file_name})"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BackendError(f"{record_path}: unreadable ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != POINTER_FORMAT:
        raise BackendError(
            f"{record_path}: a local checkpoint, not a {backend} one; start from it with "
            'model.backend = "local"'
        )
    if record.get("backend") != backend:
        raise BackendError(
            f"{record_path}: saved on {record.get('backend')!r}; set "
            f'model.backend = "{record.get("backend")}" to use it'
        )
    try:
        rank = record.get("lora_rank")
        return RemoteCheckpoint(
            backend=backend,
            remote_path=str(record["remote_path"]),
            base_model=str(record.get("base_model") or ""),
            lora_rank=None if rank is None else int(rank),
            steps=int(record.get("steps") or 0),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BackendError(f"{record_path}: not a valid pointer ({exc})") from None
