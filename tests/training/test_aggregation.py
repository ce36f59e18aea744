"""Loss aggregation: each mode is a per-datum scale, so any micro-batch split is the same step.

The gradient tests run the local backend on ``tiny-random`` (float32, CPU) and
compare accumulated LoRA gradients with the tolerance ``rtol=1e-4`` and
``atol=1e-5 * max |reference gradient|``: the same sums, reordered and padded
to different widths, agree to float32 rounding and no closer.
"""

import itertools

import numpy as np
import pytest
import torch

from retool.backends.local import LocalServiceClient
from retool.data.examples import MathExample
from retool.errors import ConfigError
from retool.rollout.types import AssistantTurn, StopReason, Trajectory
from retool.training.aggregation import AGGREGATIONS, aggregation_scales, scale_advantages
from retool.training.datum import TrainingDatum, build_training_datums, datum_loss_tokens
from retool.types import AdamParams, Datum, ModelInput, TensorData

NUM_TRAJECTORIES = 9  # the rollout batch: 6 trained + 3 filtered (advantage 0)
PPO = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
RTOL, ATOL_FRACTION = 1e-4, 1e-5


def _trajectory(rng, index, logprobs=None):
    """1-3 turns of random tokens; ``logprobs`` (per completion token) replaces the default."""
    trajectory = Trajectory(
        example=MathExample(id=f"ex-{index}", question="q", answer="a"),
        group_index=index,
        messages=[],
    )
    tokens = [int(t) for t in rng.integers(1000, 30000, size=int(rng.integers(3, 12)))]
    used = 0
    for _ in range(int(rng.integers(1, 4))):
        prompt = list(tokens)
        completion = [int(t) for t in rng.integers(1000, 30000, size=int(rng.integers(1, 9)))]
        if logprobs is None:
            lp = [-10.0] * len(completion)
        else:
            lp, used = logprobs[used : used + len(completion)], used + len(completion)
        trajectory.turns.append(AssistantTurn(prompt, completion, lp, text=""))
        delta = [int(t) for t in rng.integers(1000, 30000, size=int(rng.integers(0, 6)))]
        tokens = prompt + completion + delta
    trajectory.advantage = float(rng.choice([-1, 1]) * rng.uniform(0.2, 1.5))
    trajectory.stop_reason = StopReason.ANSWER
    return trajectory


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    service = LocalServiceClient(checkpoint_root=tmp_path_factory.mktemp("ckpt"))
    client = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    return client


@pytest.fixture(scope="module")
def batch(trainer):
    """Six datums of different lengths whose old logprobs sit near the policy's (some clip)."""
    rng = np.random.default_rng(7)
    draft = [_trajectory(np.random.default_rng(100 + i), i) for i in range(6)]
    datums = build_training_datums(draft, max_context_tokens=512)
    # B of LoRA starts at zero (no gradient for A): take one real step first.
    trainer.forward_backward([d.datum for d in datums], "ppo", PPO).result()
    trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    current = trainer.forward([d.datum for d in datums], "ppo", PPO).result()
    trajectories = []
    for i, (td, out) in enumerate(zip(datums, current.loss_fn_outputs, strict=True)):
        mask = td.datum.loss_fn_inputs["advantages"].to_numpy() != 0
        old = out["logprobs"].to_numpy()[mask] + rng.normal(0.0, 0.3, size=int(mask.sum()))
        trajectories.append(_trajectory(np.random.default_rng(100 + i), i, old.tolist()))
    filtered = [_trajectory(np.random.default_rng(200 + i), 10 + i) for i in range(3)]
    for trajectory in filtered:
        trajectory.advantage = 0.0
    mixed = trajectories[:2] + filtered + trajectories[2:]
    assert len(mixed) == NUM_TRAJECTORIES
    datums = build_training_datums(mixed, max_context_tokens=512)
    assert len(datums) == 6 and len({d.num_tokens for d in datums}) >= 4
    return datums


def _clear(trainer):
    for p in trainer.model.parameters():
        p.grad = None


