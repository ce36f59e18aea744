"""What --model resolves to: aliases, directories, run directories and RUN_DIR@STEP."""

from __future__ import annotations

import json

import pytest

from retool.errors import ConfigError
from retool.evaluation import resolve_model_spec


def _sampler(path, merged=False):
    path.mkdir(parents=True)
    (path / "retool_sampler.json").write_text(
        json.dumps({"base_model": "tiny-random", "merged": merged})
    )
    return path


def fake_run(root, steps, relative_to=None):
    """A run directory with checkpoints of ``steps`` (sampler dirs only hold the marker)."""
    root.mkdir(parents=True)
    lines = []
    for step in steps:
        state = root / "checkpoints" / "state" / f"step_{step:06d}"
        state.mkdir(parents=True)
        sampler = _sampler(root / "checkpoints" / "sampler" / f"step_{step:06d}")
        recorded = sampler if relative_to is None else sampler.relative_to(relative_to)
        state_rec = state if relative_to is None else state.relative_to(relative_to)
        lines.append(
            {"step": step, "state_path": str(state_rec), "sampler_path": str(recorded), "time": 1.0}
        )
    (root / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return root


def test_aliases_and_directories(tmp_path):
    assert resolve_model_spec("tiny-random").kind == "alias"
    assert resolve_model_spec("smollm2-135m-instruct").path == "smollm2-135m-instruct"
    sampler = _sampler(tmp_path / "weights")
    spec = resolve_model_spec(str(sampler))
    assert (spec.kind, spec.path, spec.step) == ("sampler", str(sampler), None)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert resolve_model_spec(str(hf)).kind == "hf"


def test_run_directory_latest_and_step(tmp_path):
    run = fake_run(tmp_path / "run", [10, 20, 30])
    latest = resolve_model_spec(str(run))
    assert (latest.kind, latest.step) == ("run", 30)
    assert latest.path.endswith("sampler/step_000030")
    picked = resolve_model_spec(f"{run}@20")
    assert picked.step == 20 and picked.path.endswith("sampler/step_000020")


def test_run_directory_with_relative_paths_found_from_elsewhere(tmp_path, monkeypatch):
    run = fake_run(tmp_path / "runs" / "demo", [5], relative_to=tmp_path)
    monkeypatch.chdir(tmp_path / "runs")  # the recorded relative path no longer resolves
    spec = resolve_model_spec("demo")
    assert spec.step == 5 and (run / "checkpoints" / "sampler" / "step_000005").samefile(spec.path)


def test_missing_step_lists_the_available_ones(tmp_path):
    run = fake_run(tmp_path / "run", [10, 20])
    with pytest.raises(ConfigError, match=r"no checkpoint of step 15 .*available: 10, 20"):
        resolve_model_spec(f"{run}@15")
    with pytest.raises(ConfigError, match="the step after @ must be an integer"):
        resolve_model_spec(f"{run}@last")
    with pytest.raises(ConfigError, match="is not a run directory"):
        resolve_model_spec(f"{tmp_path}@3")
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "checkpoints.jsonl").write_text("")
    with pytest.raises(ConfigError, match="no complete checkpoint yet"):
        resolve_model_spec(str(empty))


def test_paths_that_are_not_models(tmp_path):
    stray = tmp_path / "notes.txt"
    stray.write_text("hello")
    with pytest.raises(ConfigError, match=r"not a model: expected a run directory"):
        resolve_model_spec(str(stray))
    with pytest.raises(ConfigError, match=r"not a model"):
        resolve_model_spec(str(tmp_path))
    with pytest.raises(ConfigError, match=r"no such file or directory, and not an alias"):
        resolve_model_spec("gpt-17")


def test_a_service_model_name_is_accepted_only_with_a_remote_backend():
    spec = resolve_model_spec("Qwen/Qwen3.5-4B", backend="pytrio")
    assert (spec.kind, spec.path) == ("service", "Qwen/Qwen3.5-4B")
    with pytest.raises(ConfigError, match="not an alias"):
        resolve_model_spec("Qwen/Qwen3.5-4B")
