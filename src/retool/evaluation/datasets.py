"""Benchmark problems as users have them: the demo splits, JSONL, Parquet, ``save_to_disk``.

An evaluation set is a list of :class:`~retool.data.MathExample`. Unlike the
training loader (:func:`retool.data.load_examples`, which wants ``id``,
``question`` and ``answer``), benchmarks come in whatever shape they were
exported in, so field names are configurable:

* the question is ``question`` or else ``problem`` (or ``--question-field``);
* the answer is ``answer`` (or ``--answer-field``); numbers become strings;
* the id is ``id`` (or ``--id-field``) when a row has it, else the row's index
  (0-based). An explicitly named id field must be present in every row.

A HF ``datasets`` directory written by ``Dataset.save_to_disk`` is read
without the ``datasets`` package: its ``state.json`` lists ``data-*.arrow``
files in the Arrow IPC *stream* format, which pyarrow reads directly. A
``DatasetDict`` directory (``dataset_dict.json``) with one split is read as
that split; with several, the error names them (pass ``DIR/SPLIT``).

A missing field is one :class:`~retool.errors.DataError` naming the file
(and line) and the fields the row does have, so the fix is one flag away.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.checks import check_number
from retool.data import load_dataset
from retool.data.examples import MathExample, iter_jsonl, refuse_surrogates
from retool.errors import ConfigError, DataError

QUESTION_FIELDS = ("question", "problem")
ANSWER_FIELDS = ("answer",)
ID_FIELD = "id"


@dataclass(frozen=True)
class FieldNames:
    """Which row fields hold the question, the answer and the id (``None``: the defaults)."""

    question: str | None = None
    answer: str | None = None
    id: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"question": self.question, "answer": self.answer, "id": self.id}


def _rows_table(table: Any, where: str) -> Iterator[tuple[str, Any]]:
    for row, record in enumerate(table.to_pylist(), start=1):
        yield f"{where} row {row}", record


def _read_parquet(path: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None


def _read_arrow(path: Path) -> Any:
    import pyarrow as pa

    try:
        with pa.memory_map(str(path), "r") as source:
            try:
                return pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path}: not a readable Arrow file ({exc})") from None


def _saved_dataset_files(root: Path) -> list[Path]:
    """The ``data-*.arrow`` files of a ``save_to_disk`` directory, in order."""
    if (root / "dataset_dict.json").is_file():
        try:
            splits = json.loads((root / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            raise DataError(f"{root}/dataset_dict.json: not a datasets split list") from None
        if len(splits) != 1:
            raise DataError(
                f"{root}: a DatasetDict with splits {', '.join(map(str, splits))}; "
                f"pass one of them, e.g. --dataset {root / str(splits[0])}"
            )
        return _saved_dataset_files(root / str(splits[0]))
    state = root / "state.json"
    if state.is_file():
        try:
            files = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError):
            raise DataError(f"{state}: not a datasets state file (no _data_files)") from None
        paths = [root / name for name in files]
        for path in paths:
            if not path.is_file():
                raise DataError(f"{root}: state.json lists {path.name}, which is missing")
        return paths
    arrows = sorted(root.glob("data-*.arrow"))
    if arrows and (root / "dataset_info.json").is_file():
        return arrows
    raise DataError(
        f"{root}: a directory, but not a datasets save_to_disk directory "
        "(no state.json, dataset_dict.json or dataset_info.json with data-*.arrow files)"
    )


def _pick(record: dict[str, Any], wanted: str | None, defaults: tuple[str, ...]) -> str | None:
    """The field to read: the named one, or the first default the row has."""
    if wanted is not None:
        return wanted if wanted in record else None
    return next((name for name in defaults if name in record and record[name] is not None), None)


def _missing(where: str, what: str, names: str, record: dict[str, Any]) -> DataError:
    have = ", ".join(map(str, record)) or "none"
    return DataError(
        f"{where}: no {what} field {names}; the rows have the fields: {have} "
        f"(choose one with --{what}-field)"
    )


def _as_text(where: str, name: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        raise DataError(f"{where}: field {name!r} must be text or a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # "nan" is no answer
        raise DataError(f"{where}: field {name!r} must be text or a finite number, got {value!r}")
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        raise DataError(f"{where}: field {name!r} must be text, got {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{where}: field {name!r} is empty")
    refuse_surrogates(value, where, name)  # no tokenizer can encode it
    return value


def _examples(
    rows: Iterator[tuple[str, Any]], fields: FieldNames, source: str
) -> list[MathExample]:
    examples: list[MathExample] = []
    first_seen: dict[str, str] = {}
    for index, (where, record) in enumerate(rows):
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected an object, got {type(record).__name__}")
        q_name = _pick(record, fields.question, QUESTION_FIELDS)
        if q_name is None:
            names = repr(fields.question) if fields.question else "'question' or 'problem'"
            raise _missing(where, "question", names, record)
        a_name = _pick(record, fields.answer, ANSWER_FIELDS)
        if a_name is None:
            raise _missing(where, "answer", repr(fields.answer or "answer"), record)
        id_name = fields.id or ID_FIELD
        raw_id = record.get(id_name)
        if raw_id is None:
            if fields.id is not None:
                raise _missing(where, "id", repr(fields.id), record)
            raw_id = index
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
            raise DataError(f"{where}: field {id_name!r} must be a string or an integer")
        example_id = str(raw_id)
        if example_id in first_seen:
            raise DataError(
                f"{where}: duplicate id {example_id!r} (first seen at {first_seen[example_id]})"
            )
        first_seen[example_id] = where
        examples.append(
            MathExample(
                id=example_id,
                question=_as_text(where, q_name, record[q_name]),
                answer=_as_text(where, a_name, record[a_name]),
                data_source=source,
            )
        )
    return examples


def load_eval_examples(
    spec: str, fields: FieldNames | None = None, limit: int | None = None
) -> list[MathExample]:
    """The problems ``spec`` names, the first ``limit`` of them (see the module docstring).

    ``spec``: ``demo`` (the demo test split), ``demo:SPLIT``, a ``.jsonl`` /
    ``.json`` / ``.parquet`` file, or a ``save_to_disk`` directory.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise DataError(
            f"a dataset is demo, demo:SPLIT, a .jsonl/.parquet file or a save_to_disk "
            f"directory, got {spec!r}"
        )
    fields = fields or FieldNames()
    if not isinstance(fields, FieldNames):
        raise DataError(f"fields must be a FieldNames, got {fields!r}")
    if limit is not None:
        try:
            check_number("--limit", limit, 1, integer=True)
        except ConfigError as exc:
            raise DataError(str(exc)) from None
    if spec == "demo" or spec.startswith("demo:"):
        examples = load_dataset(spec)
        return examples[:limit]
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(
            f"{path}: no such file or directory (a dataset is demo, demo:SPLIT, a .jsonl or "
            ".parquet file, or a datasets save_to_disk directory)"
        )
    source = path.name
    if path.is_dir():
        files = _saved_dataset_files(path)

        def rows() -> Iterator[tuple[str, Any]]:
            for file in files:
                yield from _rows_table(_read_arrow(file), str(file))

        examples = _examples(rows(), fields, source)
    else:
        suffix = path.suffix.lower()
        if suffix in {".jsonl", ".json", ".ndjson"}:
            examples = _examples(iter_jsonl(path), fields, source)
        elif suffix in {".parquet", ".pq"}:
            examples = _examples(_rows_table(_read_parquet(path), str(path)), fields, source)
        else:
            raise DataError(
                f"{path}: unknown format {suffix!r}; use .jsonl, .parquet or a datasets "
                "save_to_disk directory"
            )
    if not examples:
        raise DataError(f"{path}: contains no problems")
    return examples[:limit]
