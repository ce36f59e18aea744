"""What a forward_backward call sends, its limits and its metrics (no SDK needed)."""

from __future__ import annotations

import numpy as np
import pytest

from retool.backends.remote import losses
from retool.config import ModelConfig
from retool.errors import BackendError, ConfigError
from retool.types import Datum, ModelInput, TensorData


def policy_datum(targets, old, advantages, **extra) -> Datum:
    inputs = {
        "target_tokens": TensorData.from_list(targets, "int64"),
        "logprobs": TensorData.from_list(old),
        "advantages": TensorData.from_list(advantages),
    }
    inputs.update({k: TensorData.from_list(v) for k, v in extra.items()})
    return Datum(ModelInput.from_ints([3] * len(targets)), inputs)


def test_limits_are_checked_before_any_request():
    long = policy_datum([1] * 9, [0.0] * 9, [1.0] * 9)
    losses.check_lengths([long], None, "tinker")
    losses.check_lengths([long], 9, "tinker")
    with pytest.raises(BackendError, match=r"datum 0 has 9 tokens, more .* max_seq_len \(8\)"):
        losses.check_lengths([long], 8, "tinker")
    with pytest.raises(BackendError, match="unknown loss_fn 'dpo'"):
        losses.check_loss_inputs([long], "dpo", "tinker")
    with pytest.raises(BackendError, match="lacks loss_fn_inputs\\['weights'\\]"):
        losses.check_loss_inputs([long], "cross_entropy", "tinker")


def test_model_config_checks_the_remote_settings():
    assert ModelConfig(backend="pytrio", lora_rank=64).loss_reduction == "auto"
    assert losses.resolve_loss_reduction("auto", "pytrio") == "active_token_mean"
    assert losses.resolve_loss_reduction("auto", "tinker") == "sum"
    assert losses.resolve_loss_reduction("sum", "pytrio") == "sum"
    for kwargs, message in [
        ({"backend": "pytrio", "lora_rank": 2}, r"\[4, 64\] on pytrio"),
        ({"backend": "pytrio", "lora_rank": 65}, r"\[4, 64\] on pytrio"),
        ({"backend": "tinker", "lora_rank": 0}, "full fine-tuning.*not offered by tinker"),
        ({"backend": "local", "loss_reduction": "active_token_mean"}, "the local backend sums"),
        ({"backend": "tinker", "loss_reduction": "mean"}, "model.loss_reduction must be one of"),
    ]:
        with pytest.raises(ConfigError, match=message):
            ModelConfig(**kwargs)
    ModelConfig(backend="tinker", lora_rank=1, loss_reduction="advantage_token_mean")


def test_policy_inputs_keep_only_their_keys_and_scale_advantages_by_the_denominator():
    datum = policy_datum(
        [5, 6, 7, 8],
        [0.0, -0.5, 0.0, -0.25],
        [0.0, 2.0, 0.0, -1.0],
        weights=[0.0, 1.0, 0.0, 1.0],
        mask=[0.0, 1.0, 0.0, 1.0],
    )
    sent = losses.loss_inputs(datum, "ppo", 4.0)
    assert set(sent) == {"target_tokens", "logprobs", "advantages"}
    assert sent["target_tokens"].dtype == np.int64 and sent["target_tokens"].shape == (4,)
    assert sent["logprobs"].dtype == np.float32 and sent["advantages"].dtype == np.float32
    assert sent["target_tokens"].tolist() == [5, 6, 7, 8]  # no shift: ours are shifted already
    assert sent["advantages"].tolist() == [0.0, 8.0, 0.0, -4.0]
    assert sent["logprobs"].tolist() == [0.0, -0.5, 0.0, -0.25]
    ce = Datum(
        ModelInput.from_ints([1, 2, 3]),
        {
            "target_tokens": TensorData.from_list([2, 3, 4], "int64"),
            "weights": TensorData.from_list([0.0, 1.0, 0.5]),
        },
    )
    assert losses.loss_inputs(ce, "cross_entropy", 2.0)["weights"].tolist() == [0.0, 2.0, 1.0]
    assert set(losses.loss_inputs(ce, "cross_entropy", 1.0)) == {"target_tokens", "weights"}


def test_denominators_count_what_pytrio_counts():
    a = policy_datum([5, -100, 7, 8], [0.0] * 4, [0.0, 1.0, 1.0, 0.0])
    b = policy_datum([9, 10], [0.0] * 2, [0.5, 0.5])
    assert losses.loss_denominator("sum", "ppo", [a, b]) == 1
    assert losses.loss_denominator("active_token_mean", "ppo", [a, b]) == 5  # not -100
    assert losses.loss_denominator("advantage_token_mean", "ppo", [a, b]) == 3
    ce = Datum(
        ModelInput.from_ints([1, 2, 3]),
        {
            "target_tokens": TensorData.from_list([2, -100, 4], "int64"),
            "weights": TensorData.from_list([0.0, 1.0, 1.0]),
        },
    )
    assert losses.loss_denominator("active_token_mean", "cross_entropy", [ce]) == 1
    assert losses.loss_denominator("advantage_token_mean", "cross_entropy", [ce]) == 1
    nothing = policy_datum([-100], [0.0], [0.0])
    assert losses.loss_denominator("active_token_mean", "ppo", [nothing]) == 1  # never 0


def test_clip_thresholds_go_only_to_losses_that_clip():
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    assert losses.loss_config("ppo", config) == config
    assert losses.loss_config("cispo", config) == config
    assert losses.loss_config("importance_sampling", config) is None
    assert losses.loss_config("cross_entropy", None) is None


def test_ratio_metrics_follow_the_local_definitions():
    datum = policy_datum([5, 6, 7], [0.0, -1.0, -1.0], [0.0, 1.0, 1.0])
    current = np.array([0.3, -1.0 + np.log(1.5), -1.0], dtype=np.float64)
    metrics = losses.ratio_metrics(
        [datum], [current], {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    )
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["clip_fraction"] == pytest.approx(0.5)  # 1.5 outside, 1.0 inside
    assert metrics["approx_kl"] == pytest.approx(-np.log(1.5) / 2)
