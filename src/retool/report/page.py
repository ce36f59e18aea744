"""``report.html``: one self-contained file that works offline.

Design:

* **Self-contained.** CSS and JavaScript are inline (written from the package
  files ``assets/report.css`` and ``assets/report.js``), plots are PNG data URIs,
  fonts are the system's. Nothing is fetched, so the file can be mailed,
  archived next to the run, or opened on a machine without network.
* **No injection.** Text from the run (model output, observations, questions,
  the config, file names) reaches the page by exactly two routes:
  ``html.escape`` for the static parts, and a ``<script type="application/json">``
  block for the viewer data, in which ``<``, ``>`` and ``&`` are written as
  ``\\u003c``, ``\\u003e``, ``\\u0026`` (so ``</script>`` or ``<!--`` in model text
  cannot end the block) and every non-ASCII character is escaped too. The
  script reads that block with ``JSON.parse`` and builds the viewer with
  ``textContent`` only, never ``innerHTML``.
* **Deep links.** ``report.html#step=12&question=3&member=1`` opens the viewer
  on that trajectory; selecting one updates the fragment. That is also how the
  headless-browser test "clicks" to a trajectory.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from retool.report.inputs import EvalResult, RunInputs
from retool.report.plots import Plot

SUMMARY_KEYS = (
    ("reward/mean", "reward (mean)"),
    ("reward/correct", "correct"),
    ("reward/format", "format"),
    ("rollout/code_calls", "code calls / trajectory"),
    ("rollout/turns", "turns / trajectory"),
    ("rollout/trajectory_tokens", "tokens / trajectory"),
    ("sandbox/error_rate", "sandbox error rate"),
    ("train/loss:sum", "loss (sum)"),
    ("train/clip_fraction", "clip fraction"),
    ("optim/grad_norm", "grad norm"),
    ("time/step_s", "seconds / step"),
    ("rollout/tokens_per_s", "sampled tokens / s"),
)


def _asset(name: str) -> str:
    return (resources.files("retool.report") / "assets" / name).read_text(encoding="utf-8")


# The page's style sheet and viewer script: package data files (assets/), so an editor
# and a linter see CSS and JavaScript, and every report embeds the same text.
CSS = _asset("report.css")
JS = _asset("report.js")
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"


def esc(value: Any) -> str:
    """HTML-escape any value for text or a quoted attribute (NUL becomes U+FFFD)."""
    return html.escape(str(value).replace("\x00", "\ufffd"), quote=True)


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def script_json(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``."""
    text = json.dumps(_finite(data), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _png_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.4g}"
    return str(value)


