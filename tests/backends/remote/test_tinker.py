"""The Tinker adapter: conversions to and from the SDK's own types, and a round trip.

The round trip runs the real ``tinker`` SDK against the fake service in
``fake_tinker.py`` (an ``httpx.MockTransport``; protobuf built with the SDK's
own ``tinker_public_pb2``): futures of clients, forward_backward with one
retried 503, metric names, optim_step, checkpoints, sampling with decoded
text, an SDK error, and resume through
``create_training_client_from_state_with_optimizer``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
from pathlib import Path

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")

from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402

from retool.backends import service_client  # noqa: E402
from retool.backends.remote import losses  # noqa: E402
from retool.backends.tinker import (  # noqa: E402
    TinkerSamplingClient,
    TinkerTrainingClient,
    our_metrics,
)
from retool.config import ModelConfig  # noqa: E402
from retool.errors import BackendError, ConfigError, DependencyError  # noqa: E402
from retool.types import AdamParams, ModelInput, SamplerStop, SamplingParams  # noqa: E402
from tests.backends.remote.fakes import EOS, Policy  # noqa: E402
from tests.backends.remote.test_pytrio import (  # noqa: E402
    CLIP,
    DATUMS,
    awaited,
    local_update,
    rl_datum,
)


def test_datums_sampling_and_adam_params_convert_into_tinker_types(tokenizer_dir):
    trainer = TinkerTrainingClient(None, None, "m", 8)
    sent = [trainer._sdk_datum(d.model_input, losses.loss_inputs(d, "ppo", 1.0)) for d in DATUMS]
    for ours, theirs in zip(DATUMS, sent, strict=True):
        assert isinstance(theirs, tinker.types.Datum)
        assert theirs.model_input.to_ints() == ours.model_input.to_ints()
        assert set(theirs.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
        for key, dtype in [("target_tokens", "int64"), ("logprobs", "float32")]:
            tensor = theirs.loss_fn_inputs[key]
            assert (tensor.dtype, list(tensor.shape)) == (dtype, [ours.model_input.length])
            assert tensor.to_numpy() == pytest.approx(ours.loss_fn_inputs[key].to_numpy())
        advantages = theirs.loss_fn_inputs["advantages"].to_numpy()
        assert advantages == pytest.approx(ours.loss_fn_inputs["advantages"].to_numpy())  # sums
    # The SDK's own wire encoding keeps the three keys, unshifted.
    request = tinker.types.ForwardBackwardRequest(
        forward_backward_input=tinker.types.ForwardBackwardInput(
            data=sent, loss_fn="ppo", loss_fn_config=CLIP
        ),
        model_id="m",
        seq_id=1,
    )
    wire = forward_backward_request_to_proto(request)
    assert sorted(wire.data[0].loss_fn_inputs) == ["advantages", "logprobs", "target_tokens"]
    tokens = np.frombuffer(wire.data[0].model_input[0].encoded_text.tokens, dtype=np.int32)
    assert tokens.tolist() == DATUMS[0].model_input.to_ints()
    assert dict(wire.loss_fn_config) == pytest.approx(CLIP)

    from transformers import AutoTokenizer

    sampler = TinkerSamplingClient(None, tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir))
    params = sampler._sdk_params(
        SamplingParams(max_tokens=7, temperature=0.5, top_p=0.8, top_k=3, seed=9, stop=(EOS, "w9"))
    )
    assert isinstance(params, tinker.types.SamplingParams)
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed) == (
        7,
        0.5,
        0.8,
        3,
        9,
    )
    assert params.stop == ["w9", "<eos>"]
    assert sampler._sdk_params(SamplingParams(max_tokens=2, stop=(EOS,))).stop == [EOS]

    class Recorder:
        def optim_step(self, params):
            self.params = params
            return concurrent.futures.Future()

    trainer.sdk = Recorder()
    adam = AdamParams(learning_rate=3e-5, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.1)
    trainer.optim_step(adam)
    assert isinstance(trainer.sdk.params, tinker.types.AdamParams)
    assert trainer.sdk.params.model_dump() == adam.__dict__


def test_tinker_responses_convert_into_ours(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    sampler = TinkerSamplingClient(None, tokenizer=tokenizer)
    response = tinker.types.SampleResponse(
        sequences=[
            tinker.types.SampledSequence(
                stop_reason="stop",
                sequence_id="a",
                _tokens_list=[7, 8, EOS],
                _logprobs_list=[-1.0] * 3,
            ),
            tinker.types.SampledSequence(
                stop_reason="length", sequence_id="b", _tokens_list=[4], _logprobs_list=[-0.5]
            ),
        ]
    )
    ours = sampler._response(response, SamplingParams(max_tokens=3))
    assert [s.stop_reason for s in ours.sequences] == [SamplerStop.STOP, SamplerStop.LENGTH]
    # No text from Tinker: decoded here as the rollout decodes (special tokens skipped).
    assert ours.sequences[0].text == tokenizer.decode([7, 8, EOS], skip_special_tokens=True)
    assert ours.sequences[0].text == "w7 w8"
    assert ours.sequences[1].tokens == (4,) and ours.sequences[1].logprobs == (-0.5,)

    trainer = TinkerTrainingClient(None, None, "m", 8)
    output = tinker.types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord",
        loss_fn_outputs=[{"logprobs": tinker.types.TensorData.from_numpy(np.array([-0.5, -1.5]))}],
        metrics={"loss:sum": 3.0, "entropy:mean": 0.2, "tokens:max": 4.0, "x:hash2": 1.0},
    )
    outputs, loss_sum, extra = trainer._forward_output(output, 1)
    assert outputs[0]["logprobs"].dtype == "float32" and outputs[0]["logprobs"].shape == (2,)
    assert loss_sum == 3.0 and extra == {"entropy": 0.2, "tokens_max": 4.0}
    assert our_metrics({"grad_norm:mean": 1.0, "lr": 2.0}) == {"grad_norm": 1.0, "lr": 2.0}


def test_round_trip_through_the_sdk_against_a_fake_service(fake_tinker, tmp_path):
    fake = fake_tinker
    base = fake.base_model
    service = service_client(
        ModelConfig(backend="tinker", base_model=base, lora_rank=8), tmp_path / "checkpoints"
    )
    try:
        trainer = service.create_lora_training_client(base, rank=8, seed=3)
        assert trainer.max_context_tokens == fake.max_context_length

        fake.faults.fail("retrieve_future")  # the SDK polls again; no retry layer of ours
        out = trainer.forward_backward(DATUMS, "ppo", CLIP).result()
        assert fake.faults.served["retrieve_future"] == 1
        request = fake.forward_requests[-1]
        assert request.loss_fn == "ppo" and dict(request.loss_fn_config) == pytest.approx(CLIP)
        for ours, theirs in zip(DATUMS, request.data, strict=True):
            assert sorted(theirs.loss_fn_inputs) == ["advantages", "logprobs", "target_tokens"]
            sent = np.frombuffer(theirs.loss_fn_inputs["advantages"].dense, dtype=np.float32)
            assert sent == pytest.approx(ours.loss_fn_inputs["advantages"].to_numpy())
        loss, metrics, grad = local_update(DATUMS, "ppo", CLIP)
        assert fake.objectives[-1] == pytest.approx(loss, rel=1e-5)
        assert fake.gradients[-1] == pytest.approx(grad, rel=1e-5, abs=1e-9)
        assert out.metrics["loss:sum"] == pytest.approx(loss, rel=1e-5)
        for name in ("loss_tokens", "clip_fraction", "approx_kl", "ratio_max"):
            assert out.metrics[name] == pytest.approx(metrics[name], rel=1e-5), name
        assert out.metrics["entropy"] == 0.25 and "ignored:hash2" not in out.metrics

        step = trainer.optim_step(AdamParams(learning_rate=2e-5)).result()
        assert fake.optim_requests[-1]["adam_params"]["learning_rate"] == 2e-5
        assert step.metrics == {"learning_rate": 2e-5, "grad_norm": 0.5, "steps_max": 1, "step": 1}

        state = Path(trainer.save_state("step_000001").result().path)
        record = json.loads((state / "retool_state.json").read_text())
        assert record["backend"] == "tinker" and record["steps"] == 1
        assert record["remote_path"].startswith("tinker://")

        sampler = trainer.save_weights_and_get_sampling_client()
        assert sampler.max_context_tokens == fake.max_context_length
        params = SamplingParams(max_tokens=6, seed=4, stop=(EOS,))
        fake.faults.fail("asample")  # a 503 on submission: the SDK's HTTP client retries it
        response = asyncio.run(
            awaited(sampler.sample_async(ModelInput.from_ints([5, 6, 7]), 3, params))
        )
        assert fake.faults.served["asample"] == 1
        assert fake.sample_requests[-1]["sampling_params"]["stop"] == [EOS]
        expected = Policy.sample([5, 6, 7], 3, 6, 4)
        assert [list(s.tokens) for s in response.sequences] == [e[0] for e in expected]
        texts = [" ".join(f"w{t}" for t in e[0] if t != EOS) for e in expected]
        assert [s.text for s in response.sequences] == texts
        stops = [SamplerStop.STOP if e[2] else SamplerStop.LENGTH for e in expected]
        assert [s.stop_reason for s in response.sequences] == stops
        assert sampler.sample(ModelInput.from_ints([5, 6, 7]), 1, params).result().sequences
        assert sampler.compute_logprobs(ModelInput.from_ints([5, 6, 7])).result() == [
            None,
            -0.5,
            -0.5,
        ]

        fake.faults.fail("retrieve_future", status=403)  # fatal for the SDK
        with pytest.raises(BackendError, match="tinker: sample failed") as caught:
            sampler.sample(ModelInput.from_ints([5]), 1, params).result()
        assert caught.value.__cause__ is not None

        resumed = service.create_training_client_from_state_with_optimizer(str(state))
        model = list(fake.models.values())[-1]
        assert (model.source, model.restored_optimizer) == (record["remote_path"], True)
        assert resumed.steps == 1
        assert resumed.optim_step(AdamParams()).result().metrics["step"] == 2
        assert model.optimizer_steps == 2
        fresh = service.create_training_client_from_state(str(state))
        assert fresh.steps == 0 and list(fake.models.values())[-1].restored_optimizer is False

        weights = Path(trainer.save_weights_for_sampler("final").result().path)
        saved = json.loads((weights / "retool_sampler.json").read_text())["remote_path"]
        evaluator = service.create_sampling_client(model_path=str(weights))
        assert saved in fake.samplers.values()
        assert evaluator.sample(ModelInput.from_ints([9]), 1, params).result().sequences
    finally:
        service.close()


def test_limits_and_credentials(fake_tinker, tmp_path, monkeypatch):
    fake = fake_tinker
    fake.max_context_length = 5
    model = ModelConfig(backend="tinker", base_model=fake.base_model, lora_rank=8)
    service = service_client(model, tmp_path)
    try:
        with pytest.raises(ConfigError, match=">= 1"):
            service.create_lora_training_client(fake.base_model, rank=0)
        trainer = service.create_lora_training_client(fake.base_model, rank=8)
        with pytest.raises(BackendError, match=r"datum 0 has 6 tokens, .* max_seq_len \(5\)"):
            trainer.forward_backward(DATUMS, "ppo", CLIP).result()
        short = [rl_datum([5], [6, 7], [-0.1, -0.2], 1.0)]
        assert trainer.forward_backward(short, "importance_sampling", CLIP).result()
        assert not fake.forward_requests[-1].loss_fn_config  # no clip for a loss without one
        with pytest.raises(BackendError, match="checkpoint name 'a/b'"):
            trainer.save_state("a/b").result()
    finally:
        service.close()

    monkeypatch.delenv("TINKER_API_KEY")
    seen = set(fake.seen_keys)
    with pytest.raises(BackendError) as caught:
        service_client(model, tmp_path)
    assert str(caught.value) == (
        "tinker needs an API key: set TINKER_API_KEY (or TINKER_CREDENTIAL_CMD) "
        "or run `tinker auth login`"
    )
    assert fake.seen_keys == seen  # refused before any request
    monkeypatch.setenv("TINKER_API_KEY", "not-a-tinker-key")
    with pytest.raises(BackendError, match="'tml-' prefix"):
        service_client(model, tmp_path)
    monkeypatch.setitem(sys.modules, "tinker", None)
    with pytest.raises(DependencyError, match=r"pip install 'retool-rl\[tinker\]'"):
        service_client(model, tmp_path)
