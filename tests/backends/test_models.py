import pytest
import torch

from retool.backends.local.models import (
    SMOLLM2_ALIAS,
    TINY_RANDOM_ALIAS,
    load_model,
    resolve_model,
)
from retool.errors import BackendError


def test_aliases_resolve_without_network():
    assert resolve_model(SMOLLM2_ALIAS).gguf_file.endswith(".gguf")
    assert resolve_model(TINY_RANDOM_ALIAS).random_init


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(BackendError, match="unknown model 'Qwen/Qwen3-8B'"):
        resolve_model("Qwen/Qwen3-8B")
    with pytest.raises(BackendError, match="unknown model"):
        resolve_model(str(tmp_path))


def test_tiny_random_is_deterministic_and_small(smol_tokenizer):
    a, b = load_model(TINY_RANDOM_ALIAS, seed=3), load_model(TINY_RANDOM_ALIAS, seed=3)
    assert sum(p.numel() for p in a.parameters()) < 10_000_000
    ids = torch.tensor([smol_tokenizer.encode("hello world")])
    torch.testing.assert_close(a(ids).logits, b(ids).logits)
    assert a.config.vocab_size == len(smol_tokenizer)


def test_hf_directory_round_trip(tmp_path):
    model = load_model(TINY_RANDOM_ALIAS, seed=1)
    model.save_pretrained(tmp_path)
    again = load_model(str(tmp_path))
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(model(ids).logits, again(ids).logits)
