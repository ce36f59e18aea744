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


@pytest.mark.parametrize(
    "memo",
    ['["not", "a", "mapping"]', '{"KEY": 12}', '{"KEY": ["x"]}', "null", "{not json"],
)
def test_a_damaged_digest_memo_is_only_a_cache(tmp_path, monkeypatch, memo):
    import hashlib

    from retool.backends.local.models import file_digest

    monkeypatch.setenv("RETOOL_CACHE_DIR", str(tmp_path / "cache"))
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"weights")
    stat = weights.stat()
    key = f"{weights.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "digests.json").write_text(memo.replace("KEY", key))
    expected = hashlib.sha256(b"weights").hexdigest()[:16]
    assert file_digest(weights) == expected  # recomputed, not a TypeError or a wrong value
    assert file_digest(weights) == expected  # and remembered again


def test_a_full_cache_disk_costs_only_a_reread(tmp_path, monkeypatch):
    import errno

    from retool.backends.local import models

    def full(path, data, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv("RETOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "write_atomic", full)
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"weights")
    assert len(models.file_digest(weights)) == 16
    assert not (tmp_path / "cache" / "digests.json").exists()