def _is_finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _summary_table(metrics: Sequence[dict[str, Any]]) -> str:
    rows = []
    for key, label in SUMMARY_KEYS:
        values = [(m["step"], m[key]) for m in metrics if _is_finite(m.get(key))]
        if not values:
            continue
        numbers = [v for _, v in values]
        rows.append(
            f"<tr><th scope=row>{esc(label)} <code>{esc(key)}</code></th>"
            f"<td>{esc(_fmt(numbers[0]))}</td><td>{esc(_fmt(numbers[-1]))}</td>"
            f"<td>{esc(_fmt(min(numbers)))}</td><td>{esc(_fmt(max(numbers)))}</td></tr>"
        )
    if not rows:
        return "<p class=muted>No step has completed yet: metrics.jsonl is empty.</p>"
    return (
        "<table class=grid><thead><tr><th>metric</th><th>first step</th><th>last step</th>"
        "<th>min</th><th>max</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _plots_html(plots: Sequence[Plot]) -> str:
    figures, absent = [], []
    for plot in plots:
        if plot.path is None:
            keys = ", ".join(plot.missing) or "no data"
            absent.append(f"<li>{esc(plot.title)} <span class=muted>({esc(keys)})</span></li>")
            continue
        note = ""
        if plot.missing:
            note = f" <span class=muted>(not recorded: {esc(', '.join(plot.missing))})</span>"
        figures.append(
            f"<figure id='plot-{esc(plot.name)}'><img alt='{esc(plot.title)}' "
            f"src='{_png_uri(plot.path)}'><figcaption>{esc(plot.title)} "
            f"<span class=muted>{esc(plot.path.name)}</span>{note}</figcaption></figure>"
        )
    out = "<div class=plots>" + "".join(figures) + "</div>" if figures else ""
    if absent:
        out += (
            "<p class=muted>Not drawn, because this run did not record their metrics:</p><ul>"
            + "".join(absent)
            + "</ul>"
        )
    return out or "<p class=muted>No metrics to plot yet.</p>"


def _ci(value: float | None, ci: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    text = f"{value:.3f}"
    if ci is not None:
        text += f" <span class=muted>[{ci[0]:.3f}, {ci[1]:.3f}]</span>"
    return text


def _eval_html(evals: Sequence[EvalResult], plot: Plot | None) -> str:
    if not evals:
        return (
            "<p class=muted>No eval files. Pass <code>--eval FILE ...</code> (written by "
            "<code>retool eval</code>) to compare checkpoints here.</p>"
        )
    rows = []
    for e in evals:
        status = (
            ""
            if e.complete
            else " <span class=warn>(no summary yet: recomputed from its rows)</span>"
        )
        rows.append(
            f"<tr><th scope=row>{esc(e.label)}{status}</th><td>{esc(e.model or '-')}</td>"
            f"<td>{esc(_fmt(e.n))}</td><td>{esc(_fmt(e.problems))}</td>"
            f"<td>{esc(_fmt(e.samples))}</td>"
            f"<td>{_ci(e.average, e.average_ci)}</td><td>{_ci(e.pass_at_n, e.pass_ci)}</td>"
            f"<td>{_ci(e.format_rate, e.format_ci)}</td>"
            f"<td class=path>{esc(e.path)}</td></tr>"
        )
    table = (
        "<table class=grid id=eval-table><thead><tr><th>label</th><th>model</th><th>N</th>"
        "<th>problems</th><th>samples</th><th>Average@N [95% CI]</th><th>Pass@N</th>"
        "<th>Format</th><th>file</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
    if plot is not None and plot.path is not None:
        table += (
            f"<figure id=plot-eval><img alt='{esc(plot.title)}' src='{_png_uri(plot.path)}'>"
            f"<figcaption>{esc(plot.title)} <span class=muted>eval.png</span></figcaption></figure>"
        )
    return table


def render_page(
    run: RunInputs,
    plots: Sequence[Plot],
    evals: Sequence[EvalResult],
    eval_plot: Plot | None,
    viewer: dict[str, Any],
    notes: Sequence[str],
) -> str:
    """The whole page as one string."""
    name = run.path.resolve().name or str(run.path)
    steps = [m["step"] for m in run.metrics]
    meta = [
        f"run directory <code>{esc(run.path)}</code>",
        f"{len(steps)} completed steps" + (f" (last: {esc(steps[-1])})" if steps else ""),
        f"model <code>{esc(run.base_model or '?')}</code>",
        f"generated {esc(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}",
    ]
    notes_html = "".join(f"<li>{esc(n)}</li>" for n in [*run.notes, *notes])
    return f"""<!DOCTYPE html>
<html lang=en>
<head>
<meta charset=utf-8>
<meta name=viewport content="width=device-width, initial-scale=1">
<meta http-equiv=Content-Security-Policy content="{CSP}">
<title>retool report: {esc(name)}</title>
<style>
{CSS}</style>
</head>
<body>
<header>
<h1>retool report: {esc(name)}</h1>
<p class=meta>{" · ".join(meta)}</p>
<nav><a href="#summary">summary</a> <a href="#config">config</a> <a href="#plots">plots</a>
<a href="#eval">evaluation</a> <a href="#viewer">trajectories</a></nav>
</header>
<main>
<section id=summary><h2>Summary</h2>{_summary_table(run.metrics)}
{f"<ul class=notes>{notes_html}</ul>" if notes_html else ""}</section>
<section id=config><h2>Config</h2>
<details open><summary>config.toml</summary>
<pre class=config>{esc(run.config_text or "(none)")}</pre></details>
</section>
<section id=plots><h2>Metrics by step</h2>{_plots_html(plots)}</section>
<section id=eval><h2>Evaluation</h2>{_eval_html(evals, eval_plot)}</section>
<section id=viewer><h2>Trajectories</h2>
<div class=controls>
<label>step <select id=step-select></select></label>
<label>question <select id=question-select></select></label>
<button type=button id=prev-question>&larr;</button>
<button type=button id=next-question>&rarr;</button>
<span class=legend><span class="tok loss">carries loss</span>
<span class="tok noloss">sampled, no loss</span>
<span class="tok ctx">context (prompt, template, observation)</span></span>
</div>
<ul id=viewer-notes class=notes></ul>
<div id=viewer-output><p class=muted>The trajectory viewer needs JavaScript.</p></div>
</section>
</main>
<script type="application/json" id=viewer-data>{script_json(viewer)}</script>
<script>
{JS}</script>
</body>
</html>
"""
