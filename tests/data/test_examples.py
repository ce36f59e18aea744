import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retool.data import MathExample, load_examples, write_jsonl
from retool.errors import DataError


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_jsonl_and_parquet_round_trip(tmp_path):
    examples = [MathExample("a", "1+1?", "2", "x"), MathExample("b", "2+2?", "4")]
    write_jsonl(tmp_path / "d.jsonl", examples)
    assert load_examples(tmp_path / "d.jsonl") == examples
    pq.write_table(pa.Table.from_pylist([e.to_dict() for e in examples]), tmp_path / "d.parquet")
    assert load_examples(tmp_path / "d.parquet") == examples


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"id": "a", "question": "q", "answer": "1"}', "{not json"], r"d.jsonl:2: invalid JSON"),
        (['{"id": "a", "answer": "1"}'], r"d.jsonl:1: missing field 'question'"),
        (['{"id": "a", "question": "  ", "answer": "1"}'], r"d.jsonl:1: field 'question' is empty"),
        (['{"id": "a", "question": "q", "answer": ""}'], r"d.jsonl:1: field 'answer' is empty"),
        (
            [
                '{"id": "a", "question": "q", "answer": "1"}',
                '{"id": "a", "question": "r", "answer": "2"}',
            ],
            r"d.jsonl:2: duplicate id 'a' \(first seen at .*d.jsonl:1\)",
        ),
        (["[1, 2]"], r"d.jsonl:1: expected a JSON object"),
    ],
)
def test_malformed_jsonl(tmp_path, lines, message):
    path = _write(tmp_path / "d.jsonl", lines)
    with pytest.raises(DataError, match=message):
        load_examples(path)


def test_numeric_answers_are_accepted(tmp_path):
    path = _write(tmp_path / "d.jsonl", [json.dumps({"id": 3, "question": "q", "answer": 12})])
    assert load_examples(path) == [MathExample("3", "q", "12")]


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_examples(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("x")
    with pytest.raises(DataError, match="unknown format"):
        load_examples(tmp_path / "d.csv")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="contains no examples"):
        load_examples(tmp_path / "e.jsonl")
