"""Math examples and how they are read from disk.

A :class:`MathExample` is one question with its reference answer. Files are JSONL
(one object per line) or Parquet with the columns ``id``, ``question``,
``answer`` and optionally ``data_source``. Every defect is reported as a
:class:`~retool.errors.DataError` naming ``path:line`` (the row number for
Parquet), so a user can fix the file without a debugger.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from retool.atomic import atomic_output
from retool.data.files import as_path, decode_utf8, reason
from retool.data.longints import json_loads
from retool.errors import DataError


@dataclass(frozen=True)
class MathExample:
    """One math question and its reference answer."""

    id: str  # unique within a dataset
    question: str  # problem statement shown to the model
    answer: str  # reference answer (LaTeX or plain), compared by math equivalence
    data_source: str = ""  # where it came from, e.g. "dapo-math-17k" or "demo/modpow"

    def __post_init__(self) -> None:
        for name in ("id", "question", "answer", "data_source"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise DataError(
                    f"MathExample.{name} must be a string, got {type(value).__name__} {value!r}"
                )

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def refuse_surrogates(value: str, where: str, key: str) -> None:
    """A lone ``\\ud800``-style escape is valid JSON but no text: no tokenizer can encode it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(
            f"{where}: field {key!r} holds a lone surrogate escape "
            f"(\\u{ord(value[exc.start]):04x} at character {exc.start + 1}), which is not text; "
            "fix or drop that line"
        ) from None


def json_kind(value: Any) -> str:
    """What a decoded JSON/Parquet value is, for a message: ``a list``, ``the number 1.0``."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("nan", "NaN")
    if type(value) in (int, float):
        return f"the number {str(value)[:40]}"
    names = {dict: "an object", list: "a list", tuple: "a list", bool: "a boolean"}
    names[type(None)] = "null"
    return names.get(type(value), f"a {type(value).__name__}")


def text_field(value: Any, where: str, key: str, *, numbers: bool = False) -> str:
    """A non-empty text field of a data row, or one :class:`DataError` naming ``where`` and ``key``.

    With ``numbers`` (an answer), an integer or a finite float is accepted as its
    decimal text (``34``, ``0.5``); anything else that is not a string (a list, an
    object, a boolean, null, NaN, infinity) is refused, never turned into the
    answer ``"['0']"`` or ``"nan"`` that no model could match.
    """
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(f"{where}: field {key!r} is {json_kind(value)}, not an answer")
        value = str(value)
    if not isinstance(value, str):
        kind = "a string or a number" if numbers else "a string"
        raise DataError(f"{where}: field {key!r} must be {kind}, got {json_kind(value)}")
    if not value.strip():
        raise DataError(f"{where}: field {key!r} is empty")
    refuse_surrogates(value, where, key)
    return value


def id_field(value: Any, where: str, key: str) -> str:
    """A row's id: a non-empty string or an integer (not a boolean, float or list)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{where}: missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DataError(
            f"{where}: field {key!r} must be a string or integer, got {json_kind(value)}"
        )
    if isinstance(value, str):
        refuse_surrogates(value, where, key)
    return str(value)


def _example_from_record(record: Any, where: str) -> MathExample:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {json_kind(record)}")
    fields: dict[str, str] = {}
    for key in ("question", "answer"):
        value = record.get(key)
        if value is None:
            raise DataError(f"{where}: missing field {key!r}")
        fields[key] = text_field(value, where, key, numbers=key == "answer")
    raw_id = id_field(record.get("id"), where, "id")
    source = record.get("data_source")
    if source is None:
        source = ""
    if not isinstance(source, str):
        raise DataError(f"{where}: field 'data_source' must be a string, got {json_kind(source)}")
    return MathExample(
        id=raw_id, question=fields["question"], answer=fields["answer"], data_source=source
    )


def iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """``("path:line", record)`` per non-blank line; a bad line is a ``DataError`` there.

    Lines are decoded one by one, so a byte that is not UTF-8 is reported at
    its line and column, like a JSON error; a byte-order mark is skipped.
    """
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a JSON lines file")
    if path.exists() and not path.is_file():
        raise DataError(f"{path}: not a regular file (a device, FIFO or socket)")
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot open ({reason(exc)})") from None
    with handle:
        lineno = 0
        while True:
            try:
                raw = handle.readline()
            except OSError as exc:
                raise DataError(f"{path}:{lineno + 1}: cannot read ({reason(exc)})") from None
            if not raw:
                return
            lineno += 1
            where = f"{path}:{lineno}"
            line = decode_utf8(raw, str(path), first_line=lineno)  # strips a byte-order mark
            if not line.strip():
                continue
            try:
                yield where, json_loads(line, big_int_as_text=True)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc


def _iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from exc
    for row, record in enumerate(table.to_pylist(), start=1):
        yield f"{path}:{row}", record


def load_examples(path: str | os.PathLike[str]) -> list[MathExample]:
    """Read examples from a ``.jsonl``/``.json`` or ``.parquet`` file.

    Raises :class:`DataError` for a missing file, a malformed line, a missing or
    empty ``question``/``answer``, a duplicate id, or an empty file.
    """
    path = as_path(path, "load_examples(path)")
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a .jsonl or .parquet file")
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".json", ".ndjson"}:
        records: Iterable[tuple[str, Any]] = iter_jsonl(path)
    elif suffix in {".parquet", ".pq"}:
        records = _iter_parquet(path)
    else:
        raise DataError(f"{path}: unknown format {suffix!r}; use .jsonl or .parquet")
    examples: list[MathExample] = []
    first_seen: dict[str, str] = {}
    for where, record in records:
        example = _example_from_record(record, where)
        if example.id in first_seen:
            raise DataError(
                f"{where}: duplicate id {example.id!r} (first seen at {first_seen[example.id]})"
            )
        first_seen[example.id] = where
        examples.append(example)
    if not examples:
        raise DataError(f"{path}: contains no examples")
    return examples


def write_jsonl(path: str | os.PathLike[str], examples: Iterable[MathExample]) -> int:
    """Write examples atomically (:func:`retool.atomic.atomic_output`); how many were written.

    A file system error is one :class:`DataError` naming ``path``. Several
    files that must change together go through
    :func:`retool.data.files.staged_output`.
    """
    path = as_path(path, "write_jsonl(path)")
    count = 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path, encoding="utf-8") as handle:
            for example in examples:
                if not isinstance(example, MathExample):
                    raise DataError(
                        f"write_jsonl: item {count} is a {type(example).__name__}, "
                        "not a MathExample"
                    )
                handle.write(json.dumps(example.to_dict(), ensure_ascii=False) + "\n")
                count += 1
    except OSError as exc:
        raise DataError(f"{path}: cannot write it ({reason(exc)})") from None
    return count
