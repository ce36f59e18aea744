import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retool.data import load_examples
from retool.data.dapo import DAPO_PREFIX, DAPO_SUFFIX, prepare_dapo_math, strip_dapo_wrapper
from retool.errors import DataError


def _row(index, question, answer):
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": f"{DAPO_PREFIX}\n\n{question}\n\n{DAPO_SUFFIX}"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": index},
    }


def _write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_strip_wrapper_keeps_leading_letters():
    # str.lstrip(prefix) would eat the "S" of "Suppose"; exact stripping must not.
    assert strip_dapo_wrapper(f"{DAPO_PREFIX}\n\nSuppose x=1.\n\n{DAPO_SUFFIX}") == "Suppose x=1."


def test_prepare_splits_and_dedupes(tmp_path):
    rows = [_row(f"id-{i}", f"Question {i}?", str(i)) for i in range(30)]
    rows += [_row("id-3", "Question 3?", "3")] * 2  # exact repeats, as in the published file
    raw = _write(tmp_path / "raw.parquet", rows)
    report = prepare_dapo_math(raw, tmp_path / "out", dev_size=5, seed=1)
    assert (report.rows, report.duplicates, report.train, report.dev) == (32, 2, 25, 5)
    train = load_examples(tmp_path / "out" / "train.jsonl")
    dev = load_examples(tmp_path / "out" / "dev.jsonl")
    assert not {e.id for e in train} & {e.id for e in dev}
    example = next(e for e in train + dev if e.id == "id-7")
    assert example.question == "Question 7?" and example.answer == "7"
    again = prepare_dapo_math(raw, tmp_path / "out2", dev_size=5, seed=1)
    assert again.dev == 5
    assert (tmp_path / "out" / "dev.jsonl").read_text() == (
        tmp_path / "out2" / "dev.jsonl"
    ).read_text()


def test_malformed_row_names_row_and_writes_nothing(tmp_path):
    rows = [_row("a", "Q?", "1"), _row("b", "Q2?", "2")]
    rows[1]["reward_model"] = {"ground_truth": "", "style": "rule"}
    raw = _write(tmp_path / "raw.parquet", rows)
    with pytest.raises(DataError, match=r"raw.parquet:2: 'reward_model.ground_truth'"):
        prepare_dapo_math(raw, tmp_path / "out", dev_size=1)
    assert not (tmp_path / "out").exists()


def test_conflicting_ids_and_bad_files(tmp_path):
    raw = _write(tmp_path / "raw.parquet", [_row("a", "Q?", "1"), _row("a", "Other?", "2")])
    with pytest.raises(DataError, match="already used by a different question"):
        prepare_dapo_math(raw, tmp_path / "out", dev_size=0)
    bad = tmp_path / "bad.parquet"
    bad.write_text(json.dumps({"not": "parquet"}))
    with pytest.raises(DataError, match="not a readable Parquet file"):
        prepare_dapo_math(bad, tmp_path / "out", dev_size=0)
    other = _write(tmp_path / "other.parquet", [{"question": "q"}])
    with pytest.raises(DataError, match="missing column"):
        prepare_dapo_math(other, tmp_path / "out", dev_size=0)
