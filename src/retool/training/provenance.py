"""What a run started from, recorded at its start and checked on ``--resume``.

``config.toml`` holds the settings; this is the rest of what decides a run's
result and exists only as flags or as file contents: the run kind (``rl``
from ``retool train``, ``sft`` from ``retool sft``), the training data (its
name and a SHA-256 of its content) and ``--init-from`` (the resolved
checkpoint directory and a SHA-256 of its files). It is written to
``RUN_DIR/inputs.json`` when the run starts.

On ``--resume`` (which refuses ``--init-from``) the kind and the data must be
the same: a ``retool train --resume`` of an SFT run, or other ``--data``,
would append steps that mean something else. When the run is resumed before
its first checkpoint it starts again from the recorded ``--init-from``
checkpoint, which must still be there with the same content; otherwise the
resume is refused in one line (never a silent start from the base model).
A run directory from before this file existed is resumed as it is and gets
one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from retool.errors import RetoolError

INPUTS_NAME = "inputs.json"
FORMAT = 1
KIND_COMMAND = {"rl": "retool train", "sft": "retool sft"}


@dataclass(frozen=True)
class RunInputs:
    """The run kind and its training data, as the command that trains knows them."""

    kind: str  # "rl" | "sft"
    data: str  # what the user named (data.train, --data)
    data_sha256: str  # of the content (see :func:`digest_records`, :func:`digest_file`)


def digest_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_records(records: Iterable[Any]) -> str:
    """SHA-256 of loaded records (dataclasses or JSON values), in order."""
    digest = hashlib.sha256()
    for record in records:
        value = asdict(record) if hasattr(record, "__dataclass_fields__") else record
        digest.update(json.dumps(value, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def digest_directory(path: Path) -> str:
    """SHA-256 over every file of a checkpoint directory (names and contents)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode("utf-8", "surrogateescape") + b"\0")
        digest.update(digest_file(file).encode())
    return digest.hexdigest()


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RetoolError(
            f"{path}: cannot read the run's inputs ({exc}); the run directory is damaged"
        ) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise RetoolError(f"{path}: not a retool inputs file (format {FORMAT})")
    start = record.get("init_from")
    shapes = {
        "kind": record.get("kind") is None or isinstance(record.get("kind"), str),
        "data": record.get("data") is None or isinstance(record.get("data"), dict),
        "init_from": start is None
        or (
            isinstance(start, dict)
            and all(isinstance(start.get(k), str) for k in ("spec", "state_path", "sha256"))
        ),
    }
    wrong = [key for key, ok in shapes.items() if not ok]
    if wrong:
        raise RetoolError(
            f"{path}: {wrong[0]!r} is not what a run writes ({record.get(wrong[0])!r:.60}); "
            "the run directory is damaged: restore that file or start a new run"
        )
    return record


def record_start(
    run_path: Path, inputs: RunInputs | None, init_from: str | None, state: Path | None
) -> dict[str, Any]:
    """The ``inputs.json`` record of a new run (``state``: ``init_from`` resolved, hashed now)."""
    record: dict[str, Any] = {"format": FORMAT, "kind": None, "data": None, "init_from": None}
    if inputs is not None:
        record["kind"] = inputs.kind
        record["data"] = {"name": inputs.data, "sha256": inputs.data_sha256}
    if init_from and state is not None:
        state = state.resolve()
        record["init_from"] = {
            "spec": init_from,
            "state_path": str(state),
            "sha256": digest_directory(state),
        }
    return record


def check_resume(path: Path, inputs: RunInputs | None) -> dict[str, Any] | None:
    """The stored record, after refusing another run kind or other data; None for old runs."""
    stored = _read(path)
    if stored is None or inputs is None:
        return stored
    kind = stored.get("kind")
    if kind is not None and kind != inputs.kind:
        raise RetoolError(
            f"--resume: {path.parent} is a {kind.upper()} run (started by "
            f"{KIND_COMMAND.get(kind, kind)}); resume it with that command, or start a new "
            f"{inputs.kind.upper()} run in another --run-dir"
        )
    data = stored.get("data") or {}
    if data and data.get("sha256") != inputs.data_sha256:
        same_name = data.get("name") == inputs.data
        which = (
            f"{inputs.data} has changed since"
            if same_name
            else (f"the run was started on {data.get('name')}, not {inputs.data}")
        )
        raise RetoolError(
            f"--resume: the training data differs from the run's ({which}; SHA-256 "
            f"{str(data.get('sha256'))[:12]}... recorded in {path}); resume with the same data "
            "or start a new run"
        )
    return stored


def recorded_init_from(path: Path) -> str | None:
    """The recorded ``--init-from`` checkpoint, checked to be unchanged; None if there was none."""
    stored = _read(path) or {}
    start = stored.get("init_from")
    if not start:
        return None
    state = Path(start["state_path"])
    if not (state / "retool_state.json").is_file():
        raise RetoolError(
            f"--resume: the run started from --init-from {start['spec']} ({state}), which is "
            "gone, and has no checkpoint of its own yet; restore that checkpoint or start a new "
            "run"
        )
    if digest_directory(state) != start["sha256"]:
        raise RetoolError(
            f"--resume: the --init-from checkpoint {state} changed since the run started "
            f"(SHA-256 differs from {path}), and the run has no checkpoint of its own yet; "
            "restore it or start a new run"
        )
    return str(state)


def recorded_init_from_spec(path: Path) -> str | None:
    """What ``--init-from`` said at the start (for messages), or None."""
    try:
        stored = _read(path) or {}
    except RetoolError:
        return None
    start = stored.get("init_from")
    return str(start["spec"]) if start else None
