"""Public functions of data, evaluation and report refuse bad arguments by name.

A ``None``, a number where a path goes, a string where a number goes: each
is a :class:`~retool.errors.RetoolError` (a ``ValueError`` too) whose message
names the argument, never a bare ``TypeError`` or ``AttributeError`` from
deep inside.
"""

from __future__ import annotations

import pytest

from retool.data import MathExample, batch_indices, load_dataset, load_examples, write_jsonl
from retool.errors import RetoolError
from retool.evaluation import (
    bootstrap_ci,
    compare,
    load_eval_examples,
    load_results,
    pass_at_k,
    resolve_model_spec,
    summarize,
)
from retool.report import write_report

CASES = [
    (lambda: load_examples(None), "load_examples(path)"),
    (lambda: load_examples(3), "load_examples(path)"),
    (lambda: load_examples(""), "load_examples(path) must not be empty"),
    (lambda: load_dataset(None), "a dataset is"),
    (lambda: write_jsonl(None, []), "write_jsonl(path)"),
    (lambda: MathExample(1, "q", "a"), "MathExample.id must be a string"),
    (lambda: MathExample("1", None, "a"), "MathExample.question"),
    (lambda: MathExample("1", "q", 2), "MathExample.answer"),
    (lambda: batch_indices(5, "2", 0, 0), "batch_size must be an integer"),
    (lambda: batch_indices(5, 2, -1, 0), "step must be >= 0"),
    (lambda: batch_indices(5, 2, 0.5, 0), "step must be an integer"),
    (lambda: load_eval_examples(None), "a dataset is"),
    (lambda: load_eval_examples("demo", limit="3"), "--limit must be an integer"),
    (lambda: load_eval_examples("demo", fields="question"), "fields must be a FieldNames"),
    (lambda: load_results(None), "load_results(path)"),
    (lambda: compare(None, "b.jsonl"), "compare(a_path)"),
    (lambda: pass_at_k("5", 2, 1), "pass_at_k n must be an integer"),
    (lambda: pass_at_k(5, 6, 1), "0 <= c <= n"),
    (lambda: bootstrap_ci([0.5, float("nan")]), "finite"),
    (lambda: bootstrap_ci([0.5], level=2), "bootstrap_ci level"),
    (lambda: summarize([], 0), "summarize n must be >= 1"),
    (lambda: resolve_model_spec(None), "--model must be a string"),
    (lambda: resolve_model_spec("a\0b"), "NUL"),
    (lambda: write_report(None), "write_report(run_dir)"),
]


@pytest.mark.parametrize("call, message", CASES, ids=[m for _, m in CASES])
def test_bad_arguments_are_named(call, message):
    with pytest.raises((RetoolError, ValueError)) as caught:
        call()
    assert message in str(caught.value)


def test_write_jsonl_refuses_what_is_not_an_example(tmp_path):
    path = tmp_path / "x.jsonl"
    with pytest.raises(RetoolError, match="item 1 is a dict, not a MathExample"):
        write_jsonl(path, [MathExample("1", "q", "a"), {"id": "2"}])
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone, nothing replaced
