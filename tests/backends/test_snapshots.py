"""Sampling snapshots: which LoRA setups may be merged in place, and the copy fallback."""

from __future__ import annotations

import threading

import pytest
import torch
from peft import LoraConfig, get_peft_model

from retool.backends.local.snapshots import SnapshotPool, mergeable_lora_layers


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(4, 6)
        self.down = torch.nn.Linear(6, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _peft(**config):
    torch.manual_seed(0)
    model = get_peft_model(Tiny(), LoraConfig(r=2, target_modules=["up", "down"], **config))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    return model, trainable


def _train(model):
    """Stand-in for an optimizer step: every trainable weight moves."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))


def test_plain_lora_is_merged_in_place():
    model, trainable = _peft()
    layers = mergeable_lora_layers(model.get_base_model(), trainable)
    assert layers is not None
    assert sorted(name for name, _ in layers) == ["down", "up"]  # names in the causal LM


@pytest.mark.parametrize(
    "why",
    ["dora", "a trainable weight outside the adapters", "no trainable weight", "merged"],
)
def test_other_setups_are_not_merged_in_place(why):
    model, trainable = _peft(use_dora=why == "dora")
    if why == "a trainable weight outside the adapters":
        trainable = [*trainable, "base_model.model.up.base_layer.bias"]
    elif why == "no trainable weight":
        trainable = []
    elif why == "merged":
        model.merge_adapter()
    assert mergeable_lora_layers(model.get_base_model(), trainable) is None


@pytest.mark.parametrize("use_dora", [False, True])
def test_a_reused_model_holds_exactly_what_a_fresh_copy_holds(use_dora):
    """Plain LoRA refreshes the released model; DoRA cannot and must copy afresh."""
    model, trainable = _peft(use_dora=use_dora)
    pool = SnapshotPool(
        model, model.get_base_model(), trainable, threading.Lock(), full=False, dtype=None
    )
    first = pool.take()
    pool.release(first)
    _train(model)
    second = pool.take()
    assert (second is first) == (not use_dora)
    expected = pool.copy().state_dict()
    got = second.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-6, rtol=0)
    x = torch.randn(3, 4)
    torch.testing.assert_close(second(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_full_fine_tuning_pool_refuses_a_model_of_another_shape():
    torch.manual_seed(0)
    model = Tiny()
    pool = SnapshotPool(model, model, [], threading.Lock(), full=True, dtype=None)
    other = torch.nn.Sequential()
    other.up = torch.nn.Linear(4, 7)  # a name in common, another shape
    pool.release(other)
    fresh = pool.take()
    assert fresh is not other
    for (name, a), (_, b) in zip(fresh.named_parameters(), model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
