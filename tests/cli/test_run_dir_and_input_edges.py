"""Bad input the CLI refuses in one line, and run directories reused, moved or damaged.

Each test is one case beside the bad-input table (``test_bad_input.py``) and the
run-directory tests (``tests/training/test_run_dir*.py``):

* bad input that still ended in a traceback or ran on: a lone surrogate in an
  evaluation set or an SFT conversation (the training loader refused it, these
  did not), a ``problem_index`` of the wrong type in a results file, a line
  break in a ``--set`` value (the keys after it were silently ignored), a
  damaged ``inputs.json``, an absurd ``model.lora_rank`` (no upper bound);
* the run directory: a new run (no ``--resume``) over a killed attempt reused
  the attempt's journaled samples, drawn with other settings; a user's own
  ``config.toml`` kept in the ``--run-dir`` was silently replaced; a moved run
  could not be resumed with ``train.run_dir`` naming its new place; a manifest
  line without ``time``, a metrics line with a damaged cost count and a
  ``config.toml`` holding a 5000-digit integer were tracebacks; a failed atomic
  write (a full disk) left its partial temporary file behind.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from retool.config import CostConfig, load_config
from retool.data import load_dataset
from retool.errors import RetoolError
from retool.report.inputs import load_run
from retool.training import run_dir as run_dir_module
from retool.training.cost import SpendLedger
from retool.training.provenance import RunInputs, digest_records
from retool.training.run_dir import RunDirectory, config_to_toml
from tests.builders import TINY_RUN, run_toml
from tests.cli.test_bad_input import RETOOL, _run, case

ROOT = Path(__file__).resolve().parents[2]
TINY = run_toml(TINY_RUN)
SURROGATE_QUESTION = '{"id": 1, "question": "What is \\ud800 2 + 2?", "answer": "4"}\n'
SURROGATE_CONVERSATION = json.dumps(
    {
        "id": "c1",
        "messages": [
            {"role": "user", "content": "What is \ud800 2 + 2?"},
            {"role": "assistant", "content": "It is \\boxed{4}."},
        ],
    }
)
RESULTS_HEADER = json.dumps({"settings": {"n": 1}, "format": "retool-eval/1"}) + "\n"
TEXT_INDEX = RESULTS_HEADER + json.dumps(
    {"problem_id": "a", "problem_index": "x", "sample_index": 0, "correct": True}
)
# A resumable-looking run whose inputs.json was hand-edited ("kind" is no run kind).
DAMAGED_INPUTS = {
    "run/config.toml": config_to_toml(load_config()),  # the defaults: as `train` resolves
    "run/metrics.jsonl": '{"step": 1}\n',
    "run/inputs.json": json.dumps({"format": 1, "kind": 3, "data": None, "init_from": None}),
}

CASES = [
    case("eval-dataset-surrogate",
         "eval --model tiny-random --dataset s.jsonl --output o.jsonl --val-n 1",
         "s.jsonl:1", "'question'", "surrogate", **{"s.jsonl": SURROGATE_QUESTION}),
    case("sft-data-surrogate", "sft --data d.jsonl --run-dir r --config c.toml",
         "d.jsonl:1", "content", "surrogate",
         **{"d.jsonl": SURROGATE_CONVERSATION + "\n", "c.toml": TINY}),
    case("compare-problem-index-text", "eval compare p.jsonl p.jsonl", "p.jsonl:2",
         "'problem_index'", "an integer", **{"p.jsonl": TEXT_INDEX}),
    case("set-lora-rank-absurd", "train --set model.lora_rank=1000000000000",
         "model.lora_rank", "<= 4096"),  # was a failed 256 TB allocation's traceback
    case("set-value-with-a-line-break", "train --set 'train.steps=1\nrollout.group_size=0'",
         "--set train.steps", "one value on one line"),
    case("resume-inputs-damaged", "train --run-dir run --resume", "run/inputs.json", "'kind'",
         "damaged", **DAMAGED_INPUTS),
    case("run-dir-holds-the-users-config", "train --config exp/config.toml --run-dir exp",
         "exp/config.toml", "no run wrote", **{"exp/config.toml": "# my notes\n" + TINY}),
]  # fmt: skip


@pytest.mark.parametrize("item", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, item):
    problem = _run(tmp_path, item)
    assert problem is None, problem


# -- the run directory ---------------------------------------------------------------------


def _inputs() -> RunInputs:
    return RunInputs("rl", "demo:train", digest_records(load_dataset("demo:train")))


def _fabricated(path: Path, config_text: str, steps: int = 2) -> Path:
    """A run directory with ``steps`` committed steps and checkpoints (empty directories)."""
    config_file = path.with_suffix(".toml")
    config_file.write_text(config_text)
    run = RunDirectory.open(path, load_config(config_file), resume=False, inputs=_inputs())
    for step in range(1, steps + 1):
        run.complete_step(step, {"x": 1.0}, [])
        name = f"step_{step:06d}"
        for kind in ("state", "sampler"):
            (run.checkpoint_root / kind / name).mkdir(parents=True)
        state, sampler = (str(run.checkpoint_root / kind / name) for kind in ("state", "sampler"))
        run.add_checkpoint(step, state, sampler)
    run.close()
    return config_file


def _retool(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    if "RETOOL_KILL_AT" not in env:
        environment.pop("RETOOL_KILL_AT", None)
    return subprocess.run(
        [*RETOOL, *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow  # two short training runs
def test_a_new_run_over_a_killed_attempt_reuses_none_of_its_samples(tmp_path):
    from tests.training.test_loop import CONFIG  # group_size 4, the even-length reward

    (tmp_path / "run.toml").write_text(CONFIG)
    args = ("train", "--config", "run.toml", "--run-dir", "run", "--no-progress")
    killed = _retool(tmp_path, *args, RETOOL_KILL_AT="journal:1:5")  # one whole group journaled
    assert killed.returncode == -9, killed.stderr
    # Not a --resume: a new run with other sampling settings over the attempt.
    again = _retool(tmp_path, *args, "--set", "rollout.temperature=0.5", "--set", "train.steps=1")
    assert again.returncode == 0, again.stderr
    metrics = RunDirectory(tmp_path / "run").metrics()
    assert [m["step"] for m in metrics] == [1]
    assert metrics[0]["train/reused_groups"] == 0  # was 1: sampled at temperature 1.0


def test_a_moved_run_resumes_with_train_run_dir_naming_its_new_place(tmp_path):
    first, moved = tmp_path / "first", tmp_path / "moved"
    config_file = _fabricated(first, run_toml(TINY_RUN, train={"run_dir": str(first)}))
    first.rename(moved)
    config = load_config(config_file, [f"train.run_dir={json.dumps(str(moved))}"])
    run = RunDirectory.open(moved, config, resume=True, inputs=_inputs())
    try:
        assert run.last_checkpoint() is not None and run.completed_at_open == 2
    finally:
        run.close()


def test_a_manifest_line_without_its_time_is_still_a_checkpoint(tmp_path):
    config_file = _fabricated(tmp_path / "run", TINY)
    manifest = tmp_path / "run" / "checkpoints.jsonl"
    records = [json.loads(line) for line in manifest.read_text().splitlines()]
    manifest.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "time"}) + "\n" for r in records)
    )
    assert [r.step for r in RunDirectory(tmp_path / "run").checkpoints()] == [1, 2]
    run = RunDirectory.open(tmp_path / "run", load_config(config_file), True, inputs=_inputs())
    run.close()


def test_a_damaged_cost_count_in_metrics_is_one_error_naming_the_file_and_step():
    lines = [{"step": 1, "cost/prefill_tokens": 5}, {"step": 2, "cost/prefill_tokens": None}]
    with pytest.raises(RetoolError, match=r"^run/metrics.jsonl: step 2: cost/prefill_tokens"):
        SpendLedger.from_metrics(CostConfig(), lines, "run/metrics.jsonl")
    assert SpendLedger.from_metrics(CostConfig(), lines[:1]).total.prefill == 5


def test_report_of_a_run_whose_config_holds_an_oversized_integer(tmp_path):
    _fabricated(tmp_path / "run", TINY)
    config = tmp_path / "run" / "config.toml"
    config.write_text(re.sub(r"(?m)^steps = \d+$", "steps = " + "9" * 5000, config.read_text()))
    run = load_run(tmp_path / "run")  # was a ValueError traceback from tomllib
    assert run.config == {} and [m["step"] for m in run.metrics] == [1, 2]
    assert any("5000 digits" in note for note in run.notes), run.notes


def test_a_failed_atomic_write_leaves_the_file_and_no_temporary(tmp_path, monkeypatch):
    _fabricated(tmp_path / "run", TINY)
    run = RunDirectory(tmp_path / "run")
    before = run.metrics_path.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_dir_module.os, "fsync", full)
    with pytest.raises(OSError):
        run.rewind(1)
    monkeypatch.undo()
    assert run.metrics_path.read_bytes() == before
    assert not [p.name for p in run.path.iterdir() if ".tmp-" in p.name]
