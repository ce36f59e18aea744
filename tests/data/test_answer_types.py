"""An answer of the wrong type, in every loader: refused at ``file:line`` and field.

Found by a careless user: a DAPO file whose ``reward_model.ground_truth`` was
a list became the answer ``"['0']"`` (no model ever writes that) and the
conversion exited 0. The class: any loader that turns a value into text with
``str()``. A list, an object, a boolean, null, NaN or infinity is no answer;
an integer or a finite float is its decimal text (a number column of a
Parquet file is legitimate). The same holds for the id (no float, list or
boolean ids) and ``data_source`` (a string or nothing).
"""

from __future__ import annotations

import io
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retool.data import load_examples
from retool.data.dapo import DAPO_PREFIX, prepare_dapo_math
from retool.errors import DataError
from retool.evaluation import load_eval_examples
from tests.cli.test_bad_input import _run, case


def _dapo_row(truth, index="id-0", source="math_dapo", content=None):
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content or f"{DAPO_PREFIX}\n\nWhat is 0 * 7?"}],
        "reward_model": {"ground_truth": truth, "style": "rule"},
        "extra_info": {"index": index},
    }


def _parquet(rows) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


BAD_TRUTHS = [
    (["0"], "a list"),
    ({"value": "0"}, "an object"),
    (True, "a boolean"),
    (math.nan, "NaN"),
    (math.inf, "inf"),
]


@pytest.mark.parametrize(("truth", "kind"), BAD_TRUTHS)
def test_dapo_ground_truth_that_is_no_answer_is_refused_and_nothing_written(tmp_path, truth, kind):
    raw = tmp_path / "raw.parquet"
    raw.write_bytes(_parquet([_dapo_row(truth)]))  # a Parquet column has one type
    out = tmp_path / "out"
    with pytest.raises(DataError) as caught:
        prepare_dapo_math(raw, out, dev_size=0)
    message = str(caught.value)
    assert message.startswith(f"{raw}:1: field 'reward_model.ground_truth'") and kind in message
    assert not out.exists()


def test_dapo_numbers_are_their_text_and_other_fields_are_checked(tmp_path):
    raw = tmp_path / "raw.parquet"
    for truths, expected in (([34, 35], ["34", "35"]), ([2.5, 1e-3], ["0.001", "2.5"])):
        raw.write_bytes(_parquet([_dapo_row(t, index=i) for i, t in enumerate(truths)]))
        prepare_dapo_math(raw, tmp_path / "out", dev_size=0)
        answers = [e.answer for e in load_examples(tmp_path / "out" / "train.jsonl")]
        assert sorted(answers) == expected
    for row, field in (
        (_dapo_row("1", index=1.5), "'extra_info.index'"),
        (_dapo_row("1", index=[1]), "'extra_info.index'"),
        (_dapo_row("1", source=["x"]), "'data_source'"),
        (_dapo_row("1", source=3), "'data_source'"),
    ):
        raw.write_bytes(_parquet([row]))
        with pytest.raises(DataError, match=rf"^{raw}:1: field {field} must be a string"):
            prepare_dapo_math(raw, tmp_path / "other", dev_size=0)


def test_the_dapo_command_refuses_a_list_answer_in_one_line(tmp_path):
    item = case(
        "prepare-dapo-list-answer",
        "prepare-data dapo-math --input raw.parquet --output-dir out --dev-size 0",
        "raw.parquet:1",
        "reward_model.ground_truth",
        "a list",
        **{"raw.parquet": _parquet([_dapo_row(["0"])])},
    )
    assert _run(tmp_path, item) is None


ROW = {"id": "q1", "question": "What is 2 + 2?", "answer": "4"}


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"answer": ["4"]}, "field 'answer' must be a string or a number, got a list"),
        ({"answer": {"value": 4}}, "field 'answer' must be a string or a number, got an object"),
        ({"answer": False}, "field 'answer' must be a string or a number, got a boolean"),
        ({"answer": math.nan}, "field 'answer' is NaN"),
        ({"answer": -math.inf}, "field 'answer' is -inf"),
        ({"question": 4}, "field 'question' must be a string, got the number 4"),
        ({"id": 1.0}, "field 'id' must be a string or integer, got the number 1.0"),
        ({"id": True}, "field 'id' must be a string or integer, got a boolean"),
        ({"data_source": 0}, "field 'data_source' must be a string, got the number 0"),
        ({"data_source": []}, "field 'data_source' must be a string, got a list"),
    ],
)
def test_jsonl_fields_of_the_wrong_type_name_line_and_field(tmp_path, changes, says):
    path = tmp_path / "data.jsonl"
    lines = [json.dumps({**ROW, "id": "q0"}), json.dumps({**ROW, **changes})]
    path.write_text("\n".join(lines) + "\n")  # json writes NaN / Infinity, as Python reads them
    with pytest.raises(DataError, match=rf"^{path}:2: "):
        load_examples(path)
    with pytest.raises(DataError) as caught:
        load_examples(path)
    assert says in str(caught.value)


def test_parquet_answers_of_the_wrong_type_are_refused_and_numbers_kept(tmp_path):
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist([{**ROW, "answer": ["4"]}]), path)
    with pytest.raises(DataError, match=rf"^{path}:1: field 'answer' .* got a list"):
        load_examples(path)
    pq.write_table(pa.Table.from_pylist([{**ROW, "answer": math.nan}]), path)
    with pytest.raises(DataError, match=rf"^{path}:1: field 'answer' is NaN"):
        load_examples(path)
    pq.write_table(
        pa.Table.from_pylist([{**ROW, "answer": 4}, {**ROW, "id": "q2", "answer": 5}]), path
    )
    assert [e.answer for e in load_examples(path)] == ["4", "5"]


def test_an_evaluation_set_with_a_nan_answer_is_refused(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps({**ROW, "answer": math.nan}) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:1: field 'answer' must be text or a finite"):
        load_eval_examples(str(path))
