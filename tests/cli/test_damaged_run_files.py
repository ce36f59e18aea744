"""Small JSON files of a run or a checkpoint, damaged by hand: one line, never a traceback.

A careless user copies a run between machines, edits ``numerics.json`` to
"switch the sampler to int8", or truncates a checkpoint's
``retool_state.json`` / ``retool_sampler.json``. Each such file must be
refused as ``FILE: ... 'field' ...`` (exit 2, one line), before anything of
the run is rewritten, and never loaded as something else (``"['x']"`` as a
model name, ``"false"`` as true).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool.backends.local.service import LocalServiceClient, read_sampler_info
from retool.cli import main
from retool.data import load_dataset
from retool.diagnostics.doctor import diagnose
from retool.errors import BackendError
from retool.training.provenance import RunInputs, digest_records
from tests.cli.test_bad_input import _run, case
from tests.training.test_loop import write_config
from tests.training.test_run_dir_cli import fabricated_run

NUMERICS = {"requested": "auto", "sampler": "float32", "trainer": "float32"}


def _snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def resumable(tmp_path, monkeypatch):
    """A run directory ``train --resume`` would continue (two steps, checkpoints listed)."""
    from tests.training.test_loop import ROOT

    monkeypatch.syspath_prepend(str(ROOT))
    config = write_config(tmp_path)
    run = tmp_path / "run"
    inputs = RunInputs("rl", "demo:train", digest_records(load_dataset("demo:train")))
    fabricated_run(run, config, inputs)
    return config, run


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (["float32"], "expected a JSON object, got a list"),
        ({**NUMERICS, "sampler": "int8"}, "'sampler' is 'int8'"),
        ({**NUMERICS, "trainer": None}, "'trainer' is null"),
        ({"sampler": "float32", "trainer": "float32"}, "no 'requested' field"),
    ],
)
def test_train_resume_refuses_a_damaged_numerics_file_and_rewrites_nothing(
    resumable, capsys, content, says
):
    config, run = resumable
    (run / "numerics.json").write_text(json.dumps(content))
    before = _snapshot(run)
    argv = ["train", "--config", str(config), "--run-dir", str(run), "--resume", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("retool: error: "), err
    assert f"{run / 'numerics.json'}: unreadable" in err[0] and says in err[0]
    assert "Traceback" not in err[0]
    assert _snapshot(run) == before  # config.toml, the lock, the log: nothing rewritten


def test_doctor_reports_a_damaged_numerics_file_as_a_failed_row(resumable):
    config, run = resumable
    (run / "numerics.json").write_text(json.dumps({**NUMERICS, "sampler": "int8"}))
    report = diagnose(str(config), run_dir=str(run), sandbox=False, resume=True)
    (row,) = [c for c in report.checks if c.name == "numerics"]
    assert row.status == "fail" and "'sampler' is 'int8'" in row.detail
    assert not report.ok


STATE = {
    "format": 1,
    "base_model": "tiny-random",
    "lora": {"rank": 4, "alpha": 4, "target_modules": ["q_proj"]},
    "steps": 1,
}


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ([STATE], "not a JSON object"),
        ({**STATE, "base_model": ["tiny-random"]}, "'base_model' must be a model name"),
        ({**STATE, "lora": {**STATE["lora"], "rank": "4"}}, "'lora.rank' must be an integer"),
        ({**STATE, "lora": {**STATE["lora"], "rank": True}}, "'lora.rank' must be an integer"),
        ({**STATE, "lora": {**STATE["lora"], "target_modules": "q_proj"}}, "target_modules"),
        ({**STATE, "lora": [4]}, "'lora' must be an object or null"),
        ({k: v for k, v in STATE.items() if k != "lora"}, "no 'lora' field"),
        ({**STATE, "steps": "1"}, "'steps' must be an integer"),
    ],
)
def test_a_damaged_state_record_is_refused_before_a_model_loads(tmp_path, meta, says):
    (tmp_path / "retool_state.json").write_text(json.dumps(meta))
    service = LocalServiceClient(device="cpu", dtype="float32")
    with pytest.raises(BackendError) as caught:
        service.create_training_client_from_state(tmp_path)
    assert str(tmp_path / "retool_state.json") in str(caught.value)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("info", "says"),
    [
        ({"base_model": "tiny-random", "merged": "false"}, "'merged' must be true or false"),
        ({"base_model": ["tiny-random"], "merged": True}, "'base_model' must be a model name"),
        ({"base_model": "", "merged": True}, "'base_model' must be a model name"),
        (["tiny-random"], "not a JSON object"),
    ],
)
def test_a_damaged_sampler_record_is_refused(tmp_path, info, says):
    (tmp_path / "retool_sampler.json").write_text(json.dumps(info))
    with pytest.raises(BackendError, match=says):
        read_sampler_info(tmp_path)


def test_eval_of_saved_weights_with_a_damaged_record_is_one_line_and_writes_nothing(tmp_path):
    # before its "loading ..." note: the line on stderr is the error alone
    bad = json.dumps({"base_model": "tiny-random", "merged": "false"})
    item = case(
        "eval-damaged-sampler-record",
        "eval --model w --dataset demo --limit 1 --val-n 1 --output out.jsonl",
        "w/retool_sampler.json",
        "'merged' must be true or false",
        **{"w/retool_sampler.json": bad},
    )
    assert _run(tmp_path, item) is None
