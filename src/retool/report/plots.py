"""PNG plots of a run's metrics against step, of eval results, and the learning curve.

Design:

* matplotlib's object API with the Agg canvas (``Figure`` + ``FigureCanvasAgg``),
  never ``pyplot``: no global backend switch, no display, nothing left open
  between calls, so reports work headless and inside other programs.
* Each plot is declared as data (:data:`PLOTS`: panels of metric keys). A key a
  run never wrote is dropped; a panel with no key left is dropped; a plot with
  no panel left is not written, and the page lists it as "not recorded". That
  is how an SFT run (no rewards, no rollouts) or a run whose every update was
  skipped (no loss, no grad norm) get the plots they can have and no crash.
* A metric missing at some steps (the loss on a step whose update was skipped)
  is a gap (NaN), not a zero; every series has point markers so a single step
  still shows.
* Stacked panels (stop-reason shares, step time by phase) take every key with
  the prefix, keep those that are non-zero somewhere, and stack them.
* The learning curve (:func:`plot_learning_curve`) is the run's own held-out
  evaluations (``train.eval_every``: ``eval/step_*.jsonl``, step 0 where a run has
  one) as Average@N with its 95% interval per evaluated step, above the training
  batches' correct rate on the same step axis: whether RL is learning is the
  held-out curve, and the reward curve beside it tells learning from memorising.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.errors import require
from retool.report.inputs import EvalResult


@dataclass(frozen=True)
class Panel:
    """One axes: lines of ``keys``, or a stack of every key starting with ``prefix``."""

    title: str
    keys: tuple[tuple[str, str], ...] = ()  # (metric key, legend label)
    prefix: str | None = None  # stacked area of prefix* keys instead of lines
    exclude: tuple[str, ...] = ()  # keys left out of the stack
    ylabel: str = ""
    percent: bool = False  # values are fractions, shown on a 0..1 axis


@dataclass(frozen=True)
class PlotSpec:
    name: str  # file name without .png
    title: str
    panels: tuple[Panel, ...]


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        "reward",
        "Reward, correctness and format",
        (
            Panel(
                "per trajectory, mean over the batch",
                (
                    ("reward/mean", "reward (mean)"),
                    ("reward/correct", "correct"),
                    ("reward/format", "format (boxed answer)"),
                ),
            ),
        ),
    ),
    PlotSpec(
        "tool_use",
        "Code calls, turns, tool use and the policy's entropy",
        (
            Panel(
                "mean per trajectory",
                (("rollout/code_calls", "code calls"), ("rollout/turns", "assistant turns")),
            ),
            Panel(
                "share",
                (
                    ("rollout/tool_use_rate", "trajectories that ran code"),
                    ("rollout/valid_tool_call_rate", "calls that parsed"),
                    ("rollout/degenerate_group_rate", "groups scoring alike"),
                ),
                percent=True,
            ),
            Panel(
                "sampled tokens' mean -logprob (an entropy estimate)",
                (("rollout/sampled_nll", "nats per token"),),
                ylabel="nats",
            ),
        ),
    ),
    PlotSpec(
        "tokens",
        "Trajectory length",
        (
            Panel(
                "mean tokens per trajectory",
                (("rollout/trajectory_tokens", "trajectory tokens"),),
                ylabel="tokens",
            ),
        ),
    ),
    PlotSpec(
        "stop_reasons",
        "Why trajectories ended (share of the batch)",
        (Panel("stop reason share", prefix="stop/", percent=True),),
    ),
    PlotSpec(
        "sandbox",
        "Sandbox outcomes and latency",
        (
            Panel(
                "share of code calls",
                (
                    ("sandbox/success_rate", "success"),
                    ("sandbox/error_rate", "error"),
                    ("sandbox/timeout_rate", "timeout"),
                ),
                percent=True,
            ),
            Panel(
                "latency per call",
                (("sandbox/latency_p50_s", "p50"), ("sandbox/latency_p95_s", "p95")),
                ylabel="seconds",
            ),
        ),
    ),
    PlotSpec(
        "optimization",
        "Loss, clip fraction and gradient norm",
        (
            Panel("loss (sum)", (("train/loss:sum", "train/loss:sum"),)),
            Panel("clip fraction", (("train/clip_fraction", "clip fraction"),)),
            Panel("gradient norm (before clipping)", (("optim/grad_norm", "grad norm"),)),
        ),
    ),
    PlotSpec(  # training/numerics.py: sampler/trainer mismatch and rollout correction
        "numerics",
        "Sampler/trainer mismatch",
        (
            Panel("sampler_kl (log pi_sampler - log pi_trainer)", (("train/sampler_kl", "kl"),)),
            Panel(
                "share of loss tokens",
                (
                    ("train/sampler_clip_fraction", "ratio outside the clip range"),
                    ("train/correction_fraction", "truncated / masked by the correction"),
                ),
                percent=True,
            ),
        ),
    ),
    PlotSpec(
        "timing",
        "Step time by phase, sampling throughput and memory",
        (
            Panel("seconds per step", prefix="time/", exclude=("time/step_s",), ylabel="seconds"),
            Panel(
                "sampling throughput",
                (("rollout/tokens_per_s", "sampled tokens/s"),),
                ylabel="tokens / s",
            ),
            Panel(
                "driver process memory",
                (("memory/rss_gb", "resident after the step"), ("memory/peak_rss_gb", "peak")),
                ylabel="GB",
            ),
        ),
    ),
)


@dataclass(frozen=True)
class Plot:
    """A written PNG, or a plot that was skipped for lack of data."""

    name: str
    title: str
    path: Path | None  # None: nothing to draw
    missing: tuple[str, ...] = ()  # metric keys the run did not record


def _number(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return math.nan


def _present(metrics: Sequence[dict[str, Any]], key: str) -> bool:
    return any(not math.isnan(_number(m.get(key))) for m in metrics)


def _nonzero(metrics: Sequence[dict[str, Any]], key: str) -> bool:
    return any(_number(m.get(key)) != 0.0 and _present([m], key) for m in metrics)


def _panel_series(
    panel: Panel, metrics: Sequence[dict[str, Any]]
) -> tuple[list[tuple[str, str]], list[str]]:
    """The (key, label) pairs this panel can draw, and the keys it lacks."""
    if panel.prefix is not None:
        keys = sorted(
            {k for m in metrics for k in m if k.startswith(panel.prefix)} - set(panel.exclude)
        )
        drawn = [
            (k, k[len(panel.prefix) :].removesuffix("_s")) for k in keys if _nonzero(metrics, k)
        ]
        return drawn, ([] if keys else [f"{panel.prefix}*"])
    drawn = [(k, label) for k, label in panel.keys if _present(metrics, k)]
    return drawn, [k for k, _ in panel.keys if not _present(metrics, k)]


def _new_figure(rows: int, title: str) -> tuple[Any, Any]:
    figure_module = require("matplotlib.figure", "report")
    agg = require("matplotlib.backends.backend_agg", "report")
    figure = figure_module.Figure(figsize=(8.0, 2.9 * rows + 0.5), dpi=100, layout="constrained")
    agg.FigureCanvasAgg(figure)
    figure.suptitle(title, fontsize=12, fontweight="bold")
    return figure, figure.subplots(rows, 1, squeeze=False, sharex=True)[:, 0]


def _step_axis(ax: Any, steps: Sequence[float]) -> None:
    """Whole steps on the x axis, spanning the run even where a panel has one point."""
    ticker = require("matplotlib.ticker", "report")
    finite = [s for s in steps if not math.isnan(s)]
    if finite:
        low, high = min(finite), max(finite)
        pad = max((high - low) * 0.03, 0.5)
        ax.set_xlim(low - pad, high + pad)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))


def _finish_axes(ax: Any, title: str, ylabel: str, percent: bool) -> None:
    """Every panel's title, label, grid and legend (right of the axes); 0..1 for fractions."""
    if percent:
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)


