"""Every config shipped in configs/ loads and validates, and the GPU ones say what they need.

A config that no longer loads (a key renamed, a value out of range) fails
here, not in a user's first command. The GPU configs name models the user
must download (none is shipped, no network at run time): their comments say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from retool.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


def test_there_are_configs():
    names = {path.name for path in CONFIGS}
    assert {"demo.toml", "gpu-node-8.toml", "gpu-1.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads(path):
    config = load_config(path)
    assert config.model.base_model


def test_node_of_8_trains_with_torchrun_and_samples_on_4_servers():
    config = load_config(Path(CONFIGS[0]).with_name("gpu-node-8.toml"))
    text = Path(CONFIGS[0]).with_name("gpu-node-8.toml").read_text()
    assert config.model.backend == "local" and config.model.lora_rank > 0
    assert config.sampler.engine == "vllm" and config.sampler.sync == "lora"
    assert len(config.sampler.url_list) == 4
    # the commands in its comments: servers with LoRA of at least the trainer's rank
    assert "torchrun --nproc-per-node 4" in text and "CUDA_VISIBLE_DEVICES=0,1,2,3" in text
    assert f"--max-lora-rank {config.model.lora_rank}" in text
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in text
    assert "download" in text and config.model.base_model in text


def test_one_gpu_shares_it_with_the_in_process_engine():
    path = Path(CONFIGS[0]).with_name("gpu-1.toml")
    config = load_config(path)
    assert config.sampler.engine == "vllm" and not config.sampler.url_list
    assert 0 < config.sampler.gpu_memory_utilization < 0.9  # the trainer keeps the rest
    assert config.model.device.startswith("cuda")
    assert "download" in path.read_text()
