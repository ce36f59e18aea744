"""``retool train`` with ``sampler.engine = "vllm"``: two RL steps in each sync mode,
and ``train.eval_every`` after step 2 sampled by the same engine.

Each run starts its own engine (20-60 s on a loaded 2-core host: the slow part).
The rollout checks every sample's policy version, so a step that completes
sampled the trainer's current weights; the float32 mismatch to the trainer
(``train/sampler_kl``) shows the engine computed the same policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool.cli import main
from tests.builders import write_run_toml

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def importable_rewards(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["merged", "lora"])
def test_two_rl_steps_sample_with_vllm(tmp_path, tiny_llama, sync, capsys):
    """In ``lora`` mode the run overlaps its steps (``train.max_off_policy_steps = 1``, three
    steps): step 3 samples with the policy after step 1 while step 2 trains and the
    evaluation after step 2 samples with that step's, so two adapters are served at once."""
    lag = 1 if sync == "lora" else 0
    config = write_run_toml(
        tmp_path / "run.toml",
        model={"base_model": str(tiny_llama), "lora_rank": 4, "dtype": "float32"},
        rollout={"group_size": 4},
        train={
            "steps": 2 + lag,
            "save_every": 1,
            "learning_rate": 0.05,  # a step that moves the policy: a stale engine would show
            "eval_every": 2,
            "eval_n": 2,
            "eval_limit": 2,
            "max_off_policy_steps": lag,
            "rollout_correction": "none",  # the float32 mismatch below is the engine's alone
        },
        sampler={"engine": "vllm", "sync": sync, "dtype": "float32"},
    )
    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(config), "--run-dir", str(run_dir), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [1, 2, 3][: 2 + lag]
    assert [m["step"] for m in metrics] == steps
    assert [m["optim/step"] for m in metrics] == [float(s) for s in steps]
    assert all(m["train/datums"] > 0 for m in metrics)
    assert [m["rollout/staleness_max"] for m in metrics] == ([0.0, 1.0, 1.0] if lag else [0, 0])
    # float32 engine and trainer: the same policy up to rounding (with a lag, the first step)
    assert all(abs(m["train/sampler_kl"]) < 1e-4 for m in metrics[: 1 if lag else 2]), metrics
    numerics = json.loads((run_dir / "numerics.json").read_text())
    assert (numerics["sampler"], numerics["trainer"]) == ("float32", "float32")
    leftovers = list((run_dir / "checkpoints").glob("vllm/*")) + list(
        (run_dir / "checkpoints" / "sampler").glob("vllm_policy_step_*")
    )
    # train.eval_every samples with the run's engine, synced to the step's weights
    from retool.evaluation import load_results

    evaluation = load_results(run_dir / "eval" / "step_000002.jsonl")
    assert evaluation.settings["sampler"] == {"engine": "vllm", "dtype": "float32"}
    assert evaluation.summary is not None and len(evaluation.rows) == 4
    assert leftovers == []  # exported weights and published adapters are removed at the end
