"""Each loss against a hand-written reference on small tensors."""

import math

import pytest
import torch

from retool.backends.local.losses import chunked_target_logprobs, compute_loss
from retool.errors import BackendError

OLD = [-1.0, -1.0, -1.0, -1.0, -2.0]
NEW = [-1.0, -0.5, -1.5, -0.9, -2.0]  # ratios 1, e^.5, e^-.5, e^.1, 1
ADV = [0.0, 1.0, 1.0, -1.0, -2.0]


def _inputs():
    new = torch.tensor(NEW, requires_grad=True)
    return new, {"logprobs": torch.tensor(OLD), "advantages": torch.tensor(ADV)}


def _ppo_reference(low, high):
    total = 0.0
    for o, n, a in zip(OLD, NEW, ADV, strict=True):
        r = math.exp(n - o)
        total += min(r * a, min(max(r, low), high) * a)
    return -total


@pytest.mark.parametrize("low, high", [(0.8, 1.2), (0.8, 1.28), (0.9, 1.05)])
def test_ppo_clips_both_sides(low, high):
    new, inputs = _inputs()
    loss, metrics = compute_loss(
        "ppo", new, inputs, {"clip_low_threshold": low, "clip_high_threshold": high}
    )
    assert loss.item() == pytest.approx(_ppo_reference(low, high), rel=1e-6)
    loss.backward()
    # Token 1: ratio e^.5 > high with A > 0 -> clipped branch, no gradient.
    assert float(new.grad[1]) == 0.0
    # Token 2: ratio e^-.5 < low with A > 0 -> unclipped branch (min picks r*A).
    assert float(new.grad[2]) == pytest.approx(-math.exp(-0.5))
    assert metrics["loss_tokens"] == 4
    outside = sum(
        1
        for o, n, a in zip(OLD, NEW, ADV, strict=True)
        if a != 0 and not low <= math.exp(n - o) <= high
    )
    assert metrics["clip_fraction"] == pytest.approx(outside / 4)
    assert metrics["ratio_max"] == pytest.approx(math.exp(0.5))


def test_importance_sampling():
    new, inputs = _inputs()
    loss, metrics = compute_loss("importance_sampling", new, inputs)
    expected = -sum(math.exp(n - o) * a for o, n, a in zip(OLD, NEW, ADV, strict=True))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    approx_kl = sum(o - n for o, n, a in zip(OLD, NEW, ADV, strict=True) if a) / 4
    assert metrics["approx_kl"] == pytest.approx(approx_kl)


def test_cispo_gradient_is_clipped_ratio_times_advantage():
    new, inputs = _inputs()
    loss, _ = compute_loss("cispo", new, inputs)
    loss.backward()
    for i, (o, n, a) in enumerate(zip(OLD, NEW, ADV, strict=True)):
        weight = min(max(math.exp(n - o), 0.8), 1.2)
        assert float(new.grad[i]) == pytest.approx(-weight * a, rel=1e-6)


def test_cross_entropy_uses_weights():
    new = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    loss, metrics = compute_loss("cross_entropy", new, {"weights": torch.tensor([0.0, 1.0, 0.5])})
    assert loss.item() == pytest.approx(2.0 + 1.5)
    assert metrics["loss_tokens"] == 2


def test_unknown_loss_and_bad_clip():
    new, inputs = _inputs()
    with pytest.raises(BackendError, match="unknown loss_fn"):
        compute_loss("dpo", new, inputs)
    with pytest.raises(BackendError, match="clip thresholds"):
        compute_loss("ppo", new, inputs, {"clip_low_threshold": 1.1})


@pytest.mark.parametrize("head_trainable", [True, False])
def test_chunked_logprobs_match_full_logits_and_gradients(head_trainable):
    torch.manual_seed(0)
    hidden = torch.randn(2, 37, 8, requires_grad=True)
    head = torch.randn(50, 8, requires_grad=head_trainable)
    targets = torch.randint(0, 50, (2, 37))
    full = torch.log_softmax(hidden @ head.T, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    chunked = chunked_target_logprobs(hidden, head, targets, chunk=5)
    torch.testing.assert_close(chunked, full)
    upstream = torch.randn(2, 37)  # a loss that weights tokens differently
    wrt = (hidden, head) if head_trainable else (hidden,)
    grad_full = torch.autograd.grad((full * upstream).sum(), wrt)
    grad_chunked = torch.autograd.grad((chunked * upstream).sum(), wrt)
    for a, b in zip(grad_full, grad_chunked, strict=True):
        torch.testing.assert_close(a, b)


def test_lean_lora_forward_matches_peft():
    import copy

    from peft import LoraConfig, get_peft_model

    from retool.backends.local.lora_fast import use_lean_lora_forward
    from retool.backends.local.models import load_model

    torch.manual_seed(0)
    peft_model = get_peft_model(
        load_model("tiny-random", seed=2),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "down_proj"]),
    )
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)  # B starts at zero: make it count
    lean = copy.deepcopy(peft_model)
    assert use_lean_lora_forward(lean) == 4  # 2 layers x 2 modules
    ids = torch.tensor([[5, 9, 200, 31, 7]])
    out_peft = peft_model(input_ids=ids).logits
    out_lean = lean(input_ids=ids).logits
    torch.testing.assert_close(out_lean, out_peft)
    out_peft.sum().backward()
    out_lean.sum().backward()
    for (name, a), (_, b) in zip(
        peft_model.named_parameters(), lean.named_parameters(), strict=True
    ):
        if a.requires_grad:
            torch.testing.assert_close(b.grad, a.grad, msg=name)
