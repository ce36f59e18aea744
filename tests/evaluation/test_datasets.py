"""Benchmark loaders: demo, JSONL, Parquet, a save_to_disk directory, and their errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retool.errors import DataError
from retool.evaluation import FieldNames, load_eval_examples


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def save_to_disk_layout(root, rows, shards=2):
    """The layout `datasets.Dataset.save_to_disk` writes: Arrow IPC stream shards,
    state.json listing them, dataset_info.json."""
    root.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    names = []
    size = -(-len(rows) // shards)
    for i in range(shards):
        name = f"data-{i:05d}-of-{shards:05d}.arrow"
        part = table.slice(i * size, size)
        with pa.OSFile(str(root / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(part)
        names.append(name)
    (root / "state.json").write_text(
        json.dumps(
            {
                "_data_files": [{"filename": n} for n in names],
                "_fingerprint": "abc",
                "_format_type": None,
                "_split": "test",
            }
        )
    )
    (root / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return root


def test_demo_splits_and_limit():
    test = load_eval_examples("demo")
    assert len(test) == 40 and test[0].id.startswith("demo-test-")
    assert [e.id for e in load_eval_examples("demo", limit=3)] == [e.id for e in test[:3]]
    assert load_eval_examples("demo:dev", limit=1)[0].id.startswith("demo-dev-")
    assert load_eval_examples("demo:train", limit=2)[1].id.startswith("demo-train-")
    with pytest.raises(DataError, match="--limit must be >= 1"):
        load_eval_examples("demo", limit=0)


def test_jsonl_with_problem_field_and_row_index_ids(tmp_path):
    path = _write_jsonl(
        tmp_path / "aime.jsonl",
        [{"problem": "What is 1+1?", "answer": 2}, {"problem": "What is 2+3?", "answer": "5"}],
    )
    examples = load_eval_examples(str(path))
    assert [(e.id, e.question, e.answer) for e in examples] == [
        ("0", "What is 1+1?", "2"),
        ("1", "What is 2+3?", "5"),
    ]
    assert load_eval_examples(str(path), limit=1) == examples[:1]


def test_jsonl_uses_id_field_when_present(tmp_path):
    path = _write_jsonl(
        tmp_path / "p.jsonl",
        [{"id": "p1", "question": "Q1", "answer": "1"}, {"id": 7, "question": "Q2", "answer": "2"}],
    )
    assert [e.id for e in load_eval_examples(str(path))] == ["p1", "7"]


def test_parquet_with_configured_fields(tmp_path):
    path = tmp_path / "bench.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"uid": "a", "prompt": "Compute 6*7.", "solution": "42"},
                {"uid": "b", "prompt": "Compute 2**10.", "solution": "1024"},
            ]
        ),
        path,
    )
    fields = FieldNames(question="prompt", answer="solution", id="uid")
    examples = load_eval_examples(str(path), fields)
    assert [(e.id, e.question, e.answer) for e in examples] == [
        ("a", "Compute 6*7.", "42"),
        ("b", "Compute 2**10.", "1024"),
    ]


def test_save_to_disk_directory(tmp_path):
    rows = [{"id": f"aime-{i}", "problem": f"Problem {i}", "answer": str(i)} for i in range(5)]
    root = save_to_disk_layout(tmp_path / "aime2025", rows)
    examples = load_eval_examples(str(root))
    assert [e.id for e in examples] == [f"aime-{i}" for i in range(5)]
    assert examples[3].question == "Problem 3" and examples[3].answer == "3"
    # A DatasetDict with one split is read as that split; with two, the error names them.
    parent = tmp_path / "dict"
    save_to_disk_layout(parent / "test", rows, shards=1)
    (parent / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
    assert len(load_eval_examples(str(parent))) == 5
    (parent / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(DataError, match="splits train, test"):
        load_eval_examples(str(parent))


def test_missing_field_names_the_file_and_its_fields(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "Q", "solution": "1"}])
    with pytest.raises(DataError) as info:
        load_eval_examples(str(path))
    message = str(info.value)
    assert "bad.jsonl:1" in message and "'question' or 'problem'" in message
    assert "prompt, solution" in message and "--question-field" in message
    with pytest.raises(DataError, match=r"no answer field 'answer'.*prompt, solution"):
        load_eval_examples(str(path), FieldNames(question="prompt"))
    with pytest.raises(DataError, match=r"no id field 'uid'"):
        load_eval_examples(str(path), FieldNames(question="prompt", answer="solution", id="uid"))
    table = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"q": "Q", "answer": "1"}]), table)
    with pytest.raises(DataError, match=r"bad.parquet row 1: no question field.*: q, answer"):
        load_eval_examples(str(table))
    root = save_to_disk_layout(tmp_path / "saved", [{"text": "Q", "answer": "1"}], shards=1)
    with pytest.raises(DataError, match=r"data-00000-of-00001.arrow row 1: .*: text, answer"):
        load_eval_examples(str(root))


def test_other_bad_datasets(tmp_path):
    with pytest.raises(DataError, match="no such file or directory"):
        load_eval_examples(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown format '.csv'"):
        load_eval_examples(str(tmp_path / "x.csv"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a datasets save_to_disk directory"):
        load_eval_examples(str(tmp_path / "empty"))
    dup = _write_jsonl(
        tmp_path / "dup.jsonl",
        [{"id": 1, "question": "a", "answer": "1"}, {"id": 1, "question": "b", "answer": "2"}],
    )
    with pytest.raises(DataError, match="duplicate id '1'"):
        load_eval_examples(str(dup))
    (tmp_path / "torn.jsonl").write_text('{"question": "a", "answer": "1"}\n{"quest')
    with pytest.raises(DataError, match="torn.jsonl:2: invalid JSON"):
        load_eval_examples(str(tmp_path / "torn.jsonl"))
