"""``report.html``: one self-contained file that works offline.

Design:

* **Self-contained.** CSS and JavaScript are inline, plots are PNG data URIs,
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
<style>{CSS}</style>
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
<script>{JS}</script>
</body>
</html>
"""


CSS = """
:root { --fg:#1d2330; --muted:#6b7385; --line:#d9dde5; --bg:#f6f7f9; --card:#fff;
  --loss:#c9f0d0; --loss-edge:#2e8b46; --noloss:#ffe3b0; --noloss-edge:#c07a00;
  --ctx:#eceef2; --ctx-edge:#9aa1ad; --code:#0f1724; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
  color:var(--fg); background:var(--bg); }
header { background:#1d2330; color:#fff; padding:14px 24px; position:sticky; top:0; z-index:5; }
header h1 { margin:0; font-size:20px; }
header .meta { margin:4px 0; color:#c9cfdb; font-size:12px; }
header code { color:#fff; }
nav a { color:#9cc4ff; margin-right:14px; font-size:13px; }
main { padding:8px 24px 40px; max-width:1400px; margin:0 auto; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:12px 18px; margin:14px 0; scroll-margin-top:90px; }
h2 { font-size:17px; margin:4px 0 10px; }
.muted { color:var(--muted); }
.warn { color:#b35c00; }
table.grid { border-collapse:collapse; font-size:13px; }
table.grid th, table.grid td { border-bottom:1px solid var(--line); padding:4px 10px;
  text-align:right; vertical-align:top; }
table.grid th[scope=row], table.grid td.path { text-align:left; }
table.grid th[scope=row] code { color:var(--muted); font-size:11px; margin-left:4px; }
pre { white-space:pre-wrap; word-break:break-word; margin:0;
  font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; }
pre.config { max-height:22em; overflow:auto; background:var(--bg); padding:8px;
  border-radius:6px; }
.plots { display:grid; grid-template-columns:repeat(auto-fill,minmax(560px,1fr)); gap:12px; }
figure { margin:0; }
figure img { max-width:100%; border:1px solid var(--line); border-radius:6px; background:#fff; }
figcaption { font-size:12px; margin-top:2px; }
.controls { display:flex; flex-wrap:wrap; gap:10px; align-items:center; margin-bottom:8px; }
.controls select { font-size:13px; padding:2px 4px; max-width:520px; }
ul.notes { font-size:12px; color:var(--muted); margin:6px 0; padding-left:18px; }
.question { background:var(--bg); border-radius:6px; padding:8px 12px; margin-bottom:10px; }
.question h3 { margin:0 0 4px; font-size:14px; }
table.members { margin-bottom:10px; }
table.members tr { cursor:pointer; }
table.members tr:hover td { background:#eef3ff; }
details.member { border:1px solid var(--line); border-radius:8px; margin:10px 0; }
details.member > summary { padding:6px 10px; background:var(--bg); border-radius:8px;
  cursor:pointer; font-weight:600; }
.badge { display:inline-block; font-weight:500; font-size:12px; padding:0 7px; margin-left:6px;
  border-radius:10px; background:#e3e7ef; }
.badge.good { background:#c9f0d0; } .badge.bad { background:#ffd5d5; }
.turns { padding:6px 12px; }
.turn { border-left:4px solid var(--ctx-edge); background:#fafbfc; margin:8px 0;
  padding:6px 10px; border-radius:0 6px 6px 0; }
.turn .label { font-size:11px; font-weight:700; text-transform:uppercase; letter-spacing:.04em;
  color:var(--muted); margin-bottom:3px; }
.turn-assistant.loss { border-left-color:var(--loss-edge); }
.turn-assistant.noloss { border-left-color:var(--noloss-edge); }
.turn-observation { background:#f3f6fb; }
.turn-observation.failed { border-left-color:#c33; }
pre.code { background:var(--code); color:#e6edf3; padding:8px; border-radius:6px; margin-top:6px; }
pre.code::before { content:"code"; display:block; color:#8b95a7; font-size:10px; }
.tokens { padding:4px 12px 10px; }
.tokstream { font:12px/1.7 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
  white-space:pre-wrap; word-break:break-word; max-height:40em; overflow:auto;
  border:1px solid var(--line); border-radius:6px; padding:6px; }
.tok { border-radius:2px; }
.tok.loss { background:var(--loss); } .tok.loss.alt { background:#aee3b9; }
.tok.noloss { background:var(--noloss); } .tok.noloss.alt { background:#ffd27f; }
.tok.ctx { background:var(--ctx); color:#4a5060; } .tok.ctx.alt { background:#dfe2e8; }
.legend .tok { padding:1px 5px; font-size:12px; }
button.unfold { font-size:11px; margin:0 4px 2px 0; border:1px dashed var(--ctx-edge);
  background:#fff; border-radius:4px; cursor:pointer; color:var(--muted); }
"""

