"""The remote adapters' shared pieces, without an SDK: futures, losses, stops, pointers, limits."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import numpy as np
import pytest

from retool.backends import remote
from retool.config import ModelConfig
from retool.errors import BackendError, ConfigError
from retool.types import Datum, ModelInput, SamplerStop, TensorData


def policy_datum(targets, old, advantages, **extra) -> Datum:
    inputs = {
        "target_tokens": TensorData.from_list(targets, "int64"),
        "logprobs": TensorData.from_list(old),
        "advantages": TensorData.from_list(advantages),
    }
    inputs.update({k: TensorData.from_list(v) for k, v in extra.items()})
    return Datum(ModelInput.from_ints([3] * len(targets)), inputs)


class SdkError(Exception):
    """Stands for an SDK's own exception class."""


def test_bridge_delivers_results_exceptions_and_cancellation_to_result_and_await():
    source: concurrent.futures.Future = concurrent.futures.Future()
    ours = remote.bridge(source, lambda v: v * 2, "svc", "op")  # a bare concurrent future
    assert not ours.done()
    source.set_result(21)
    assert ours.result(timeout=1) == 42

    class PytrioLike:  # keeps its concurrent future as `_future`, no `future()`
        def __init__(self, inner):
            self._future = inner

    failing: concurrent.futures.Future = concurrent.futures.Future()
    ours = remote.bridge(PytrioLike(failing), lambda v: v, "pytrio", "sample")
    failing.set_exception(SdkError("503 after every retry"))
    with pytest.raises(BackendError, match="pytrio: sample failed: SdkError: 503") as caught:
        ours.result(timeout=1)
    assert isinstance(caught.value.__cause__, SdkError)

    async def awaited():
        inner: concurrent.futures.Future = concurrent.futures.Future()
        pending = remote.bridge(PytrioLike(inner), lambda v: v + 1, "pytrio", "sample")
        asyncio.get_running_loop().call_later(0.01, inner.set_result, 1)
        return await pending

    assert asyncio.run(awaited()) == 2

    class ResultOnly:  # neither: waited on by a worker thread
        def result(self, timeout=None):
            return "late"

    assert remote.bridge(ResultOnly(), str.upper, "x", "y").result(timeout=5) == "LATE"

    cancelled: concurrent.futures.Future = concurrent.futures.Future()
    ours = remote.bridge(cancelled, lambda v: v, "x", "y")
    cancelled.cancel()
    assert ours._inner.cancelled()

    broken = remote.submit(lambda: (_ for _ in ()).throw(SdkError("bad token id")), str, "x", "op")
    with pytest.raises(BackendError, match="x: op failed: SdkError: bad token id"):
        broken.result()
    converted_badly = remote.bridge(source, lambda v: 1 / 0, "x", "op")
    with pytest.raises(BackendError, match="ZeroDivisionError"):
        converted_badly.result()


def test_a_long_multiline_sdk_message_becomes_one_bounded_line():
    error = remote.translate(SdkError("first\nsecond " + "x" * 5000), "tinker", "sample")
    assert "\n" not in str(error) and len(str(error)) < 700 and "first second" in str(error)
    kept = BackendError("ours")
    assert remote.translate(kept, "tinker", "sample") is kept


@pytest.mark.parametrize(
    ("raw", "count", "expected"),
    [
        ("stop", 3, SamplerStop.STOP),  # tinker and pytrio
        ("length", 8, SamplerStop.LENGTH),
        ("eos", 3, SamplerStop.STOP),
        ("max_tokens", 8, SamplerStop.LENGTH),
        ("", 8, SamplerStop.LENGTH),  # pytrio's default: read from the length
        ("", 3, SamplerStop.STOP),
        (None, 3, SamplerStop.STOP),
    ],
)
def test_stop_reasons_map_to_ours(raw, count, expected):
    assert remote.stop_reason(raw, count, 8, "pytrio") is expected


def test_an_aborted_sequence_is_an_error_for_the_rollout_to_retry():
    with pytest.raises(BackendError, match="reason 'abort'"):
        remote.stop_reason("abort", 2, 8, "pytrio")
    with pytest.raises(BackendError, match="no logprobs"):
        remote.sequence([1, 2], None, None, "stop", 8, "tinker")
    with pytest.raises(BackendError, match="2 tokens but 1 logprobs"):
        remote.sequence([1, 2], [-0.1], None, "stop", 8, "tinker")
    with pytest.raises(BackendError, match="non-finite"):
        remote.sequence([1], [float("nan")], None, "stop", 8, "tinker")


def test_mixed_stops_become_strings_because_each_sdk_takes_one_kind():
    class Tok:
        def convert_ids_to_tokens(self, i):
            return {2: "<|im_end|>", 7: "```"}[i]

    assert remote.split_stops((), Tok()) is None
    assert remote.split_stops((2, 7), Tok()) == [2, 7]
    assert remote.split_stops(("```output",), Tok()) == ["```output"]
    assert remote.split_stops((2, "```output", 7), Tok()) == ["```output", "<|im_end|>", "```"]


