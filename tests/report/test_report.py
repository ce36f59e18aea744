"""``write_report``: plots, a self-contained page, the viewer data, escaping, odd runs."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from retool.report import ReportError, load_eval_file, load_run, write_report
from retool.report.viewer import (
    OLDER_EVERY,
    RECENT_STEPS,
    TokenTable,
    build_turns,
    select_steps,
)
from retool.training.run_dir import read_rollouts
from tests.report.conftest import EVIL, EVIL_QUESTION

RUN_PLOTS = (
    "reward",
    "tool_use",
    "tokens",
    "stop_reasons",
    "sandbox",
    "optimization",
    "numerics",
    "timing",
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def viewer_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id=viewer-data>(.*?)</script>', page, re.S)
    assert match, "no viewer data block"
    return json.loads(match.group(1))


def decoded(data: dict, member: dict, role: str) -> str:
    return "".join(
        data["pieces"][p] for r, _, s in member["segs"] if r == role for p in data["segments"][s]
    )


def test_a_real_run_gets_every_plot_and_a_self_contained_page(real_run, real_report):
    assert real_report.name == "report.html"
    for name in RUN_PLOTS:
        png = real_report.parent / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC, name
    assert not (real_report.parent / "eval.png").exists()  # no eval files given
    page = real_report.read_text(encoding="utf-8")
    # Offline: nothing is fetched (no external src/href, stylesheet, import or font).
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert page.count("data:image/png;base64,") == len(RUN_PLOTS)
    config = (real_run / "config.toml").read_text()
    assert html.escape(config) in page and "tiny-random" in config
    assert "retool report: run" in page


def test_the_viewer_data_holds_every_trajectory_with_its_decoded_tokens(real_run, real_report):
    data = viewer_data(real_report.read_text(encoding="utf-8"))
    assert data["kind"] == "rl" and data["tokenColouring"]
    assert [s["step"] for s in data["steps"]] == [1, 2]
    records = list(read_rollouts(real_run / "rollouts" / "step_000002.jsonl.gz"))
    step = data["steps"][1]
    assert sum(len(q["members"]) for q in step["questions"]) == len(records) == 6
    for record in records:
        question = next(q for q in step["questions"] if q["slot"] == record["question_index"])
        member = next(m for m in question["members"] if m["g"] == record["group_index"])
        assert question["id"] == record["example_id"]
        assert member["reward"] == record["reward"] and member["stop"] == record["stop_reason"]
        assistant = [t for t in member["turns"] if t["kind"] == "assistant"]
        assert assistant[-1]["text"] == record["final_text"]
        # The sampled tokens, decoded one by one, give back the assistant text.
        assert decoded(data, member, "assistant") == record["final_text"]
        ids = sum(len(s["tokens"]) for s in record["segments"])
        pieces = sum(len(data["segments"][s]) for _, _, s in member["segs"])
        assert ids - 8 <= pieces <= ids  # one per token, but a split character is one piece
        loss = [flag for role, flag, _ in member["segs"] if role == "assistant"]
        assert all(loss) == (record["advantage"] != 0) == member["trains"]
    # A group's shared prompt is stored once, and so are its system prompt and question.
    first = [m["segs"][0][2] for m in step["questions"][0]["members"]]
    assert len(set(first)) == 1
    for question in step["questions"]:
        assert [t["kind"] for t in question["context"]] == ["system", "question"]
        assert all(m["turns"][0]["kind"] == "assistant" for m in question["members"])


def test_hostile_trajectory_text_is_escaped_everywhere(crafted_report):
    page = crafted_report.read_text(encoding="utf-8")
    assert page.count("<script") == 2 and page.count("</script>") == 2  # only our own
    assert "alert(" not in page.split("id=viewer-data>")[0]  # only inside the JSON data
    assert "<img src=x" not in page and "<b>" not in page and "<!--" not in page
    assert "\x00" not in page
    data = viewer_data(page)
    question = data["steps"][0]["questions"][0]
    assert question["question"] == EVIL_QUESTION
    evil = question["members"][1]
    text = next(t["text"] for t in evil["turns"] if t["kind"] == "assistant")
    assert text == EVIL.replace("\x00", "\ufffd")
    assert decoded(data, evil, "assistant") == text


def test_turns_split_code_and_pair_observations_with_their_sandbox_record(crafted_run):
    record = next(read_rollouts(crafted_run / "rollouts" / "step_000001.jsonl.gz"))
    from retool.protocol import get_protocol

    turns = build_turns(record, get_protocol("markdown").parse)
    assert [t["kind"] for t in turns] == [
        "system",
        "question",
        "assistant",
        "observation",
        "assistant",
    ]
    call = turns[2]
    assert call["text"] == "Let me compute it." and call["code"] == "print(6 * 7)"
    assert call["parse"] == "tool"
    assert turns[3]["text"] == "```output\n42\n```" and turns[3]["sandbox"]["ok"] is True
    assert turns[4]["parse"] == "answer" and "code" not in turns[4]


def test_missing_metrics_skip_plots_and_say_so(crafted_report):
    page = crafted_report.read_text(encoding="utf-8")
    written = {p.stem for p in crafted_report.parent.glob("*.png")}
    assert written == {"reward", "optimization", "timing"}  # what the metrics allow
    assert "Not drawn, because this run did not record their metrics" in page
    assert "sandbox/success_rate" in page  # listed as missing
    assert "not recorded: train/clip_fraction" in page  # a partial plot says what it lacks
    data = viewer_data(page)
    no_loss = data["steps"][0]["questions"][1]["members"]
    assert not any(m["trains"] for m in no_loss)
    failed = next(t for t in no_loss[0]["turns"] if t["kind"] == "observation")
    assert failed["sandbox"] == {
        "ok": False,
        "error_kind": "timeout",
        "latency_s": 0.25,
        "truncated": False,
        "shared": False,
    }


def test_an_sft_run_shows_conversations_and_its_loss(sft_run):
    page = write_report(sft_run).read_text(encoding="utf-8")  # default: RUN_DIR/report
    out = sft_run / "report"
    assert {p.stem for p in out.glob("*.png")} == {"optimization", "timing"}
    data = viewer_data(page)
    assert data["kind"] == "sft" and not data["tokenColouring"]
    (member,) = data["steps"][0]["questions"][0]["members"]
    assert member["sft"] and member["trains"]
    question = data["steps"][0]["questions"][0]
    assert [t["kind"] for t in question["context"]] == ["question"]
    kinds = [t["kind"] for t in member["turns"]]
    assert kinds == ["assistant", "observation", "assistant"]
    assert member["turns"][0]["code"] == "print(123 * 456)"
    assert any("SFT run" in note for note in data["notes"])


def test_a_run_without_steps_and_an_unloadable_tokenizer(crafted_run, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.toml").write_text('[model]\nbase_model = "tiny-random"\n[train]\n')
    page = write_report(empty).read_text(encoding="utf-8")
    assert "No step has completed yet" in page and not list((empty / "report").glob("*.png"))
    assert viewer_data(page)["steps"] == []
    # A model directory that is gone: whole messages coloured by role, and the page says why.
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "rollouts").mkdir()
    config = (crafted_run / "config.toml").read_text()
    (moved / "config.toml").write_text(config.replace('"tiny-random"', '"/nonexistent/model"'))
    for file in (crafted_run / "rollouts").iterdir():
        (moved / "rollouts" / file.name).write_bytes(file.read_bytes())
    data = viewer_data(write_report(moved).read_text(encoding="utf-8"))
    assert not data["tokenColouring"] and data["pieces"] == []
    assert all(m["segs"] is None for q in data["steps"][0]["questions"] for m in q["members"])
    assert any(
        "token colouring unavailable" in n and "/nonexistent/model" in n for n in data["notes"]
    )


def write_eval(path: Path, rows: list[tuple[str, bool]], summary: dict | None, model="m") -> Path:
    lines = [{"settings": {"model": model, "val_n": 2}}]
    for index, (problem, correct) in enumerate(rows):
        lines.append(
            {
                "problem_id": problem,
                "sample_index": index % 2,
                "correct": correct,
                "format": True,
                "turns": 2,
                "code_calls": 1,
                "tokens": 100,
                "stop_reason": "answer",
            }
        )
    if summary is not None:
        lines.append({"summary": summary})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


ROWS = [("p1", True), ("p1", False), ("p2", False), ("p2", False)]


def test_eval_files_give_a_table_and_a_chart_with_intervals(crafted_run, tmp_path):
    summary = {
        "average_at_n": 0.25,
        "average_at_n_ci": [0.0, 0.5],
        "pass_at_n": 0.5,
        "format_rate": 1.0,
        "n": 2,
    }
    base = write_eval(tmp_path / "base.jsonl", ROWS, summary, model="tiny-random")
    running = write_eval(tmp_path / "step100.jsonl", ROWS, None)  # no summary yet
    result = load_eval_file(running)
    assert not result.complete and result.average == 0.25 and result.pass_at_n == 0.5
    assert result.average_ci is None and result.n == 2 and result.problems == 2
    page = write_report(crafted_run, [base, running], tmp_path / "out").read_text()
    assert (tmp_path / "out" / "eval.png").read_bytes()[:8] == PNG_MAGIC
    assert "0.250 <span class=muted>[0.000, 0.500]</span>" in page
    assert "no summary yet" in page and "tiny-random" in page


def test_files_written_like_retool_eval_are_read(tmp_path):
    synthetic = pytest.importorskip("tests.evaluation.synthetic")  # retool eval's own rows
    summary = pytest.importorskip("retool.evaluation.summary")
    correct = {"p1": 2, "p2": 0, "p3": 1}
    path = synthetic.write_results(tmp_path / "ckpt.jsonl", correct, n=2, summary=False)
    running = load_eval_file(path)  # no summary line yet: recomputed with its summarize
    assert not running.complete and running.model == "ckpt"
    assert running.average == 0.5 and running.pass_at_n == pytest.approx(2 / 3)
    assert running.average_ci is not None and running.n == 2 and running.problems == 3
    rows = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    line = {"summary": summary.summarize(rows, 2).to_dict()}
    path.write_text(path.read_text() + json.dumps(line) + "\n")
    done = load_eval_file(path)
    assert done.complete and done.samples == 6
    assert (done.average, done.average_ci, done.pass_at_n, done.pass_ci, done.n) == (
        running.average,
        running.average_ci,
        running.pass_at_n,
        running.pass_ci,
        2,
    )


def test_step_selection_keeps_recent_steps_and_a_sample_of_older_ones():
    steps = list(range(1, 201))
    kept = select_steps(steps)
    assert kept[-RECENT_STEPS:] == steps[-RECENT_STEPS:]
    assert kept[:-RECENT_STEPS] == [1, *range(OLDER_EVERY, 151, OLDER_EVERY)]
    assert select_steps([3, 1, 2]) == [1, 2, 3]


def _text_size(step: dict) -> int:
    """A step's questions as the text budget measures them (JSON, without token views)."""
    questions = [
        {**q, "members": [{**m, "segs": None} for m in q["members"]]} for q in step["questions"]
    ]
    return sum(len(json.dumps(q)) for q in questions)