def _draw_panel(
    ax: Any,
    panel: Panel,
    series: Sequence[tuple[str, str]],
    metrics: Sequence[dict[str, Any]],
    steps: Sequence[float],
) -> None:
    """``series`` (from :func:`_panel_series`) against ``steps``: lines, or a stack."""
    values = [[_number(m.get(k)) for m in metrics] for k, _ in series]
    if panel.prefix is not None:
        stacked = [[0.0 if math.isnan(v) else v for v in row] for row in values]
        labels = [label for _, label in series]
        if len(steps) > 1:
            ax.stackplot(steps, stacked, labels=labels, alpha=0.85)
        else:  # an area needs two steps; one step is a stacked bar
            bottom = 0.0
            for label, row in zip(labels, stacked, strict=True):
                ax.bar(steps, row, bottom=bottom, width=0.6, label=label, alpha=0.85)
                bottom += row[0]
    else:
        for (_, label), row in zip(series, values, strict=True):
            ax.plot(steps, row, marker="o", markersize=3, linewidth=1.5, label=label)
    _finish_axes(ax, panel.title, panel.ylabel, panel.percent)


def plot_metrics(metrics: Sequence[dict[str, Any]], output: Path) -> list[Plot]:
    """Write one PNG per :data:`PLOTS` entry that has data; returns all, written or not."""
    steps = [_number(m.get("step")) for m in metrics]
    plots: list[Plot] = []
    for spec in PLOTS:
        panels = []
        missing: list[str] = []
        for panel in spec.panels:
            series, lacks = _panel_series(panel, metrics)
            missing += lacks
            if series:
                panels.append((panel, series))
        if not panels:
            plots.append(Plot(spec.name, spec.title, None, tuple(missing)))
            continue
        figure, axes = _new_figure(len(panels), spec.title)
        for ax, (panel, series) in zip(axes, panels, strict=True):
            _draw_panel(ax, panel, series, metrics, steps)
        axes[-1].set_xlabel("step")
        _step_axis(axes[-1], steps)
        path = output / f"{spec.name}.png"
        figure.savefig(path)
        plots.append(Plot(spec.name, spec.title, path, tuple(missing)))
    return plots


