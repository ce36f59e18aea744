"""``retool doctor``'s numerics row: a run's record, else the choice measured here."""

from __future__ import annotations

import json

from retool.backends.local.dtype import Numerics
from retool.config import load_config
from retool.diagnostics.doctor import check_numerics, model_shapes
from retool.training.numerics import NUMERICS_FILE


def test_numerics_row_shows_a_runs_record_or_measures_auto(tmp_path):
    recorded = Numerics("auto", "float32", "bfloat16", (), {"flags": "amx_bf16"})
    (tmp_path / NUMERICS_FILE).write_text(json.dumps(recorded.to_dict()))
    config = load_config(None, ["model.base_model=tiny-random"])
    row = check_numerics(config, str(tmp_path))
    assert row.status == "ok" and "recorded in" in row.detail and "trainer bfloat16" in row.detail
    measured = check_numerics(config, str(tmp_path / "new"))
    assert measured.status == "ok" and "auto:" in measured.detail and "rows" in measured.detail
    explicit = load_config(None, ["model.base_model=tiny-random", "model.dtype=bfloat16"])
    assert "model.dtype = bfloat16" in check_numerics(explicit, None).detail
    assert model_shapes("tiny-random").hidden == 64
    remote = load_config(None, ["model.backend=tinker", "model.base_model=Qwen/Qwen3-8B"])
    assert check_numerics(remote, None).status == "info"


def test_numerics_row_says_whether_the_trainer_compiles(monkeypatch):
    from retool.backends.local import compiled

    monkeypatch.setattr(compiled, "compiler_missing", lambda device: None)
    bf16 = load_config(None, ["model.base_model=tiny-random", "model.dtype=bfloat16"])
    assert check_numerics(bf16, None).detail.endswith("trainer compile on (auto: bf16 trainer)")
    fp32 = load_config(None, ["model.base_model=tiny-random", "model.dtype=float32"])
    assert check_numerics(fp32, None).detail.endswith("compile off (auto: trainer float32)")
    monkeypatch.setattr(compiled, "compiler_missing", lambda device: "no C++ compiler (g++)")
    forced = load_config(
        None, ["model.base_model=tiny-random", "model.dtype=float32", "model.compile=on"]
    )
    row = check_numerics(forced, None)
    assert row.status == "fail" and "model.compile = on, but no C++ compiler" in row.detail