def test_page_budgets_drop_older_steps_and_token_views_and_say_so(crafted_run, monkeypatch):
    from retool.report import viewer

    newest = viewer.build_viewer(load_run(crafted_run)).to_json()["steps"][-1]
    # room for the newest step's text only; the first group decodes, then no more
    monkeypatch.setattr(viewer, "TEXT_BUDGET", _text_size(newest))
    monkeypatch.setattr(viewer, "TOKEN_BUDGET", 1)
    data = viewer.build_viewer(load_run(crafted_run)).to_json()
    assert [s["step"] for s in data["steps"]] == [2]
    assert any("1 older steps (up to step 1) are left out" in n for n in data["notes"])
    (question,) = data["steps"][0]["questions"]
    assert all(m["segs"] for m in question["members"])
    data = viewer.build_viewer(load_run(crafted_run), tokenizer=False).to_json()
    assert not data["tokenColouring"] and any("turned off" in n for n in data["notes"])


def test_multibyte_characters_split_across_tokens_are_merged(tokenizer):
    ids = tokenizer.encode("数学 ok")
    table = TokenTable(tokenizer)
    pieces = table.split(ids)
    assert "".join(pieces) == "数学 ok" and "\ufffd" not in "".join(pieces)
    assert len(pieces) < len(ids)  # 学 takes two tokens here