def _gradient(trainer, micro_batches, loss_fn="ppo"):
    """Accumulated gradient (one flat vector) of forward_backward over ``micro_batches``."""
    _clear(trainer)
    metrics = []
    for micro_batch in micro_batches:
        out = trainer.forward_backward([d.datum for d in micro_batch], loss_fn, PPO).result()
        metrics.append(out.metrics)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    assert all(p.grad is not None for p in params)
    flat = torch.cat([p.grad.detach().reshape(-1).double() for p in params])
    _clear(trainer)
    return flat, metrics


def _random_splits(rng, items, count):
    splits = []
    for _ in range(count):
        order = rng.permutation(len(items))
        cuts = sorted(rng.choice(np.arange(1, len(items)), size=2, replace=False).tolist())
        bounds = [0, *cuts, len(items)]
        splits.append([[items[k] for k in order[a:b]] for a, b in itertools.pairwise(bounds)])
    return splits


def _assert_same(actual, expected):
    atol = ATOL_FRACTION * float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=atol)


def test_any_split_gives_the_same_gradient_and_the_modes_mean_what_they_say(trainer, batch):
    rng = np.random.default_rng(0)
    # Per-datum gradients of the raw (unscaled) sums, one datum per call.
    singles = [_gradient(trainer, [[d]])[0] for d in batch]
    tokens = [d.loss_tokens for d in batch]
    assert tokens == [datum_loss_tokens(d.datum) for d in batch]
    n = NUM_TRAJECTORIES
    # What each mode means, built from the raw per-datum gradients. seq_mean is the
    # reference's form: per-sequence mean, mean over micro-batch k, times n_k / N.
    reference_split = [[0, 1, 2], [3], [4, 5]]
    expected = {
        "seq_mean": sum(
            (len(k) / n) * sum(singles[i] / tokens[i] for i in k) / len(k) for k in reference_split
        ),
        "token_mean": sum(singles) / sum(tokens),
        "token_sum": sum(singles),
    }
    one_call = {}
    clipped = 0.0
    for mode in AGGREGATIONS:
        scaled = scale_advantages(batch, mode, n)
        one, metrics = _gradient(trainer, [scaled])
        clipped = max(clipped, metrics[0]["clip_fraction"])
        _assert_same(one, expected[mode])
        for split in _random_splits(rng, scaled, 2):
            accumulated, _ = _gradient(trainer, split)
            _assert_same(accumulated, one)
        one_call[mode] = one
    assert clipped > 0.05  # the PPO clip branch is exercised, and scaling leaves it alone

    def cosine(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    # token_mean and token_sum differ by one constant; seq_mean weighs datums differently.
    assert cosine(one_call["token_mean"], one_call["token_sum"]) == pytest.approx(1.0, abs=1e-6)
    assert float(one_call["token_sum"].norm()) > 10 * float(one_call["token_mean"].norm())
    assert cosine(one_call["seq_mean"], one_call["token_mean"]) < 0.999


def test_sft_weights_are_scaled_and_split_invariant(trainer, batch):
    def sft(td):
        inputs = dict(td.datum.loss_fn_inputs)
        weights = (inputs.pop("advantages").to_numpy() != 0).astype(np.float32)
        del inputs["logprobs"]
        inputs["weights"] = TensorData.from_numpy(weights)
        return TrainingDatum(Datum(td.datum.model_input, inputs), td.num_tokens, td.loss_tokens)

    data = [sft(d) for d in batch]
    rng = np.random.default_rng(1)
    scaled = scale_advantages(data, "seq_mean", len(data))
    one, _ = _gradient(trainer, [scaled], "cross_entropy")
    for split in _random_splits(rng, scaled, 2):
        _assert_same(_gradient(trainer, split, "cross_entropy")[0], one)
    weights = scale_advantages(data, "seq_mean", len(data))[0].datum.loss_fn_inputs["weights"]
    np.testing.assert_allclose(
        weights.to_numpy()[weights.to_numpy() != 0], 1 / (len(data) * data[0].loss_tokens)
    )


def test_seq_mean_identity_invariant_8():
    # The chapter's example: losses [2, 4, 6] split 2 + 1.
    losses = np.array([2.0, 4.0, 6.0])
    assert (2 / 3) * np.mean(losses[:2]) + (1 / 3) * np.mean(losses[2:]) == pytest.approx(4.0)
    assert np.mean(losses[:2]) + np.mean(losses[2:]) == pytest.approx(9.0)  # unscaled
    # Per-token losses of 7 trained trajectories in a batch of N = 11 (4 filtered).
    rng = np.random.default_rng(3)
    n = 11
    per_token = [rng.normal(size=int(rng.integers(1, 30))) for _ in range(7)]
    sequence_means = np.array([t.mean() for t in per_token])
    target = sequence_means.sum() / n  # the filtered four add 0 but count in N
    scales = aggregation_scales([len(t) for t in per_token], "seq_mean", n)
    # The backend's summed loss of scaled datums, over any micro-batch split...
    assert sum(c * t.sum() for c, t in zip(scales, per_token, strict=True)) == pytest.approx(target)
    for _ in range(20):
        order = rng.permutation(7)
        cuts = sorted(rng.choice(np.arange(1, 7), size=int(rng.integers(0, 5)), replace=False))
        batches = np.split(order, cuts)
        # ...equals the reference's sum_k (n_k/N) * mean(loss over batch k).
        reference = sum((len(b) / n) * sequence_means[b].mean() for b in batches)
        assert reference == pytest.approx(target)
        summed = sum(scales[i] * per_token[i].sum() for b in batches for i in b)
        assert summed == pytest.approx(target)
    tokens = [len(t) for t in per_token]
    assert aggregation_scales(tokens, "token_mean", n) == [1 / sum(tokens)] * 7
    assert aggregation_scales(tokens, "token_sum", n) == [1.0] * 7


def _tiny(advantages, weights=None):
    inputs = {
        "target_tokens": TensorData.from_list([5] * len(advantages), "int64"),
        "logprobs": TensorData.from_list([-1.0] * len(advantages)),
        "advantages": TensorData.from_list(advantages),
    }
    if weights is not None:
        inputs["weights"] = TensorData.from_list(weights)
    datum = Datum(ModelInput.from_ints([1] * len(advantages)), inputs)
    return TrainingDatum(datum, len(advantages), datum_loss_tokens(datum), trajectory_index=0)


def test_scale_advantages_returns_new_datums_and_validates():
    a = _tiny([0.0, 0.5, 0.5, 0.5])
    b = _tiny([0.0, 0.0, -2.0], weights=[0.0, 0.0, 1.0])
    out = scale_advantages([a, b], "seq_mean", 4)
    assert a.datum.loss_fn_inputs["advantages"].tolist() == [0.0, 0.5, 0.5, 0.5]  # untouched
    np.testing.assert_allclose(
        out[0].datum.loss_fn_inputs["advantages"].tolist(), [0, 0.5 / 12, 0.5 / 12, 0.5 / 12]
    )
    np.testing.assert_allclose(out[1].datum.loss_fn_inputs["advantages"].tolist(), [0, 0, -0.5])
    np.testing.assert_allclose(out[1].datum.loss_fn_inputs["weights"].tolist(), [0, 0, 0.25])
    for before, after in zip([a, b], out, strict=True):
        assert after.loss_tokens == before.loss_tokens and after.num_tokens == before.num_tokens
        assert after.datum.model_input == before.datum.model_input
        for key in ("target_tokens", "logprobs"):
            assert after.datum.loss_fn_inputs[key] == before.datum.loss_fn_inputs[key]
    token_mean = scale_advantages([a, b], "token_mean", 2)
    np.testing.assert_allclose(token_mean[0].datum.loss_fn_inputs["advantages"].tolist()[1], 0.125)
    assert scale_advantages([a, b], "token_sum", 2) == [a, b]
    assert scale_advantages([], "seq_mean", 0) == []
    with pytest.raises(ConfigError, match="seq_mean, token_mean, token_sum"):
        scale_advantages([a], "mean", 1)
    with pytest.raises(ValueError, match="num_trajectories"):
        scale_advantages([a, b], "seq_mean", 1)
