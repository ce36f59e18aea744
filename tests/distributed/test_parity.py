"""Two ranks under torchrun take the same step as one process (FSDP2 on gloo, float32).

One ``forward_backward`` over uneven datums (split across the ranks by tokens)
and one clipped AdamW ``optim_step``, on ``tiny-random``, for LoRA and for
full fine-tuning: the weights written by ``save_state`` (rank 0 gathers them
into the one-process layout), the per-datum logprobs in the call's order, the
merged metrics and the gradient norm agree with one process.

The weight gap is per tensor, ``|w2 - w1| / |w1|`` (Frobenius): AdamW's first
step divides each gradient element by its own magnitude, so an element of a
near-zero gradient (an embedding row no datum uses, through the tied head)
moves by up to the learning rate on a last-bit difference in the summation
order. Elementwise, the gap is measured against the update instead.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.distributed.common import python, torchrun

WORKER = "tests/distributed/worker.py"
KINDS = ("lora", "full")


def _gaps(one, two):
    weights = {}
    for name, w1 in one["weights"].items():
        w2 = two["weights"][name]
        weights[name] = float((w2 - w1).norm() / w1.norm().clamp_min(1e-12))
    return weights


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """Each kind's step, by two ranks and by one process (both kinds in one launch)."""
    tmp = tmp_path_factory.mktemp("parity")
    two = torchrun(WORKER, str(tmp / "two"), ",".join(KINDS), str(tmp / "ck2"))
    assert two.returncode == 0, two.stderr[-3000:]
    one = python(WORKER, str(tmp / "one"), ",".join(KINDS), str(tmp / "ck1"))
    assert one.returncode == 0, one.stderr[-3000:]
    return tmp


@pytest.mark.slow(seconds=55)  # starts three processes
@pytest.mark.parametrize("kind", KINDS)
def test_two_ranks_take_the_step_of_one_process(steps, kind):
    a = torch.load(steps / "one" / f"{kind}.pt", weights_only=False)
    b = torch.load(steps / "two" / f"{kind}.pt", weights_only=False)
    assert sorted(a["weights"]) == sorted(b["weights"])  # the unwrapped model's names
    for name in a["weights"]:
        assert a["weights"][name].shape == b["weights"][name].shape, name  # full, not shards
    gaps = _gaps(a, b)
    assert max(gaps.values()) < 1e-5, sorted(gaps.items(), key=lambda kv: -kv[1])[:3]
    # The step moved the weights: the gap is small against a real update, not against 0.
    assert b["grad_norm"] > 0 and abs(b["grad_norm"] - a["grad_norm"]) <= 1e-5 * a["grad_norm"]
    for x, y in zip(a["logprobs"], b["logprobs"], strict=True):  # in the call's order
        assert x.shape == y.shape and np.allclose(x, y, atol=1e-5)
    for x, y in zip(a["after"], b["after"], strict=True):  # the updated weights' forward
        assert np.allclose(x, y, atol=1e-5)
    assert not all(
        np.allclose(x, y, atol=1e-3) for x, y in zip(a["logprobs"], a["after"], strict=True)
    )
    assert b["single"].shape == a["single"].shape and np.allclose(
        a["single"], b["single"], atol=1e-5
    )
    assert b["single_metrics"] == pytest.approx(a["single_metrics"], rel=1e-5, abs=1e-6)
    print(f"{kind}: largest per-tensor weight gap {max(gaps.values()):.2e}")
    assert set(a["metrics"]) == set(b["metrics"])
    for name, value in a["metrics"].items():
        assert b["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
