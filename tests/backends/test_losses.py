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


# -- sampler/trainer mismatch and rollout correction ----------------------------------

SAMPLER = [-1.0, -1.0, -1.0, -1.0, -2.0]
TRAINER = [-1.0, 0.0, -1.0, -1.9, -1.0]  # log rho: 0, 1, 0, -0.9, 1 (rho e > cap 2 twice)
ADVS = [1.0, 1.0, 0.0, -1.0, 2.0]  # token 2 is not a loss token


def _is_grad(mode: int, recompute: bool, segments=None):
    """Gradient of importance_sampling at theta_old in one old_logprobs mode."""
    current = torch.tensor(TRAINER, requires_grad=True)
    inputs = {"advantages": torch.tensor(ADVS)}
    if recompute:
        inputs["logprobs"] = torch.tensor(TRAINER)
        inputs["sampler_logprobs"] = torch.tensor(SAMPLER)
    else:
        inputs["logprobs"] = torch.tensor(SAMPLER)
    config = {"rollout_correction": mode, "rollout_correction_cap": 2.0}
    loss, metrics = compute_loss("importance_sampling", current, inputs, config, segments)
    loss.backward()
    return current.grad, metrics


def test_tis_caps_the_importance_weight_in_both_old_logprob_modes():
    rho = [math.exp(t - s) for t, s in zip(TRAINER, SAMPLER, strict=True)]
    expected = [-min(r, 2.0) * a for r, a in zip(rho, ADVS, strict=True)]
    for recompute in (False, True):
        grad, metrics = _is_grad(1, recompute)
        assert grad.tolist() == pytest.approx(expected, rel=1e-6)
        assert metrics["correction_fraction"] == pytest.approx(2 / 4)  # tokens 1 and 4 capped
        kl = -sum(math.log(r) for r, a in zip(rho, ADVS, strict=True) if a) / 4
        assert metrics["sampler_kl"] == pytest.approx(kl, rel=1e-6)
        # rho outside [0.8, 1.2]: tokens 1, 3, 4 of the four loss tokens
        assert metrics["sampler_clip_fraction"] == pytest.approx(3 / 4)
    # Without a correction, sampler logprobs as pi_old carry the full rho; recompute none.
    plain, metrics = _is_grad(0, False)
    assert plain.tolist() == pytest.approx([-r * a for r, a in zip(rho, ADVS, strict=True)])
    assert "correction_fraction" not in metrics
    assert _is_grad(0, True)[0].tolist() == pytest.approx([-a for a in ADVS])


def test_mis_masks_whole_sequences_whose_ratio_leaves_the_bounds():
    # Datum 0 = tokens 0-2 (sum log rho 1 > log 2: masked), datum 1 = tokens 3-4 (0.1: kept).
    segments = torch.tensor([0, 0, 0, 1, 1])
    rho = [math.exp(t - s) for t, s in zip(TRAINER, SAMPLER, strict=True)]
    for recompute in (False, True):
        grad, metrics = _is_grad(2, recompute, segments)
        kept = [0.0, 0.0, 0.0, rho[3] * -ADVS[3], rho[4] * -ADVS[4]]
        if recompute:
            kept = [0.0, 0.0, 0.0, -ADVS[3], -ADVS[4]]  # ratio 1; the weight is 0/1
        assert grad.tolist() == pytest.approx(kept, rel=1e-6)
        assert metrics["correction_fraction"] == pytest.approx(2 / 4)


def test_correction_weights_match_the_remote_numpy_rule():
    import numpy as np

    from retool.backends.local.losses import correction_weights as torch_rule
    from retool.training.numerics import correction_weights as numpy_rule

    log_rho = torch.tensor([0.0, 1.0, 0.0, -0.9, 1.0, 0.3])
    active = torch.tensor([True, True, False, True, True, True])
    segments = torch.tensor([0, 0, 0, 1, 1, 2])
    for mode, name in ((1, "tis"), (2, "mis")):
        weight, cut = torch_rule(log_rho, active, segments, mode, 2.0)
        parts = [np.array([0.0, 1.0, 0.0]), np.array([-0.9, 1.0]), np.array([0.3])]
        acts = [np.array([True, True, False]), np.array([True, True]), np.array([True])]
        weights, n_cut = numpy_rule(parts, acts, name, 2.0)
        flat = np.concatenate(weights)
        mask = active.numpy()
        np.testing.assert_allclose(flat[mask], weight.numpy()[mask], rtol=1e-6)
        assert n_cut == int(cut.sum())


def test_bad_correction_settings_are_refused():
    new, inputs = _inputs()
    with pytest.raises(BackendError, match="rollout_correction"):
        compute_loss("ppo", new, inputs, {"rollout_correction": 3})
    with pytest.raises(BackendError, match="cap"):
        compute_loss("ppo", new, inputs, {"rollout_correction": 1, "rollout_correction_cap": 1.0})


def test_target_logprobs_stay_float32_under_bf16_autocast():
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 16)
    head = torch.randn(100, 16) * 3
    targets = torch.randint(0, 100, (2, 5))
    plain = chunked_target_logprobs(hidden, head, targets, chunk=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = chunked_target_logprobs(hidden, head, targets, chunk=2)
    assert under.dtype == torch.float32
    torch.testing.assert_close(under, plain, atol=1e-5, rtol=1e-5)