def test_bad_inputs_are_one_line_errors(crafted_run, tmp_path):
    other = tmp_path / "project"  # a config.toml of another program
    other.mkdir()
    (other / "config.toml").write_text('[tool]\nname = "x"\n')
    not_eval = tmp_path / "notes.jsonl"
    not_eval.write_text('{"hello": 1}\n')
    cases = [
        (lambda: write_report(tmp_path / "missing"), "no such directory"),
        (lambda: write_report(tmp_path), "is not a run directory"),
        (lambda: write_report(other), "is not a run directory"),
        (lambda: write_report(crafted_run, [tmp_path / "gone.jsonl"]), "no such file"),
        (lambda: write_report(crafted_run, [not_eval]), "not a `retool eval` result file"),
        (lambda: write_report(crafted_run, output=not_eval), "is a file"),
    ]
    for call, message in cases:
        with pytest.raises(ReportError, match=re.escape(message)) as caught:
            call()
        assert "\n" not in str(caught.value)


def test_viewer_json_cannot_close_its_script_block_and_has_no_nan():
    from retool.report.page import script_json

    text = script_json({"t": "</script><!-- \u2028 &", "x": float("nan"), "y": [float("inf")]})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"t": "</script><!-- \u2028 &", "x": None, "y": [None]}


def test_the_page_assets_are_embedded_whole_and_ship_as_package_data(crafted_report):
    """The style sheet and script are files of the package: a wheel carries them only
    if pyproject.toml declares them, so every file in assets/ must match a pattern."""
    import tomllib
    from fnmatch import fnmatch

    from retool.report import page
    from tests.report.conftest import ROOT

    text = crafted_report.read_text(encoding="utf-8")
    assert f"<style>\n{page.CSS}</style>" in text and f"<script>\n{page.JS}</script>" in text
    assert ":root {" in page.CSS and '"use strict";' in page.JS
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    declared = pyproject["tool"]["setuptools"]["package-data"]["retool.report"]
    assets = sorted(p.name for p in (Path(page.__file__).parent / "assets").iterdir())
    assert assets == ["report.css", "report.js"]
    assert all(any(fnmatch(f"assets/{name}", p) for p in declared) for name in assets)


