"""``retool report``: plots, an offline HTML page and a trajectory viewer for one run.

:func:`write_report` reads a run directory (``retool train`` or ``retool sft``)
and any ``retool eval`` result files, and writes into ``<run>/report/`` (or
``output``)::

    reward.png, tool_use.png, tokens.png, stop_reasons.png, sandbox.png,
    optimization.png, timing.png      each against step, when the run has the metrics
    eval.png                          Average@N, Pass@N, format rate with CIs per eval file
    report.html                       everything above in one self-contained file

How it is split, and why:

* :mod:`retool.report.inputs` reads and *validates* before anything is written:
  a wrong argument (not a run directory, not an eval file, an output path that
  is a file) is a :class:`ReportError` with one line, and no half-report is
  left behind. The content of a valid run is read forgivingly: what a run did
  not record is left out of the report, never a crash.
* :mod:`retool.report.plots` draws with matplotlib's Agg canvas (headless,
  no global state); each plot is declared as data, so missing metrics just
  drop panels.
* :mod:`retool.report.viewer` turns rollout records into viewer data in Python
  (selection, turn splitting, token decoding), where it is tested, and keeps
  the page small (a cap on steps, questions and decoded tokens).
* :mod:`retool.report.page` renders one HTML file: inline CSS/JS, data URIs,
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
from typing import Any

from retool.errors import require
from retool.report.inputs import (
    EvalResult,
    ReportError,
    RunInputs,
    load_eval_file,
    load_run,
    unique_labels,
)

__all__ = ["EvalResult", "ReportError", "RunInputs", "load_eval_file", "load_run", "write_report"]


def _output_dir(run: RunInputs, output: str | os.PathLike[str] | None) -> Path:
    target = Path(output) if output is not None else run.path / "report"
    if target.exists() and not target.is_dir():
        raise ReportError(f"--output {target}: is a file; give a directory for the report")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"--output {target}: cannot create it ({exc.strerror})") from None
    return target


def _run_evals(run: RunInputs, notes: list[str]) -> list[EvalResult]:
    found = []
    for path in sorted((run.path / "eval").glob("step_*.jsonl")):
        number = path.stem[len("step_") :]
        label = f"step {int(number)}" if number.isdigit() else path.stem
        try:
            found.append(load_eval_file(path, label=label))
        except ReportError as exc:
            notes.append(f"skipped {path.name} in the run's eval directory: {exc}")
    return found


def write_report(
    run_dir: str | os.PathLike[str],
    eval_files: Sequence[str | os.PathLike[str]] = (),
    output: str | os.PathLike[str] | None = None,
    *,
    tokenizer: Any = None,
) -> Path:
    """Write the plots and ``report.html``; returns the path of ``report.html``.

    ``tokenizer`` decodes the viewer's tokens; by default the run's own
    (``model.base_model``) is loaded, and ``False`` colours whole messages by
    role instead. Raises :class:`ReportError` for bad inputs, before writing.
    """
    from retool.report.page import render_page
    from retool.report.plots import plot_evals, plot_metrics
    from retool.report.viewer import build_viewer

    run = load_run(run_dir)
    require("matplotlib", "report")  # before anything is written
    paths = [Path(p) for p in eval_files]
    evals = [
        load_eval_file(path, label) for path, label in zip(paths, unique_labels(paths), strict=True)
    ]
    target = _output_dir(run, output)
    notes: list[str] = []
    evals += _run_evals(run, notes)
    plots = plot_metrics(run.metrics, target)
    for plot in plots:  # a plot this run cannot draw must not survive from an older report
        if plot.path is None:
            (target / f"{plot.name}.png").unlink(missing_ok=True)
    eval_plot = plot_evals(evals, target)
    if eval_plot.path is None:
        (target / "eval.png").unlink(missing_ok=True)
    viewer = build_viewer(run, tokenizer)
    page = render_page(run, plots, evals, eval_plot, viewer.to_json(), notes)
    path = target / "report.html"
    tmp = target / f".report.html.tmp-{os.getpid()}"
    tmp.write_text(page, encoding="utf-8", errors="replace")
    os.replace(tmp, path)
    return path