JS = r"""
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("viewer-data").textContent);
  var stepSel = document.getElementById("step-select");
  var questionSel = document.getElementById("question-select");
  var output = document.getElementById("viewer-output");
  var notes = document.getElementById("viewer-notes");

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function num(x, signed) {
    if (typeof x !== "number" || !isFinite(x)) { return "-"; }
    var s = (Math.round(x * 1000) / 1000).toString();
    return signed && x > 0 ? "+" + s : s;
  }
  function yesno(x) { return x === true ? "\u2713" : x === false ? "\u2717" : "-"; }
  function badge(parent, text, cls) {
    parent.appendChild(el("span", "badge " + (cls || ""), text));
  }
  function findStep(n) {
    for (var i = 0; i < DATA.steps.length; i++) {
      if (DATA.steps[i].step === n) { return DATA.steps[i]; }
    }
    return null;
  }
  function findQuestion(step, slot) {
    for (var i = 0; i < step.questions.length; i++) {
      if (step.questions[i].slot === slot) { return step.questions[i]; }
    }
    return null;
  }
  function meanReward(q) {
    var sum = 0, n = 0;
    q.members.forEach(function (m) { if (typeof m.reward === "number") { sum += m.reward; n++; } });
    return n ? sum / n : null;
  }

  function renderTurn(turn, member, index) {
    var cls = "turn turn-" + turn.kind;
    if (turn.kind === "assistant") { cls += member.trains ? " loss" : " noloss"; }
    if (turn.kind === "observation" && turn.sandbox && turn.sandbox.ok === false) {
      cls += " failed";
    }
    var box = el("div", cls);
    box.setAttribute("data-kind", turn.kind);
    var label = turn.kind === "system" ? "system prompt" : turn.kind;
    if (turn.kind === "assistant") {
      label = "assistant turn " + index.assistant;
      if (turn.parse) { label += " \u00b7 " + turn.parse; }
      if (turn.parseError) { label += " (" + turn.parseError + ")"; }
    } else if (turn.kind === "observation") {
      label = "observation " + index.observation + " (" + turn.role + " message)";
      var sb = turn.sandbox;
      if (sb) {
        label += sb.ok ? " \u00b7 ok" : " \u00b7 " + (sb.error_kind || "failed");
        if (typeof sb.latency_s === "number") { label += " \u00b7 " + num(sb.latency_s) + " s"; }
        if (sb.truncated) { label += " \u00b7 truncated"; }
        if (sb.shared) { label += " \u00b7 shared result"; }
      }
    }
    box.appendChild(el("div", "label", label));
    if (turn.kind === "system") {
      var fold = el("details");
      fold.appendChild(el("summary", "muted", "show (" + turn.text.length + " characters)"));
      fold.appendChild(el("pre", "text", turn.text));
      box.appendChild(fold);
    } else {
      if (turn.text) { box.appendChild(el("pre", "text", turn.text)); }
      if (turn.code) { box.appendChild(el("pre", "code", turn.code)); }
    }
    return box;
  }

  function addPieces(container, cls, pieces, from, to) {
    for (var i = from; i < to; i++) {
      container.appendChild(el("span", cls + (i % 2 ? " alt" : ""), DATA.pieces[pieces[i]]));
    }
  }

  function renderTokens(member) {
    var wrap = el("details", "tokens");
    wrap.open = true;
    var stream = el("div", "tokstream");
    var total = 0, lossTokens = 0;
    member.segs.forEach(function (seg, index) {
      var role = seg[0], loss = seg[1], pieces = DATA.segments[seg[2]] || [];
      var cls = "tok " + (role === "assistant" ? (loss ? "loss" : "noloss") : "ctx");
      var from = 0;
      if (index === 0 && role === "context" && pieces.length > 48) {
        from = pieces.length - 16;  // the long first prompt starts folded
        var folded = el("span");
        var button = el("button", "unfold", "\u2026 show the " + from + " earlier prompt tokens");
        button.type = "button";
        button.addEventListener("click", function () {
          addPieces(folded, cls, pieces, 0, from);
          button.remove();
        });
        stream.appendChild(button);
        stream.appendChild(folded);
      }
      addPieces(stream, cls, pieces, from, pieces.length);
      total += pieces.length;
      if (loss) { lossTokens += pieces.length; }
    });
    wrap.appendChild(el("summary", "muted", "token view: " + total + " tokens, " + lossTokens +
      " carry loss (decoded one by one with the run's tokenizer; shading alternates per token)"));
    wrap.appendChild(stream);
    return wrap;
  }

  function renderMember(member, open) {
    var card = el("details", "member");
    card.id = "member-" + member.g;
    card.setAttribute("data-member", String(member.g));
    card.open = open;
    var head = el("summary", null, member.sft ? "conversation" : "member " + member.g);
    if (!member.sft) {
      var tone = member.reward > 0 ? "good" : member.reward < 0 ? "bad" : "";
      badge(head, "reward " + num(member.reward, true), tone);
      badge(head, "advantage " + num(member.advantage, true));
      badge(head, "stop: " + member.stop);
      badge(head, "correct " + yesno(member.correct), member.correct ? "good" : "");
      badge(head, "format " + yesno(member.format));
      badge(head, member.turnsCount + " turns, " + member.codeCalls + " code calls");
      if (member.tokens && typeof member.tokens.total === "number") {
        badge(head, member.tokens.total + " tokens");
      }
      if (member.answer !== null && member.answer !== undefined) {
        badge(head, "answer: " + member.answer);
      }
    }
    badge(head, member.trains ? "trains" : "no loss", member.trains ? "good" : "");
    card.appendChild(head);
    if (member.error) { card.appendChild(el("p", "warn", "error: " + member.error)); }
    var turns = el("div", "turns");
    var index = { assistant: 0, observation: 0 };
    member.turns.forEach(function (turn) {
      if (turn.kind === "assistant") { index.assistant++; }
      if (turn.kind === "observation") { index.observation++; }
      turns.appendChild(renderTurn(turn, member, index));
    });
    card.appendChild(turns);
    if (member.segs) { card.appendChild(renderTokens(member)); }
    return card;
  }

  function render(step, question, memberIndex) {
    output.textContent = "";
    var box = el("div", "question");
    var dot = " \u00b7 ";
    var title = "step " + step.step + dot + "question " + question.slot + dot + question.id;
    box.appendChild(el("h3", null, title));
    if (question.context && question.context.length) {  // the turns every member shares
      question.context.forEach(function (turn) { box.appendChild(renderTurn(turn, null, null)); });
    } else {
      box.appendChild(el("pre", "text", question.question));
    }
    if (question.reference !== null && question.reference !== undefined) {
      box.appendChild(el("div", "muted", "reference answer: " + question.reference));
    }
    output.appendChild(box);
    if (!question.members[0].sft && question.members.length > 1) {
      var table = el("table", "grid members");
      var head = el("tr");
      ["member", "reward", "advantage", "stop", "correct", "format", "turns", "code calls",
       "tokens", "loss"].forEach(function (h) { head.appendChild(el("th", null, h)); });
      table.appendChild(head);
      question.members.forEach(function (m) {
        var row = el("tr");
        [m.g, num(m.reward, true), num(m.advantage, true), m.stop, yesno(m.correct),
         yesno(m.format), m.turnsCount, m.codeCalls, m.tokens ? m.tokens.total : "-",
         m.trains ? "yes" : "no"].forEach(function (v) {
          row.appendChild(el("td", null, v === undefined || v === null ? "-" : v));
        });
        row.addEventListener("click", function () { select(step.step, question.slot, m.g, true); });
        table.appendChild(row);
      });
      output.appendChild(table);
    }
    question.members.forEach(function (m, i) {
      var open = memberIndex === null ? i < 4 : m.g === memberIndex;
      output.appendChild(renderMember(m, open));
    });
    document.body.setAttribute("data-viewer", "step-" + step.step + "-question-" + question.slot);
  }

  function fillQuestions(step) {
    questionSel.textContent = "";
    step.questions.forEach(function (q) {
      var label = "q" + q.slot + " \u00b7 " + q.id;
      var mean = meanReward(q);
      if (mean !== null) { label += " \u00b7 mean reward " + num(mean, true); }
      var option = el("option", null, label);
      option.value = String(q.slot);
      questionSel.appendChild(option);
    });
  }

  function select(stepNo, slot, member, scroll) {
    var step = findStep(stepNo) || DATA.steps[DATA.steps.length - 1];
    stepSel.value = String(step.step);
    fillQuestions(step);
    var question = findQuestion(step, slot) || step.questions[0];
    if (!question) { output.textContent = "This step has no trajectories."; return; }
    questionSel.value = String(question.slot);
    render(step, question, member);
    var hash = "#step=" + step.step + "&question=" + question.slot;
    if (member !== null) { hash += "&member=" + member; }
    try {
      if (location.hash !== hash) { history.replaceState(null, "", hash); }
    } catch (e) { /* some browsers refuse it for file: URLs; the fragment is a convenience */ }
    if (scroll) {
      var target = document.getElementById(member === null ? "viewer" : "member-" + member);
      if (target) { target.scrollIntoView(); }
    }
  }

  function fromHash(scroll) {
    var params = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (pair) {
      var kv = pair.split("=");
      if (kv.length === 2) {
        params[decodeURIComponent(kv[0])] = parseInt(decodeURIComponent(kv[1]), 10);
      }
    });
    var hasTarget = !isNaN(params.step) || !isNaN(params.question);
    var member = isNaN(params.member) || params.member === undefined ? null : params.member;
    select(params.step, params.question, member, scroll && hasTarget);
  }

  DATA.notes.forEach(function (n) { notes.appendChild(el("li", null, n)); });
  if (!DATA.steps.length) {
    output.textContent = "No trajectories to show.";
    stepSel.disabled = questionSel.disabled = true;
    return;
  }
  DATA.steps.forEach(function (s) {
    var option = el("option", null, "step " + s.step + " (" + s.questions.length + " questions)");
    option.value = String(s.step);
    stepSel.appendChild(option);
  });
  stepSel.addEventListener("change", function () {
    select(parseInt(stepSel.value, 10), null, null, false);
  });
  questionSel.addEventListener("change", function () {
    select(parseInt(stepSel.value, 10), parseInt(questionSel.value, 10), null, false);
  });
  function shift(delta) {
    var i = questionSel.selectedIndex + delta;
    if (i >= 0 && i < questionSel.options.length) {
      select(parseInt(stepSel.value, 10), parseInt(questionSel.options[i].value, 10), null, false);
    }
  }
  document.getElementById("prev-question").addEventListener("click", function () { shift(-1); });
  document.getElementById("next-question").addEventListener("click", function () { shift(1); });
  window.addEventListener("hashchange", function () { fromHash(true); });
  fromHash(true);
})();
"""
