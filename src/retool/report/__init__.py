"""``retool report``: plots, an offline HTML page and a trajectory viewer for one run.

:func:`write_report` reads a run directory (``retool train`` or ``retool sft``)
and any ``retool eval`` result files, and writes into ``<run>/report/`` (or
``output``)::

    learning.png                      the learning curve: the run's own held-out
                                      evaluations (train.eval_every) by step, with CIs,
                                      above the training batches' correct rate
    reward.png, tool_use.png, tokens.png, stop_reasons.png, sandbox.png,
    optimization.png, timing.png      each against step, when the run has the metrics
    eval.png                          Average@N, Pass@N, format rate with CIs per eval file
    report.html                       everything above in one self-contained file

How it is split, and why:

* :mod:`retool.report.inputs` reads and *validates* before anything is written:
  a wrong argument (not a run directory, not an eval file, an output path that
  is a file) is a :class:`ReportError` with one line. The files are written
  into a staging directory and renamed into place together
  (:func:`retool.data.files.staged_output`), so a failure or an interrupt
  leaves an older report as it was, never half replaced. The content of a
  valid run is read forgivingly: what a run did not record is left out of
  the report, never a crash.
* :mod:`retool.report.plots` draws with matplotlib's Agg canvas (headless,
  no global state); each plot is declared as data, so missing metrics just
  drop panels.
* :mod:`retool.report.viewer` turns rollout records into viewer data in Python
  (selection, turn splitting, token decoding), where it is tested, and keeps
  the page small (a cap on steps, questions and decoded tokens).
* :mod:`retool.report.page` renders one HTML file: inline CSS/JS (from
  ``assets/report.css`` and ``assets/report.js``, package data), data URIs,
  and no path for trajectory text into the page except escaped text and
  escaped JSON read with ``textContent``.

Eval files found in the run's own ``eval/`` directory (written by evaluation
during training, ``eval/step_*.jsonl``) are added to the evaluation table
after the ``--eval`` files; a damaged one is skipped with a note.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from retool.data.files import as_path, check_output_dir, staged_output
from retool.errors import require
from retool.report.inputs import (
    EvalResult,
    ReportError,
    RunInputs,
    load_eval_file,
    load_run,
    unique_labels,
)
from retool.report.page import render_page
from retool.report.plots import plot_evals, plot_learning_curve, plot_metrics
from retool.report.viewer import build_viewer

if TYPE_CHECKING:
    from retool.types import Tokenizer

__all__ = ["EvalResult", "ReportError", "RunInputs", "load_eval_file", "load_run", "write_report"]


def _run_evals(run: RunInputs, notes: list[str]) -> list[tuple[int | None, EvalResult]]:
    """The run's own evaluations (``eval/step_*.jsonl``), each with its step (None: a
    file whose name holds no step number)."""
    found: list[tuple[int | None, EvalResult]] = []
    for path in sorted((run.path / "eval").glob("step_*.jsonl")):
        number = path.stem[len("step_") :]
        step = int(number) if number.isdigit() else None
        label = f"step {step}" if step is not None else path.stem
        try:
            found.append((step, load_eval_file(path, label=label)))
        except ReportError as exc:
            notes.append(f"skipped {path.name} in the run's eval directory: {exc}")
    return found


def write_report(
    run_dir: str | os.PathLike[str],
    eval_files: Sequence[str | os.PathLike[str]] = (),
    output: str | os.PathLike[str] | None = None,
    *,
    tokenizer: Tokenizer = None,
) -> Path:
    """Write the plots and ``report.html``; returns the path of ``report.html``.

    ``tokenizer`` decodes the viewer's tokens; by default the run's own
    (``model.base_model``) is loaded, and ``False`` colours whole messages by
    role instead. Raises :class:`ReportError` for bad inputs, before writing.
    """
    run = load_run(as_path(run_dir, "write_report(run_dir)"))
    target = as_path(output, "write_report(output)") if output is not None else run.path / "report"
    check_output_dir(target, flag="--output", error=ReportError)
    require("matplotlib", "report")  # before anything is written
    if isinstance(eval_files, str | os.PathLike):
        eval_files = [eval_files]  # one file, not its characters
    paths = [as_path(p, "write_report(eval_files)") for p in eval_files]
    evals = [
        load_eval_file(path, label) for path, label in zip(paths, unique_labels(paths), strict=True)
    ]
    notes: list[str] = []
    own = _run_evals(run, notes)
    evals += [result for _, result in own]
    curve = [(step, result) for step, result in own if step is not None]
    viewer = build_viewer(run, tokenizer)
    with staged_output(target, flag="--output", names=["report.html"], error=ReportError) as out:
        plots = [
            plot_learning_curve(curve, run.metrics, out.staging),
            *plot_metrics(run.metrics, out.staging),
        ]
        # a plot this run cannot draw must not survive from an older report
        out.remove += [f"{plot.name}.png" for plot in plots if plot.path is None]
        eval_plot = plot_evals(evals, out.staging)
        if eval_plot.path is None:
            out.remove.append("eval.png")
        page = render_page(run, plots, evals, eval_plot, viewer.to_json(), notes)
        out.path("report.html").write_text(page, encoding="utf-8", errors="replace")
    return target / "report.html"
