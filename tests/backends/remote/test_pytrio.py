"""The PyTRIO adapter: conversions to and from the SDK's own types, and a round trip.

The round trip runs the real ``pytrio`` SDK against the fake service in
``fake_pytrio.py`` (an ``httpx.MockTransport``): creation, forward_backward,
optim_step, checkpoints, sampling (sync and await, one retried 503, one SDK
error), and resume through ``create_training_client_from_state_with_optimizer``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytrio = pytest.importorskip("pytrio")

from pytrio.client.builders.sampling import build_sample_request  # noqa: E402
from pytrio.client.builders.training import build_trainer_forward_payload  # noqa: E402
from pytrio.client.training_batch import plan_training_batch  # noqa: E402
from pytrio.model.limits import TrainingLimits  # noqa: E402

from retool.backends import service_client  # noqa: E402
from retool.backends.pytrio import PytrioSamplingClient, PytrioTrainingClient  # noqa: E402
from retool.backends.remote import losses  # noqa: E402
from retool.config import ModelConfig  # noqa: E402
from retool.errors import BackendError, ConfigError, DependencyError  # noqa: E402
from retool.types import (  # noqa: E402
    AdamParams,
    Datum,
    ModelInput,
    SamplerStop,
    SamplingClient,
    SamplingParams,
    ServiceClient,
    TensorData,
    TrainingClient,
)
from tests.backends.remote.fakes import EOS, VOCAB, Policy  # noqa: E402

BASE = "Qwen/Qwen3-4B"
CLIP = {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05}


def rl_datum(prompt: list[int], completion: list[int], old: list[float], advantage: float):
    """A shifted datum as ``training/datum.py`` builds it: prompt positions carry 0 and 0."""
    tokens = prompt + completion
    logprobs = [0.0] * len(prompt) + old
    advantages = [0.0] * len(prompt) + [advantage] * len(completion)
    return Datum(
        ModelInput.from_ints(tokens[:-1]),
        {
            "target_tokens": TensorData.from_list(tokens[1:], "int64"),
            "logprobs": TensorData.from_list(logprobs[1:]),
            "advantages": TensorData.from_list(advantages[1:]),
            "mask": TensorData.from_list([float(a != 0) for a in advantages[1:]]),
        },
    )


DATUMS = [
    rl_datum([5, 6, 7], [20, 21, 22, 23], [-0.5, -1.0, -0.2, -0.7], 0.75),
    rl_datum([5, 6], [30, 31, 32], [-0.3, -0.1, -2.0], -0.25),
]


async def awaited(awaitable):
    """``await`` from an event loop, as the rollout does."""
    return await awaitable


def local_update(data, loss_fn, config):
    """The local backend's summed loss, metrics and per-token gradient for the fake's policy."""
    import torch

    from retool.backends.local.losses import compute_loss

    old = np.concatenate([d.loss_fn_inputs["logprobs"].to_numpy() for d in data]).astype(float)
    adv = np.concatenate([d.loss_fn_inputs["advantages"].to_numpy() for d in data]).astype(float)
    current = torch.tensor(
        np.concatenate([Policy.current(d.loss_fn_inputs["logprobs"].to_numpy()) for d in data]),
        dtype=torch.float64,
        requires_grad=True,
    )
    inputs = {"logprobs": torch.tensor(old), "advantages": torch.tensor(adv)}
    loss, metrics = compute_loss(loss_fn, current, inputs, config)
    loss.backward()
    return float(loss.detach()), metrics, current.grad.numpy()


def test_datums_sampling_and_adam_params_convert_into_pytrio_types(tokenizer_dir):
    trainer = PytrioTrainingClient(None, None, BASE, 8)
    scale = losses.loss_denominator("active_token_mean", "ppo", DATUMS)
    sent = [trainer._sdk_datum(d.model_input, losses.loss_inputs(d, "ppo", scale)) for d in DATUMS]
    for ours, theirs in zip(DATUMS, sent, strict=True):
        assert isinstance(theirs, pytrio.Datum)
        assert theirs.model_input.to_ints() == ours.model_input.to_ints()
        assert set(theirs.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
        n = ours.model_input.length
        for key, dtype in [("target_tokens", "int64"), ("logprobs", "float32")]:
            tensor = theirs.loss_fn_inputs[key]
            assert (tensor.dtype, tensor.shape) == (dtype, [n])
            assert tensor.data == pytest.approx(ours.loss_fn_inputs[key].tolist())
        advantages = ours.loss_fn_inputs["advantages"].to_numpy() * scale
        assert theirs.loss_fn_inputs["advantages"].data == pytest.approx(advantages.tolist())

    # The SDK's own planner and builder: no weights for a policy loss, no shift, and the
    # denominator it sends is the one the adapter scaled by.
    plan = plan_training_batch(
        sent,
        loss_fn="ppo",
        auto_shift=False,
        limits=TrainingLimits(None, None, None),
        tokenizer_vocab_size=VOCAB,
    )
    assert plan.totals.total_active_tokens == scale == sum(d.model_input.length for d in DATUMS)
    wire = build_trainer_forward_payload(plan.chunks[0], CLIP, False, plan.totals)
    assert [d.weights for d in wire.data] == [None, None]
    assert wire.data[0].target_ids == DATUMS[0].loss_fn_inputs["target_tokens"].tolist()
    assert wire.auto_shift is False and wire.loss.config == CLIP

    from transformers import AutoTokenizer

    sampler = PytrioSamplingClient(None, tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir))
    params = SamplingParams(max_tokens=7, temperature=0.7, top_p=0.9, top_k=20, seed=5)
    mixed = sampler._sdk_params(SamplingParams(**{**params.__dict__, "stop": (EOS, "w9")}))
    assert isinstance(mixed, pytrio.SamplingParams)
    assert (mixed.max_tokens, mixed.temperature, mixed.top_p, mixed.top_k, mixed.seed) == (
        7,
        0.7,
        0.9,
        20,
        5,
    )
    assert mixed.stop == ["w9", "<eos>"]
    ids = sampler._sdk_params(SamplingParams(max_tokens=3, stop=(EOS,)))
    request = build_sample_request(
        pytrio.ModelInput.from_ints([5]),
        sampling_params=ids,
        num_samples=2,
        include_prompt_logprobs=False,
        topk_prompt_logprobs=0,
        return_text=True,
        return_token_logprobs=True,
    )
    assert request.sampling_params["stop_token_ids"] == [EOS]

    class Recorder:
        def optim_step(self, params):
            self.params = params
            return concurrent.futures.Future()

    trainer.sdk = Recorder()
    adam = AdamParams(learning_rate=3e-5, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.1)
    trainer.optim_step(adam)
    assert isinstance(trainer.sdk.params, pytrio.AdamParams)
    assert trainer.sdk.params.model_dump() == adam.__dict__


def test_pytrio_responses_convert_into_ours():
    sampler = PytrioSamplingClient(None)
    sequence = pytrio.types.SampleSequence
    response = pytrio.types.SampleResponse(
        sequences=[
            sequence(stop_reason="stop", tokens=[7, 1], text="w7", logprobs=[-1.0, -0.5]),
            sequence(stop_reason="", tokens=[4, 5, 6], logprobs=[-0.1] * 3),
        ]
    )
    ours = sampler._response(response, SamplingParams(max_tokens=3))
    assert [s.stop_reason for s in ours.sequences] == [SamplerStop.STOP, SamplerStop.LENGTH]
    assert ours.sequences[0].tokens == (7, 1) and ours.sequences[0].logprobs == (-1.0, -0.5)
    assert ours.sequences[0].text == "w7" and ours.sequences[1].text is None

    trainer = PytrioTrainingClient(None, None, BASE, 8)
    output = pytrio.types.ForwardBackwardOutput(
        loss_fn_outputs=[{"logprobs": pytrio.types.TensorData.from_numpy(np.array([-0.5, -1.5]))}],
        metrics={"loss_sum": 6.0, "loss_mean": 3.0, "token_count": 2},
    )
    outputs, loss_sum, extra = trainer._forward_output(output, 1)
    assert outputs[0]["logprobs"].dtype == "float32" and outputs[0]["logprobs"].shape == (2,)
    assert outputs[0]["logprobs"].tolist() == [-0.5, -1.5]
    assert (loss_sum, extra) == (6.0, {"service_tokens": 2.0})
    with pytest.raises(BackendError, match="2 outputs|1 outputs for 2"):
        trainer._forward_output(output, 2)


def test_round_trip_through_the_sdk_against_a_fake_service(fake_pytrio, tmp_path):
    fake = fake_pytrio
    model = ModelConfig(backend="pytrio", base_model=BASE, lora_rank=8)
    service = service_client(model, checkpoint_root=tmp_path / "checkpoints")
    trainer = service.create_lora_training_client(BASE, rank=8, seed=3)
    assert trainer.max_context_tokens == fake.max_seq_len

    out = trainer.forward_backward(DATUMS, "ppo", CLIP).result()
    # What went over the wire: no mask or weights, no shift, advantages times the count.
    payload = fake.forward_payloads[-1]
    count = payload.gradient_accumulation.total_active_tokens
    assert count == losses.loss_denominator("active_token_mean", "ppo", DATUMS)
    assert payload.auto_shift is False and payload.loss.type == "ppo"
    assert dict(payload.loss.config) == CLIP
    for ours, theirs in zip(DATUMS, payload.data, strict=True):
        assert theirs.weights is None
        assert theirs.target_ids == ours.loss_fn_inputs["target_tokens"].tolist()
        sent = np.asarray(theirs.advantages)
        assert sent == pytest.approx(ours.loss_fn_inputs["advantages"].to_numpy() * count)
    # The same update as the local backend: the loss and its gradient per token.
    loss, metrics, grad = local_update(DATUMS, "ppo", CLIP)
    assert fake.objectives[-1] == pytest.approx(loss, rel=1e-5)
    assert fake.gradients[-1] == pytest.approx(grad, rel=1e-5, abs=1e-9)
    assert out.metrics["loss:sum"] == pytest.approx(loss, rel=1e-5)
    assert 0 < metrics["clip_fraction"] < 1  # the check covers clipped and unclipped tokens
    for name in ("loss_tokens", "clip_fraction", "approx_kl", "ratio_max"):
        assert out.metrics[name] == pytest.approx(metrics[name], rel=1e-5), name
    assert out.metrics["service_tokens"] == count
    for ours, got in zip(DATUMS, out.loss_fn_outputs, strict=True):
        expected = Policy.current(ours.loss_fn_inputs["logprobs"].to_numpy())
        assert got["logprobs"].dtype == "float32"
        assert got["logprobs"].to_numpy() == pytest.approx(expected, abs=1e-6)

    step = trainer.optim_step(AdamParams(learning_rate=2e-5, grad_clip_norm=1.0)).result()
    assert fake.optimize_payloads[-1]["adam_params"]["learning_rate"] == 2e-5
    assert fake.optimize_payloads[-1]["adam_params"]["grad_clip_norm"] == 1.0
    assert step.metrics["step"] == 1 and step.metrics["grad_norm"] == 0.5
    assert step.metrics["learning_rate"] == 2e-5

    state = Path(trainer.save_state("step_000001").result().path)
    assert state == tmp_path / "checkpoints" / "state" / "step_000001"
    record = json.loads((state / "retool_state.json").read_text())
    assert record["backend"] == "pytrio" and record["steps"] == 1 and record["lora_rank"] == 8
    assert record["remote_path"] in fake.checkpoints

    # Sampling: sync and await, one retried 503 (the SDK retries it, not us).
    sampler = trainer.save_weights_and_get_sampling_client()
    assert sampler.max_context_tokens == fake.max_seq_len
    fake.faults.fail("/sample")
    params = SamplingParams(max_tokens=6, seed=4, stop=(EOS,))
    response = asyncio.run(
        awaited(sampler.sample_async(ModelInput.from_ints([5, 6, 7]), 3, params))
    )
    assert fake.faults.served["/sample"] == 1
    assert fake.sample_requests[-1].sampling_params["stop_token_ids"] == [EOS]
    expected = Policy.sample([5, 6, 7], 3, 6, 4)
    assert [list(s.tokens) for s in response.sequences] == [e[0] for e in expected]
    assert [s.logprobs for s in response.sequences] == [pytest.approx(e[1]) for e in expected]
    stops = [SamplerStop.STOP if e[2] else SamplerStop.LENGTH for e in expected]
    assert [s.stop_reason for s in response.sequences] == stops
    again = sampler.sample(ModelInput.from_ints([5, 6, 7]), 1, params).result()
    assert again.sequences[0].tokens == response.sequences[0].tokens
    assert sampler.compute_logprobs(ModelInput.from_ints([5, 6, 7])).result() == [None, -0.5, -0.5]
    assert isinstance(service, ServiceClient) and isinstance(trainer, TrainingClient)
    assert isinstance(sampler, SamplingClient)

    # An error the SDK does not retry comes out of our future.
    fake.faults.fail("/sample", status=400)
    with pytest.raises(BackendError, match="pytrio: sample failed") as caught:
        sampler.sample(ModelInput.from_ints([5]), 1, params).result()
    assert isinstance(caught.value.__cause__, pytrio.PyTrioError)
    bad = [rl_datum([5], [VOCAB + 3], [-0.1], 1.0)]  # a token id the SDK refuses itself
    sent_before = len(fake.forward_payloads)
    with pytest.raises(BackendError, match="vocabulary"):
        trainer.forward_backward(bad, "ppo", CLIP).result()
    assert len(fake.forward_payloads) == sent_before

    # Resume: a new training run from the checkpoint, optimizer state and step counter.
    resumed = service.create_training_client_from_state_with_optimizer(str(state))
    run = list(fake.runs.values())[-1]
    assert (run.source, run.restore_optimizer) == (record["remote_path"], True)
    assert resumed.steps == 1 and resumed.lora_rank == 8
    assert resumed.optim_step(AdamParams()).result().metrics["step"] == 2
    assert fake.init_payloads[-1]["load_optimizer"] is True
    assert run.optimizer_steps == 2  # the service's optimizer continued from the checkpoint
    fresh = service.create_training_client_from_state(str(state))
    assert fresh.steps == 0 and list(fake.runs.values())[-1].restore_optimizer is False

    # `retool eval --model RUN_DIR` opens saved sampler weights through the pointer.
    weights = Path(trainer.save_weights_for_sampler("final").result().path)
    saved = json.loads((weights / "retool_sampler.json").read_text())["remote_path"]
    evaluator = service.create_sampling_client(model_path=str(weights))
    run = list(fake.runs.values())[-1]
    assert (run.source, run.base_model) == (saved, BASE)  # keywords, base model required
    assert evaluator.sample(ModelInput.from_ints([9]), 1, params).result().sequences


def test_limits_are_checked_before_any_request(fake_pytrio, tmp_path):
    fake = fake_pytrio
    fake.max_seq_len = 5
    service = service_client(ModelConfig(backend="pytrio", base_model=BASE, lora_rank=8), tmp_path)
    with pytest.raises(ConfigError, match=r"\[4, 64\]"):
        service.create_lora_training_client(BASE, rank=3)
    assert not fake.runs
    with pytest.raises(ConfigError, match="LoRA adapters only"):
        service.create_training_client(BASE)
    trainer = service.create_lora_training_client(BASE, rank=8)
    with pytest.raises(BackendError, match=r"datum 0 has 6 tokens, .* max_seq_len \(5\)"):
        trainer.forward_backward(DATUMS, "ppo", CLIP).result()
    assert not fake.forward_payloads
    with pytest.raises(BackendError, match="checkpoint name 'step 1'"):
        trainer.save_state("step 1").result()
    assert not fake.checkpoints


def test_credentials_come_from_the_sdk_and_a_missing_one_is_one_clear_error(
    fake_pytrio, tmp_path, monkeypatch
):
    from pytrio.config.config import auth_state

    from tests.backends.remote.fake_pytrio import API_KEY

    fake = fake_pytrio
    model = ModelConfig(backend="pytrio", base_model=BASE, lora_rank=8)
    monkeypatch.setattr(auth_state, "api_key", "")
    with pytest.raises(BackendError) as caught:
        service_client(model, tmp_path)
    assert str(caught.value) == "pytrio needs an API key: set PYTRIO_API_KEY or run `trio login`"
    assert not fake.seen_keys  # refused before any request
    monkeypatch.setenv("PYTRIO_API_KEY", API_KEY)  # set after the SDK was imported
    service_client(model, tmp_path).create_lora_training_client(BASE, rank=8)
    assert fake.seen_keys == {API_KEY}
    monkeypatch.setitem(sys.modules, "pytrio", None)
    with pytest.raises(DependencyError, match=r"pip install 'retool-rl\[pytrio\]'"):
        service_client(model, tmp_path)