def test_policy_inputs_keep_only_their_keys_and_scale_advantages_by_the_denominator():
    datum = policy_datum(
        [5, 6, 7, 8],
        [0.0, -0.5, 0.0, -0.25],
        [0.0, 2.0, 0.0, -1.0],
        weights=[0.0, 1.0, 0.0, 1.0],
        mask=[0.0, 1.0, 0.0, 1.0],
    )
    sent = remote.loss_inputs(datum, "ppo", 4.0)
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
    assert remote.loss_inputs(ce, "cross_entropy", 2.0)["weights"].tolist() == [0.0, 2.0, 1.0]
    assert set(remote.loss_inputs(ce, "cross_entropy", 1.0)) == {"target_tokens", "weights"}


def test_denominators_count_what_pytrio_counts():
    a = policy_datum([5, -100, 7, 8], [0.0] * 4, [0.0, 1.0, 1.0, 0.0])
    b = policy_datum([9, 10], [0.0] * 2, [0.5, 0.5])
    assert remote.loss_denominator("sum", "ppo", [a, b]) == 1
    assert remote.loss_denominator("active_token_mean", "ppo", [a, b]) == 5  # not -100
    assert remote.loss_denominator("advantage_token_mean", "ppo", [a, b]) == 3
    ce = Datum(
        ModelInput.from_ints([1, 2, 3]),
        {
            "target_tokens": TensorData.from_list([2, -100, 4], "int64"),
            "weights": TensorData.from_list([0.0, 1.0, 1.0]),
        },
    )
    assert remote.loss_denominator("active_token_mean", "cross_entropy", [ce]) == 1
    assert remote.loss_denominator("advantage_token_mean", "cross_entropy", [ce]) == 1
    nothing = policy_datum([-100], [0.0], [0.0])
    assert remote.loss_denominator("active_token_mean", "ppo", [nothing]) == 1  # never 0


def test_clip_thresholds_go_only_to_losses_that_clip():
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    assert remote.loss_config("ppo", config) == config
    assert remote.loss_config("cispo", config) == config
    assert remote.loss_config("importance_sampling", config) is None
    assert remote.loss_config("cross_entropy", None) is None


def test_ratio_metrics_follow_the_local_definitions():
    datum = policy_datum([5, 6, 7], [0.0, -1.0, -1.0], [0.0, 1.0, 1.0])
    current = np.array([0.3, -1.0 + np.log(1.5), -1.0], dtype=np.float64)
    metrics = remote.ratio_metrics(
        [datum], [current], {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    )
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["clip_fraction"] == pytest.approx(0.5)  # 1.5 outside, 1.0 inside
    assert metrics["approx_kl"] == pytest.approx(-np.log(1.5) / 2)


def test_pointer_directories_round_trip_and_refuse_other_backends(tmp_path):
    checkpoint = remote.RemoteCheckpoint("tinker", "tinker://run/weights/s1", "Qwen/Q", 16, 7)
    directory = remote.write_pointer(tmp_path / "state" / "s1", remote.STATE_FILE, checkpoint)
    assert remote.read_pointer(directory, remote.STATE_FILE, "tinker", "tinker://") == checkpoint
    remote.write_pointer(directory, remote.STATE_FILE, checkpoint)  # replaced, not nested
    assert sorted(p.name for p in directory.iterdir()) == [remote.STATE_FILE]
    with pytest.raises(BackendError, match='saved on .tinker.; set model.backend = "tinker"'):
        remote.read_pointer(directory, remote.STATE_FILE, "pytrio", "")
    bare = remote.read_pointer("tinker://run/weights/s2", remote.STATE_FILE, "tinker", "tinker://")
    assert bare.remote_path == "tinker://run/weights/s2" and bare.steps == 0
    with pytest.raises(BackendError, match="not a tinker path"):
        remote.read_pointer("trio://x/y", remote.STATE_FILE, "tinker", "tinker://")
    local = tmp_path / "local"
    local.mkdir()
    (local / remote.STATE_FILE).write_text(json.dumps({"format": 1, "base_model": "m"}))
    with pytest.raises(BackendError, match='a local checkpoint.*model.backend = "local"'):
        remote.read_pointer(local, remote.STATE_FILE, "pytrio", "")
    with pytest.raises(BackendError, match="no retool_state.json"):
        remote.read_pointer(tmp_path, remote.STATE_FILE, "pytrio", "")


def test_limits_are_checked_before_any_request():
    remote.check_checkpoint_name("step_000010", "pytrio")
    for bad in ("", "a/b", "has space", ".hidden", "x" * 201):
        with pytest.raises(BackendError, match="checkpoint name"):
            remote.check_checkpoint_name(bad, "pytrio")
    long = policy_datum([1] * 9, [0.0] * 9, [1.0] * 9)
    remote.check_lengths([long], None, "tinker")
    remote.check_lengths([long], 9, "tinker")
    with pytest.raises(BackendError, match=r"datum 0 has 9 tokens, more .* max_seq_len \(8\)"):
        remote.check_lengths([long], 8, "tinker")
    with pytest.raises(BackendError, match="unknown loss_fn 'dpo'"):
        remote.check_loss_inputs([long], "dpo", "tinker")
    with pytest.raises(BackendError, match="lacks loss_fn_inputs\\['weights'\\]"):
        remote.check_loss_inputs([long], "cross_entropy", "tinker")


def test_model_config_checks_the_remote_settings():
    assert ModelConfig(backend="pytrio", lora_rank=64).loss_reduction == "auto"
    assert remote.resolve_loss_reduction("auto", "pytrio") == "active_token_mean"
    assert remote.resolve_loss_reduction("auto", "tinker") == "sum"
    assert remote.resolve_loss_reduction("sum", "pytrio") == "sum"
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
