"""A model the in-process engine cannot run: one permanent error, no retries, nothing left.

vLLM's CPU kernels accept the model at start and refuse it at the first
forward ("Unsupported CPU attention configuration: head_dim=16", the heads of
``tiny-random``). That engine is dead for good: the rollout must stop at once
with what vLLM said and what to do, not retry every sample and suggest
``--resume`` "once the service works again"; the run's exported model and
published adapter must be gone afterwards, so a run that never committed a
step can be removed whole. One engine start (20-60 s on a loaded 2-core host).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from retool.backends.local import LocalServiceClient
from retool.backends.vllm import EngineOptions, VllmPolicySampler
from retool.config import RolloutConfig
from retool.data.examples import MathExample
from retool.errors import SamplerDeadError
from retool.rollout import rollout_batch
from retool.types import ModelInput, SamplingParams
from tests.rollout.fakes import FakeSandbox

pytestmark = pytest.mark.slow  # one vLLM engine start


def write_narrow_heads(path: Path) -> Path:
    """A random Llama whose 2 attention heads are 16 wide (as tiny-random's)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from retool.backends.local.models import SMOLLM2_ALIAS, load_tokenizer

    tokenizer = load_tokenizer(SMOLLM2_ALIAS)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def test_a_model_the_engine_cannot_run_stops_the_rollout_at_once(tmp_path):
    model = write_narrow_heads(tmp_path / "narrow")
    checkpoints = tmp_path / "run" / "checkpoints"
    service = LocalServiceClient(device="cpu", dtype="float32", checkpoint_root=checkpoints)
    trainer = service.create_lora_training_client(str(model), rank=4, seed=0)
    options = EngineOptions(dtype="float32", max_model_len=512, max_num_seqs=4)
    sampler = VllmPolicySampler(trainer, "lora", options, checkpoints / "vllm")
    try:
        client = sampler.snapshot()
        config = RolloutConfig(
            group_size=2,
            max_trajectory_tokens=512,
            max_assistant_tokens=8,
            sample_retries=3,
            retry_backoff=0.0,
        )
        with pytest.raises(SamplerDeadError) as info:
            rollout_batch(
                client,
                trainer.get_tokenizer(),
                FakeSandbox(lambda code: ""),
                [MathExample("q1", "What is 2^10?", "1024"), MathExample("q2", "3^5?", "243")],
                config,
            )
        message = str(info.value)
        assert "head_dim=16" in message and 'sampler.engine = "local"' in message
        assert "\n" not in message and "--resume" not in message
        # the engine stays dead: a later request fails at once, the same way
        with pytest.raises(SamplerDeadError, match="head_dim=16"):
            client.sample(ModelInput.from_ints([1, 2]), 1, SamplingParams(max_tokens=1)).result(60)
    finally:
        sampler.close()
    # the exported model and the published adapter are gone, with their directories
    assert sorted(p.name for p in checkpoints.iterdir()) == []
