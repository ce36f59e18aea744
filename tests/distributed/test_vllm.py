"""``sampler.engine = "vllm"`` without ``sampler.urls`` under torchrun: the engine beside rank 0.

In rank 0's process ``torch.distributed`` holds the trainer's group, which an
in-process vLLM worker would take for its own; so under torchrun the engine's
core runs in a spawned process, started from rank 0's full copy of the model
(gathered from the shards first) and synced from it after every step: merged
weights as a file the engine reloads, adapters as today.

What a careless implementation would get wrong, and what each run checks:
the engine starting from one rank's shard, or keeping stale weights after a
step (float32 engine and trainer: ``train/sampler_kl`` stays at rounding at
every step a policy sampled, and every sample's policy version is checked by
the rollout); vLLM joining the trainer's group (the run would hang at start or
fail at the first collective); what the engine leaves behind. (The same
run in one process ends with the same weights, within 1.7e-6 relative on
2026-12-06: docs/measurements.md; the suite's time left that comparison to
the trainer's own parity test, ``test_parity.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.backends.vllm.conftest import write_tiny_llama
from tests.builders import run_toml
from tests.distributed.common import torchrun


def _config(tmp_path: Path, sync: str) -> Path:
    model = write_tiny_llama(tmp_path / "tiny-llama")
    config = tmp_path / "run.toml"
    config.write_text(
        run_toml(
            model={"base_model": str(model), "lora_rank": 4, "dtype": "float32"},
            rollout={"group_size": 4},
            train={
                "steps": 2,
                # a first step that moves the policy: at 1e-3 a stale engine's samples
                # were within rounding of the current policy's (sampler_kl 1e-7)
                "learning_rate": 0.05,
                # no checkpoint between the steps: its saved sampler weights would
                # refresh rank 0's full copy, hiding an engine sync that does not
                "save_every": 2,
                "rollout_correction": "none",  # the float32 mismatch is the engine's alone
            },
            sampler={"engine": "vllm", "sync": sync, "dtype": "float32"},
        )
    )
    return config


def _metrics(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow(seconds=100)  # a vLLM engine beside two ranks
def test_merged_sync_under_torchrun_samples_the_full_model_at_every_step(tmp_path):
    config = _config(tmp_path, "merged")
    two = tmp_path / "two"
    args = ("train", "--config", str(config), "--no-progress")
    ran = torchrun("-m", "retool", *args, "--run-dir", str(two), timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    metrics = _metrics(two)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["train/datums"] > 0 for m in metrics)
    assert all(abs(m["train/sampler_kl"]) < 1e-4 for m in metrics), metrics
    assert not list((two / "checkpoints").glob("vllm/*"))  # the exports are removed
    assert (two / "checkpoints" / "state" / "step_000002" / "trainable.safetensors").is_file()


@pytest.mark.slow(seconds=100)  # a vLLM engine beside two ranks
def test_lora_sync_under_torchrun_publishes_each_steps_adapter(tmp_path):
    """Overlapped steps keep older adapters loaded: tests/backends/vllm/test_train.py."""
    config = _config(tmp_path, "lora")
    run = tmp_path / "run"
    args = ("train", "--config", str(config), "--no-progress", "--run-dir", str(run))
    ran = torchrun("-m", "retool", *args, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    metrics = _metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["train/datums"] > 0 for m in metrics)
    # step 2 sampled with step 1's adapter, saved from rank 0's gathered copy
    assert all(abs(m["train/sampler_kl"]) < 1e-4 for m in metrics), metrics
    leftovers = list((run / "checkpoints").glob("vllm/*")) + list(
        (run / "checkpoints" / "sampler").glob("vllm_policy_step_*")
    )
    assert leftovers == []