def plot_evals(evals: Sequence[EvalResult], output: Path) -> Plot:
    """Grouped bars of Average@N, Pass@N and format rate per eval file, with 95% CIs."""
    title = "Evaluation: Average@N, Pass@N and format rate"
    measures = (
        ("Average@N", lambda e: (e.average, e.average_ci)),
        ("Pass@N", lambda e: (e.pass_at_n, e.pass_ci)),
        ("Format", lambda e: (e.format_rate, e.format_ci)),
    )
    if not evals:
        return Plot("eval", title, None)
    figure, (ax,) = _new_figure(1, title)
    figure.set_size_inches(max(8.0, 1.6 * len(evals) + 3), 4.2)
    width = 0.8 / len(measures)
    for offset, (name, get) in enumerate(measures):
        xs, heights, with_ci = [], [], []
        for index, result in enumerate(evals):
            value, ci = get(result)
            if value is None:
                continue
            x = index + (offset - (len(measures) - 1) / 2) * width
            xs.append(x)
            heights.append(value)
            if ci is not None:
                with_ci.append((x, value, max(value - ci[0], 0.0), max(ci[1] - value, 0.0)))
        if not xs:
            continue
        bars = ax.bar(xs, heights, width=width * 0.95, label=name)
        ax.bar_label(bars, labels=[f"{h:.2f}" for h in heights], fontsize=7, label_type="center")
        if with_ci:
            cx, cy, low, high = zip(*with_ci, strict=True)
            ax.errorbar(cx, cy, yerr=[low, high], fmt="none", ecolor="black", capsize=3)
    ax.set_xticks(range(len(evals)), [e.label for e in evals], rotation=15, ha="right")
    ax.set_ylim(0, 1.2)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("fraction (bars: 95% CI where the file has one)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", ncol=len(measures), frameon=False)
    path = output / "eval.png"
    figure.savefig(path)
    return Plot("eval", title, path)


LEARNING_TITLE = "Learning curve: held-out Average@N per evaluated step, and the training reward"
TRAINING_CORRECT = Panel(
    "training batches, mean over the batch",
    (("reward/correct", "correct (training batch)"),),
    ylabel="fraction correct",
    percent=True,
)


def plot_learning_curve(
    points: Sequence[tuple[int, EvalResult]], metrics: Sequence[dict[str, Any]], output: Path
) -> Plot:
    """``learning.png``: Average@N with its 95% CI at each evaluated step (``points``:
    the step an evaluation followed, and its result), above ``reward/correct`` by step."""
    shown = sorted((step, e) for step, e in points if e.average is not None)
    if not shown:
        return Plot("learning", LEARNING_TITLE, None, ("eval/step_*.jsonl: train.eval_every",))
    train, _ = _panel_series(TRAINING_CORRECT, metrics)
    figure, axes = _new_figure(2 if train else 1, LEARNING_TITLE)
    ax = axes[0]
    steps = [float(step) for step, _ in shown]
    values = [float(e.average or 0.0) for _, e in shown]
    below, above = [], []  # the 95% interval's distance from the point (0: none recorded)
    for value, (_, result) in zip(values, shown, strict=True):
        low, high = result.average_ci or (value, value)
        below.append(max(value - low, 0.0))
        above.append(max(high - value, 0.0))
    ax.errorbar(
        steps,
        values,
        yerr=[below, above],
        marker="o",
        markersize=4,
        linewidth=1.5,
        capsize=3,
        label="Average@N (95% CI)",
    )
    for step, value in zip(steps, values, strict=True):
        ax.annotate(f"{value:.2f}", (step, value), textcoords="offset points", xytext=(4, 4))
    _finish_axes(ax, "held-out evaluations (train.eval_every)", "fraction correct", True)
    axis_steps = list(steps)
    if train:
        metric_steps = [_number(m.get("step")) for m in metrics]
        _draw_panel(axes[1], TRAINING_CORRECT, train, metrics, metric_steps)
        axis_steps += metric_steps
    axes[-1].set_xlabel("step")
    _step_axis(axes[-1], axis_steps)
    path = output / "learning.png"
    figure.savefig(path)
    return Plot("learning", LEARNING_TITLE, path)