def _long_run(tmp_path: Path, tokenizer, questions: int, chars: int) -> Path:
    """A run whose one step holds ``questions`` groups of two members, each writing
    ``chars`` characters: a step far over a small text budget."""
    from retool.config import load_config
    from retool.data.examples import MathExample
    from retool.training.run_dir import RunDirectory, config_to_toml
    from tests.report.conftest import _trajectory

    root = tmp_path / "long"
    root.mkdir()
    config = load_config(None, ['model.base_model="tiny-random"', "rollout.group_size=2"])
    (root / "config.toml").write_text(config_to_toml(config))
    run = RunDirectory(root)
    run.rollouts_dir.mkdir()
    records = []
    for slot in range(questions):
        example = MathExample(f"q{slot}", f"Question {slot}?", "1")
        for member in range(2):
            text = f"{slot}-{member} " + "x" * chars
            records.append(_trajectory(tokenizer, example, slot, member, [text], [], -1.0, 0.0))
    run.complete_step(1, {"reward/mean": -1.0}, records)
    return root


def test_the_text_budget_also_cuts_the_newest_step(tokenizer, tmp_path, monkeypatch):
    """One step of long trajectories can be many times the budget: its questions are
    embedded while they fit, and the page says how many were left out."""
    from retool.report import viewer

    run = load_run(_long_run(tmp_path, tokenizer, questions=16, chars=39_000))
    (whole,) = viewer.build_viewer(run, tokenizer=False).to_json()["steps"]
    monkeypatch.setattr(viewer, "TEXT_BUDGET", 200_000)
    assert _text_size(whole) > 5 * viewer.TEXT_BUDGET
    data = viewer.build_viewer(run, tokenizer=False).to_json()
    (step,) = data["steps"]
    assert 0 < len(step["questions"]) < 16 and _text_size(step) <= viewer.TEXT_BUDGET
    left = 16 - len(step["questions"])
    assert any(f"step 1: {left} questions are left out" in n for n in data["notes"])
    assert [q["slot"] for q in step["questions"]] == list(range(len(step["questions"])))


