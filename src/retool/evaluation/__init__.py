"""Evaluation: a benchmark sampled N times, its numbers with their uncertainty, comparisons.

``prepare_evaluation(...)`` checks the settings against an existing results
file before any model loads; ``evaluate(...)`` then runs one rollout batch
with ``group_size = n`` over the problems (tool mode with a sandbox, text
mode with ``sandbox=None``) and writes a resumable results file
(:mod:`~retool.evaluation.results`: a settings header, one row per sample
as it ends, a summary line).
``summarize(rows, n)`` turns sample rows into an :class:`EvalSummary`
(Average@N with a bootstrap interval over problems, unbiased pass@k, format
rate, behaviour and sandbox rates; :mod:`~retool.evaluation.summary`).
``compare(a, b)`` is the paired comparison of two files
(:mod:`~retool.evaluation.compare`); :mod:`~retool.evaluation.stats` holds
the estimators and says why they are these. ``retool eval`` is the command.

Modules: ``datasets`` (benchmark files: demo, JSONL, Parquet, save_to_disk),
``models`` (what ``--model`` names), ``results`` (the file format),
``runner`` (prepare_evaluation, evaluate), ``summary``, ``stats``, ``compare``, ``tables``.
"""

from typing import TYPE_CHECKING

# eager: the function ``compare`` shares its module's name (see retool/lazy.py)
from retool.evaluation.compare import Comparison, ProblemPair, compare
from retool.lazy import lazy_exports

if TYPE_CHECKING:
    from retool.evaluation.datasets import FieldNames, load_eval_examples
    from retool.evaluation.models import ModelSpec, resolve_model_spec
    from retool.evaluation.results import ROW_KEYS, EvalResults, load_results
    from retool.evaluation.runner import (
        PreparedEvaluation,
        check_resumable,
        eval_settings,
        evaluate,
        evaluate_async,
        prepare_evaluation,
    )
    from retool.evaluation.stats import bootstrap_ci, pass_at_k, sign_flip_p_value
    from retool.evaluation.summary import EvalSummary, summarize
    from retool.evaluation.tables import format_comparison, format_summary

# imported on first use (retool/lazy.py): importing one of this package's modules does
# not load all of them
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "FieldNames": ".datasets",
        "load_eval_examples": ".datasets",
        "ModelSpec": ".models",
        "resolve_model_spec": ".models",
        "ROW_KEYS": ".results",
        "EvalResults": ".results",
        "load_results": ".results",
        "PreparedEvaluation": ".runner",
        "check_resumable": ".runner",
        "eval_settings": ".runner",
        "evaluate": ".runner",
        "evaluate_async": ".runner",
        "prepare_evaluation": ".runner",
        "bootstrap_ci": ".stats",
        "pass_at_k": ".stats",
        "sign_flip_p_value": ".stats",
        "EvalSummary": ".summary",
        "summarize": ".summary",
        "format_comparison": ".tables",
        "format_summary": ".tables",
    },
)

__all__ = [
    "ROW_KEYS",
    "Comparison",
    "EvalResults",
    "EvalSummary",
    "FieldNames",
    "ModelSpec",
    "PreparedEvaluation",
    "ProblemPair",
    "bootstrap_ci",
    "check_resumable",
    "compare",
    "eval_settings",
    "evaluate",
    "evaluate_async",
    "format_comparison",
    "format_summary",
    "load_eval_examples",
    "load_results",
    "pass_at_k",
    "prepare_evaluation",
    "resolve_model_spec",
    "sign_flip_p_value",
    "summarize",
]
