"""``evaluate`` and ``retool eval`` end to end on ``tiny-random`` (tiny budgets).

A random model rarely writes a tool call, so tool mode is exercised for its
plumbing (the sandbox is opened and passed; rows carry the sandbox counts);
the rollout's own tests cover tool calls. What is checked here is the file:
rows as samples end, the summary, resuming, refusing other settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from retool.config import RolloutConfig
from retool.errors import ConfigError
from retool.evaluation import (
    ROW_KEYS,
    evaluate,
    load_eval_examples,
    load_results,
    prepare_evaluation,
)
from tests.builders import scripted_rollout
from tests.evaluation.test_results import SUMMARY_KEYS

CONFIG = scripted_rollout(
    max_trajectory_tokens=1024,
    max_assistant_tokens=16,
    max_tool_response_tokens=64,
    max_assistant_turns=3,
    top_p=0.7,
)
TINY = (
    "--set",
    "rollout.max_assistant_tokens=16",
    "--set",
    "rollout.max_trajectory_tokens=1024",
    "--set",
    "rollout.max_tool_response_tokens=64",
    "--set",
    "rollout.max_assistant_turns=3",
)
RUN_CLI = "import sys, retool.cli as c\nsys.exit(c.main(sys.argv[1:]))\n"


def retool_eval(*args: str) -> int:
    """``retool eval ...`` in this process."""
    import retool.cli as cli

    return cli.main(["eval", *args])


class CountingSampler:
    """Wraps a sampler and records the prompts it was asked to continue, and their seeds."""

    def __init__(self, inner):
        self.inner = inner
        self.prompts: list[list[int]] = []
        self.seeds: dict[tuple[int, ...], list[int | None]] = {}
        self.max_context_tokens = inner.max_context_tokens

    def sample_async(self, prompt, num_samples, params):
        self.prompts.append(prompt.to_ints())
        self.seeds.setdefault(tuple(prompt.to_ints()), []).append(params.seed)
        return self.inner.sample_async(prompt, num_samples, params)


@pytest.fixture(scope="module")
def examples():
    return load_eval_examples("demo", limit=2)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_file(path: Path, n: int, problems: int, mode: str) -> dict:
    lines = _read(path)
    assert set(lines[0]) >= {"settings"}
    settings = lines[0]["settings"]
    assert settings["n"] == n and settings["mode"] == mode
    assert {"seed", "temperature", "top_p", "rollout"} <= set(settings)
    rows = lines[1:-1]
    assert len(rows) == n * problems
    for row in rows:
        assert tuple(row) == ROW_KEYS
    assert sorted((r["problem_index"], r["sample_index"]) for r in rows) == [
        (q, s) for q in range(problems) for s in range(n)
    ]
    summary = lines[-1]["summary"]
    assert set(summary) == SUMMARY_KEYS
    assert summary["samples"] == n * problems and summary["problems"] == problems
    return summary


def test_tool_mode_through_the_cli(tmp_path, capsys):
    out = tmp_path / "tool.jsonl"
    code = retool_eval(
        "--model", "tiny-random", "--dataset", "demo", "--val-n", "2", "--limit", "2",
        "--mode", "tool", "--output", str(out), "--no-progress", *TINY,
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "Average@2" in printed and "pass@1 (unbiased)" in printed and str(out) in printed
    _check_file(out, 2, 2, "tool")
    settings = load_results(out).settings
    assert settings["temperature"] == 1.0 and settings["top_p"] == 0.7  # eval defaults
    assert settings["sandbox"]["timeout"] > 0 and settings["limit"] == 2


def test_text_mode_rows_summary_and_resume(sampler, examples, tmp_path):
    tokenizer = sampler.get_tokenizer()
    settings = {"model": "tiny-random", "dataset": "demo"}
    full = tmp_path / "full.jsonl"
    seen = []
    evaluation = prepare_evaluation(examples, CONFIG, n=2, output=full, settings=settings,
                                    tools=False)  # fmt: skip
    uninterrupted = CountingSampler(sampler)
    summary = evaluate(uninterrupted, tokenizer, None, evaluation, progress=seen.append)
    data = _check_file(full, 2, 2, "text")
    assert data == json.loads(json.dumps(summary.to_dict()))
    assert len(seen) == 4 and all(r["sandbox_calls"] == 0 for r in _read(full)[1:-1])
    assert summary.wall_s > 0 and summary.tokens_per_s > 0
    assert load_results(full).settings["model"] == "tiny-random"
    lines = full.read_text().splitlines(keepends=True)
    rows = [json.loads(line) for line in lines[1:-1]]
    first = [i for i, r in enumerate(rows) if r["problem_index"] == 0]
    partial = next(i for i, r in enumerate(rows) if r["problem_index"] == 1)
    # Killed: problem 0 complete, one sample of problem 1, and a torn line.
    killed = tmp_path / "killed.jsonl"
    kept = [lines[1 + i] for i in sorted([*first, partial])]
    killed.write_text(lines[0] + "".join(kept) + lines[1 + partial][:25])
    counting = CountingSampler(sampler)
    evaluation = prepare_evaluation(examples, CONFIG, n=2, output=killed, settings=settings,
                                    tools=False)  # fmt: skip
    summary = evaluate(counting, tokenizer, None, evaluation)
    prompts = [tokenizer.decode(p) for p in counting.prompts]
    assert prompts and all(examples[1].question in p for p in prompts)
    assert not any(examples[0].question in p for p in prompts)
    after = [json.loads(line) for line in killed.read_text().splitlines()]
    new_rows = [r for r in after[1:-1] if r["session"] == 1]
    assert sorted((r["problem_index"], r["sample_index"]) for r in new_rows) == [(1, 0), (1, 1)]
    assert summary.samples == 4 and after[-1]["summary"]["samples"] == 4
    # The resumed problem kept its seeds: its requests are the uninterrupted run's, with the
    # same seeds. (Its tokens can still differ: it decodes alone, not beside problem 0, and
    # the engine's logits differ in their last bits with the batch; runner docstring.)
    assert counting.seeds and all(
        None not in seeds and uninterrupted.seeds[prompt] == seeds
        for prompt, seeds in counting.seeds.items()
    )
    # A finished file: nothing is sampled again; the summary is rewritten once.
    counting.prompts.clear()
    finished = prepare_evaluation(examples, CONFIG, n=2, output=killed, settings=settings,
                                  tools=False)  # fmt: skip
    evaluate(counting, tokenizer, None, finished)
    assert counting.prompts == []
    again = _read(killed)
    assert len(again) == 6 and sum("summary" in line for line in again) == 1


def test_resume_refuses_other_settings(sampler, examples, tmp_path):
    out = tmp_path / "r.jsonl"
    tokenizer = sampler.get_tokenizer()
    prepare_evaluation(examples[:1], CONFIG, n=1, output=out, settings={}, tools=False)
    assert not out.exists()  # preparing reads the file; only evaluate writes it
    evaluation = prepare_evaluation(examples[:1], CONFIG, n=1, output=out,
                                    settings={"model": "tiny-random"}, tools=False)  # fmt: skip
    evaluate(sampler, tokenizer, None, evaluation)
    before = out.read_bytes()
    hot = RolloutConfig(**{**CONFIG.__dict__, "temperature": 0.5})
    with pytest.raises(ConfigError, match=r"other settings: temperature \(1.0 -> 0.5\)"):
        prepare_evaluation(examples[:1], hot, n=1, output=out,
                           settings={"model": "tiny-random"}, tools=False)  # fmt: skip
    with pytest.raises(ConfigError, match=r"n \(1 -> 2\)"):
        prepare_evaluation(examples[:1], CONFIG, n=2, output=out,
                           settings={"model": "tiny-random"}, tools=False)  # fmt: skip
    with pytest.raises(ConfigError, match=r"model \(\"tiny-random\" -> \"other\"\)"):
        prepare_evaluation(examples[:1], CONFIG, n=1, output=out,
                           settings={"model": "other"}, tools=False)  # fmt: skip
    assert out.read_bytes() == before
    # an older file's rows lack problem_index: which problems and seeds they cover is unknown
    lines = [json.loads(line) for line in before.decode().splitlines()]
    for row in lines[1:]:
        row.pop("problem_index", None)
    out.write_text("".join(json.dumps(row) + "\n" for row in lines))
    older = out.read_bytes()
    with pytest.raises(ConfigError, match="no problem_index .* choose another --output"):
        prepare_evaluation(examples[:1], CONFIG, n=1, output=out,
                           settings={"model": "tiny-random"}, tools=False)  # fmt: skip
    assert out.read_bytes() == older


def _cli_subprocess(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUN_CLI, "eval", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_bad_inputs_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    # no stored Tinker login may make the remote-backend case pass for the wrong reason
    for name in ("TINKER_API_KEY", "TINKER_CREDENTIAL_CMD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    out = tmp_path / "out.jsonl"
    bad_data = tmp_path / "bad.jsonl"
    bad_data.write_text(json.dumps({"prompt": "Q", "solution": "1"}) + "\n")
    stray = tmp_path / "stray.txt"
    stray.write_text("x")
    base = ("--model", "tiny-random", "--dataset", "demo", "--output", str(out))
    cases = [
        (("--dataset", "demo", "--output", str(out)), "--model is required"),
        (("--model", "tiny-random", "--dataset", str(bad_data), "--output", str(out)),
         "no question field"),
        (("--model", str(stray), "--dataset", "demo", "--output", str(out)), "not a model"),
        (("--model", f"{tmp_path}@3", "--dataset", "demo", "--output", str(out)),
         "not a run directory"),
        ((*base, "--val-n", "0"), "--val-n must be >= 1"),
        ((*base, "--limit", "0"), "--limit must be >= 1"),
        ((*base, "--backend", "tinker"), "TINKER_API_KEY"),
        ((*base, "--set", "rollout.top_p=2"), "rollout.top_p must be in (0, 1]"),
        (("--model", "tiny-random", "--dataset", "demo", "--output", str(tmp_path)),
         "is a directory"),
        (("--model", "tiny-random", "--dataset", "demo", "--output", str(tmp_path / "x" / "o")),
         "does not exist"),
    ]  # fmt: skip
    for number, (args, message) in enumerate(cases):
        if number < 3:  # a real process: one line on stderr, no traceback
            done = _cli_subprocess(*args)
            code, err = done.returncode, done.stderr
        else:
            code, err = retool_eval(*args), capsys.readouterr().err
        assert code == 2, (args, err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("retool: error: ") and message in err, err
        assert not out.exists()
    # An --output that is not a results file (say, the dataset itself) is never overwritten.
    before = bad_data.read_bytes()
    assert (
        retool_eval("--model", "tiny-random", "--dataset", "demo", "--output", str(bad_data)) == 2
    )
    assert "cannot be continued" in capsys.readouterr().err and bad_data.read_bytes() == before
    compare_done = _cli_subprocess("compare", str(out), str(out))
    assert compare_done.returncode == 2 and "no such file" in compare_done.stderr
    assert compare_done.stderr.count("\n") == 1


def test_cli_refuses_changed_settings_before_loading(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    out.write_text(json.dumps({"settings": {"n": 2, "model": "something-else"}}) + "\n")
    before = out.read_bytes()
    code = retool_eval("--model", "tiny-random", "--dataset", "demo", "--val-n", "2",
                       "--output", str(out), "--limit", "1")  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "was written with other settings" in err and "something-else" in err
    assert out.read_bytes() == before


@pytest.mark.parametrize(
    ("toml", "extra", "temperature", "top_p"),
    [
        ("", (), 1.0, 0.7),  # the evaluation's own defaults
        ("[rollout]\ntop_p = 0.9\n", (), 1.0, 0.9),  # the file wins over them
        ("", ("--set", "rollout.temperature=0.5"), 0.5, 0.7),
        ("[rollout]\ntop_p = 0.9\n", ("--set", "rollout.top_p=0.8"), 1.0, 0.8),
        ("[rollout]\ntop_p = 0.9\n", ("--set", "rollout.top_p=0.8", "--top-p", "0.95"), 1.0, 0.95),
        ("[rollout]\ntemperature = 0.3\n", ("--temperature", "0.6"), 0.6, 0.7),
    ],
)
def test_cli_sampling_settings_resolve_flag_set_file_default(
    tmp_path, capsys, toml, extra, temperature, top_p
):
    """Read back from the refusal of a file with other settings: nothing loads."""
    config = tmp_path / "c.toml"
    config.write_text(toml)
    out = tmp_path / "o.jsonl"
    out.write_text(json.dumps({"settings": {"n": 12, "temperature": -1, "top_p": -1}}) + "\n")
    code = retool_eval("--model", "tiny-random", "--dataset", "demo", "--output", str(out),
                       "--limit", "1", "--config", str(config), *extra)  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"temperature (-1 -> {temperature})" in err, err
    assert f"top_p (-1 -> {top_p})" in err, err


def test_cli_compare(tmp_path, capsys):
    from tests.evaluation.synthetic import write_results

    a = write_results(tmp_path / "a.jsonl", {f"p{i}": 0 for i in range(6)}, n=2)
    b = write_results(tmp_path / "b.jsonl", {f"p{i}": 2 for i in range(6)}, n=2)
    assert retool_eval("compare", str(a), str(b)) == 0
    printed = capsys.readouterr().out
    assert "+100.0 points" in printed and "0.03125" in printed
    assert retool_eval("compare", str(a), str(b), "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["difference"] == 1.0 and len(data["solved_only_by_b"]) == 6
    assert retool_eval("--limit", "3", "compare", str(a), str(b)) == 2
    assert "belongs to `retool eval`" in capsys.readouterr().err