def test_a_damaged_rollouts_file_leaves_its_step_out_with_a_note(crafted_run, tmp_path):
    """A corrupted deflate block (zlib.error, which is no OSError), a torn gzip and a
    file that is not gzip: each step is left out with a note, the rest is reported."""
    import gzip
    import shutil

    run = tmp_path / "run"
    shutil.copytree(crafted_run, run, ignore=shutil.ignore_patterns("report"))
    path = run / "rollouts" / "step_000002.jsonl.gz"
    good = path.read_bytes()
    payload = gzip.decompress(good)
    cases = {
        "deflate": good[:10] + b"\xff" * 8 + good[18:],  # the first block: an invalid type
        "torn": good[: len(good) // 2],
        "not gzip": payload,
    }
    for name, damaged in cases.items():
        path.write_bytes(damaged)
        page = write_report(run, output=tmp_path / name).read_text(encoding="utf-8")
        data = viewer_data(page)
        assert [s["step"] for s in data["steps"]] == [1], name
        notes = [n for n in data["notes"] if n.startswith("step 2: rollouts file damaged")]
        assert len(notes) == 1 and "\n" not in notes[0], name


def test_eval_rows_with_unicode_line_breaks_are_read_whole(crafted_run, tmp_path):
    """Rows written before they were ASCII-escaped hold U+2028, U+2029, U+0085 and form
    feeds raw inside strings: a reader that split on them lost the file (--eval) or
    dropped the run's own evaluation from its report without a word."""
    import shutil

    odd = "a\u2028b\u2029c\x85d\x0ce\x1cf\u202eg"
    lines = [json.dumps({"settings": {"model": "m", "n": 2}})]
    for index, (problem, correct) in enumerate(ROWS):
        row = {"problem_id": problem, "sample_index": index % 2, "correct": correct}
        lines.append(json.dumps({**row, "final_text": odd, "answer": odd}, ensure_ascii=False))
    text = "\n".join(lines) + "\n"
    assert len(text.splitlines()) > len(lines)  # what str.splitlines would have made of it
    path = tmp_path / "legacy.jsonl"
    path.write_text(text, encoding="utf-8")
    result = load_eval_file(path)
    assert result.samples == 4 and result.average == 0.25 and result.complete is False
    run = tmp_path / "run"
    shutil.copytree(crafted_run, run, ignore=shutil.ignore_patterns("report"))
    (run / "eval").mkdir()
    shutil.copy(path, run / "eval" / "step_000002.jsonl")
    page = write_report(run, output=tmp_path / "out").read_text(encoding="utf-8")
    assert "<tr><th scope=row>step 2" in page and "skipped step_000002.jsonl" not in page


def _eval_file(path: Path, correct: list[bool]) -> Path:
    """A complete-enough eval file: 2 problems x 2 samples, ``correct`` in row order."""
    lines = [json.dumps({"settings": {"model": "m", "n": 2}})]
    for index, ok in enumerate(correct):
        row = {"problem_id": f"p{index // 2}", "sample_index": index % 2, "correct": ok}
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_learning_curve_is_the_runs_own_evaluations_by_step(crafted_run, tmp_path):
    """step 0 (the starting policy) and step 2, out of order on disk, plus a damaged one:
    the curve is drawn from the two it can read, the page says which it skipped."""
    import shutil

    from retool.report.plots import plot_learning_curve

    run = tmp_path / "run"
    shutil.copytree(crafted_run, run, ignore=shutil.ignore_patterns("report"))
    page = write_report(run, output=tmp_path / "none").read_text(encoding="utf-8")
    assert "id='plot-learning'" not in page and "train.eval_every" in page  # not recorded
    (run / "eval").mkdir()
    _eval_file(run / "eval" / "step_000002.jsonl", [True, True, True, False])
    _eval_file(run / "eval" / "step_000000.jsonl", [False, False, True, False])
    (run / "eval" / "step_000001.jsonl").write_text("not json\n", encoding="utf-8")
    out = tmp_path / "out"
    page = write_report(run, output=out).read_text(encoding="utf-8")
    assert (out / "learning.png").stat().st_size > 0
    assert "id='plot-learning'" in page and "skipped step_000001.jsonl" in page
    assert page.index("id='plot-learning'") < page.index("id='plot-reward'")  # shown first
    # what the curve draws: each readable step's Average@N, in step order
    results = [(s, load_eval_file(run / "eval" / f"step_{s:06d}.jsonl")) for s in (2, 0)]
    assert [r.average for _, r in sorted(results)] == [0.25, 0.75]
    drawn = plot_learning_curve(results, [], tmp_path)
    assert drawn.path == tmp_path / "learning.png" and drawn.missing == ()
    empty = plot_learning_curve([], [], tmp_path / "nowhere")
    assert empty.path is None and "train.eval_every" in empty.missing[0]
