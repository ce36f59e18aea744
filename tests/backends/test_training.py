"""The local trainer: logprobs, losses, accumulation, snapshots, checkpoints."""

import numpy as np
import pytest
import torch

from retool.errors import BackendError
from retool.types import AdamParams, Datum, ModelInput, SamplingParams, TensorData


def _datum(tokens, advantage=1.0, old=-2.0, weights=None):
    n = len(tokens) - 1
    inputs = {
        "target_tokens": TensorData.from_list(tokens[1:], "int64"),
        "logprobs": TensorData.from_list([old] * n),
        "advantages": TensorData.from_list([advantage] * n),
    }
    if weights is not None:
        inputs["weights"] = TensorData.from_list(weights)
    return Datum(ModelInput.from_ints(tokens[:-1]), inputs)


DATA = [
    _datum(list(range(10, 40)), 1.0),
    _datum(list(range(50, 62)), -0.5),
    _datum(list(range(70, 91)), 0.25, old=-11.0),
]
ADAM = AdamParams(learning_rate=5e-3, grad_clip_norm=1.0)


@pytest.fixture
def lora(service):
    return service.create_lora_training_client("tiny-random", rank=4, seed=0)


def _grads(client):
    return [p.grad.clone() if p.grad is not None else None for p in client._params]


def test_forward_logprobs_match_full_logits_and_right_padding(lora):
    out = lora.forward(DATA, "ppo").result()
    model = lora._causal_lm()
    for datum, result in zip(DATA, out.loss_fn_outputs, strict=True):
        ids = torch.tensor([datum.model_input.to_ints()])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float().log_softmax(-1)
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
        expected = logits[torch.arange(len(targets)), torch.from_numpy(targets)].numpy()
        np.testing.assert_allclose(result["logprobs"].to_numpy(), expected, atol=1e-5)
    alone = lora.forward(DATA[1:2], "ppo").result()
    np.testing.assert_allclose(
        alone.loss_fn_outputs[0]["logprobs"].to_numpy(),
        out.loss_fn_outputs[1]["logprobs"].to_numpy(),
        atol=1e-5,
    )


def test_metrics_and_sum_reduction(lora):
    out = lora.forward(DATA, "importance_sampling").result()
    new = np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])
    old = np.concatenate([d.loss_fn_inputs["logprobs"].to_numpy() for d in DATA])
    adv = np.concatenate([d.loss_fn_inputs["advantages"].to_numpy() for d in DATA])
    assert out.metrics["loss:sum"] == pytest.approx(-(np.exp(new - old) * adv).sum(), rel=1e-4)
    assert out.metrics["loss_tokens"] == sum(d.model_input.length for d in DATA)
    assert 0 <= out.metrics["clip_fraction"] <= 1 and out.metrics["ratio_max"] > 0


def test_gradient_accumulation_equals_one_call(service):
    one = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    two = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    # Make B non-zero so every LoRA parameter gets a gradient.
    one.forward_backward(DATA, "ppo").result()
    one.optim_step(ADAM).result()
    two.forward_backward(DATA, "ppo").result()
    two.optim_step(ADAM).result()
    one.forward_backward(DATA, "ppo").result()
    two.forward_backward(DATA[:2], "ppo").result()
    two.forward_backward(DATA[2:], "ppo").result()
    for a, b in zip(_grads(one), _grads(two), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    norm_one = one.optim_step(ADAM).result().metrics["grad_norm"]
    norm_two = two.optim_step(ADAM).result().metrics["grad_norm"]
    assert norm_one == pytest.approx(norm_two, rel=1e-4)
    assert all(p.grad is None for p in one._params)  # optim_step clears gradients


def test_cross_entropy_uses_weights(lora):
    tokens = list(range(10, 20))
    half = _datum(tokens, weights=[1.0] * 4 + [0.0] * 5)
    out = lora.forward([half], "cross_entropy").result()
    logprobs = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert out.metrics["loss:sum"] == pytest.approx(-logprobs[:4].sum(), rel=1e-5)
    assert out.metrics["loss_tokens"] == 4


def test_snapshot_is_frozen(lora):
    prompt = ModelInput.from_ints(list(range(10, 30)))
    params = SamplingParams(max_tokens=12, seed=4)
    sampler = lora.save_weights_and_get_sampling_client()
    before = sampler.sample(prompt, 2, params).result()
    for _ in range(3):
        lora.forward_backward(DATA, "ppo").result()
        lora.optim_step(AdamParams(learning_rate=5e-2)).result()
    after = sampler.sample(prompt, 2, params).result()

    def gap(x, y):
        return max(
            abs(a - b)
            for s, t in zip(x.sequences, y.sequences, strict=True)
            for a, b in zip(s.logprobs, t.logprobs, strict=True)
        )

    assert [s.tokens for s in before.sequences] == [s.tokens for s in after.sequences]
    assert gap(before, after) < 1e-5  # only float rounding (the prefix cache path)
    fresh = lora.save_weights_and_get_sampling_client().sample(prompt, 2, params).result()
    assert gap(fresh, before) > 1e-3  # the trained weights do sample differently
    sampler.close()


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_snapshot_reuses_a_closed_clients_model_with_the_current_weights(service, kind):
    trainer = (
        service.create_lora_training_client("tiny-random", rank=4, seed=0)
        if kind == "lora"
        else service.create_training_client("tiny-random", seed=0)
    )

    def train_step():
        trainer.forward_backward(DATA, "ppo").result()
        trainer.optim_step(ADAM).result()

    train_step()
    first = trainer.save_weights_and_get_sampling_client()
    reused = first.engine.model
    first.close()
    with pytest.raises(RuntimeError, match="closed"):
        first.compute_logprobs(ModelInput.from_ints([1, 2, 3])).result()
    train_step()
    second = trainer.save_weights_and_get_sampling_client()
    assert second.engine.model is reused  # refreshed in place, not copied
    expected = trainer.snapshots.copy().state_dict()  # deepcopy + PEFT merge_and_unload
    got = second.engine.model.state_dict()
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    # An open client keeps its weights: the next snapshot gets a model of its own.
    third = trainer.save_weights_and_get_sampling_client()
    assert third.engine.model is not second.engine.model
    for client in (second, third):
        client.close()


def test_shared_prefix_equals_the_plain_computation(service):
    """Datums with a common prefix: the prefix computed once gives the same logprobs,
    loss and gradients as every datum computed in full (recomputed layers included)."""
    trainer = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    trainer.forward_backward(DATA, "ppo").result()  # non-zero LoRA B: the adapters matter
    trainer.optim_step(ADAM).result()
    prefix = list(range(300, 340))
    data = [
        _datum(prefix + list(range(500, 530)), 1.0),
        _datum(prefix + list(range(600, 612)), -0.5),
        _datum([*prefix, 7], 0.25, old=-11.0),  # the input is exactly the shared prefix
        _datum(prefix + list(range(700, 745)), -1.0),
    ]
    # Different targets inside the prefix (not a shifted copy of the input): the prefix
    # positions are then computed per datum.
    odd = Datum(
        data[1].model_input,
        {**data[1].loss_fn_inputs, "target_tokens": TensorData.from_list([5] * 51, "int64")},
    )

    def run(batch, share):
        trainer.share_prefix = share
        for p in trainer._params:
            p.grad = None
        out = trainer.forward_backward(batch, "ppo").result()
        return out, _grads(trainer)

    for batch in (data, [data[0], odd, data[3]]):
        plain, plain_grads = run(batch, False)
        shared, shared_grads = run(batch, True)
        for a, b in zip(plain.loss_fn_outputs, shared.loss_fn_outputs, strict=True):
            np.testing.assert_allclose(
                a["logprobs"].to_numpy(), b["logprobs"].to_numpy(), atol=1e-5, rtol=0
            )
        assert plain.metrics["loss:sum"] == pytest.approx(shared.metrics["loss:sum"], rel=1e-5)
        for a, b in zip(plain_grads, shared_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    trainer.share_prefix = True


def test_save_and_restore_is_exact(service):
    original = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    for _ in range(2):
        original.forward_backward(DATA, "ppo").result()
        original.optim_step(ADAM).result()
    path = original.save_state("step-2").result().path
    restored = service.create_training_client_from_state_with_optimizer(path)
    assert restored.steps == 2
    weights_only = service.create_training_client_from_state(path)
    torch.testing.assert_close(
        list(weights_only.trainable_state().values()), list(original.trainable_state().values())
    )
    assert weights_only._optimizer is None  # a new phase starts with fresh moments
    for client in (original, restored):
        client.forward_backward(DATA, "ppo").result()
        client.optim_step(ADAM).result()
    for a, b in zip(
        original.trainable_state().values(), restored.trainable_state().values(), strict=True
    ):
        torch.testing.assert_close(a, b)
    # Saving again over the same name replaces the checkpoint atomically.
    again = original.save_state("step-2").result().path
    assert again == path
    assert not [p for p in (service.checkpoint_root / "state").iterdir() if p.name.startswith(".")]


def test_sampler_weights_load_with_peft_and_merge(service, lora, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from retool.backends.local.models import load_model

    lora.forward_backward(DATA, "ppo").result()
    lora.optim_step(ADAM).result()
    adapter = lora.save_weights_for_sampler("adapter").result().path
    merged = lora.save_weights_for_sampler("merged", merge=True).result().path
    ids = torch.tensor([list(range(10, 30))])
    with torch.no_grad():
        expected = lora.model(input_ids=ids).logits
        peft = PeftModel.from_pretrained(load_model("tiny-random", seed=0), adapter)
        torch.testing.assert_close(peft(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-4)
        full = AutoModelForCausalLM.from_pretrained(merged)
        torch.testing.assert_close(full(input_ids=ids).logits, expected, atol=1e-4, rtol=1e-4)


def test_full_fine_tuning_trains_every_weight(service):
    client = service.create_training_client("tiny-random", seed=0)
    assert len(client._params) == len(list(client.model.parameters()))
    before = client.trainable_state()
    client.forward_backward(DATA, "ppo").result()
    client.optim_step(ADAM).result()
    changed = [
        not torch.equal(before[n], p.detach())
        for n, p in zip(client._names, client._params, strict=True)
    ]
    assert sum(changed) > len(changed) // 2


def test_clear_errors(lora):
    too_long = _datum(list(range(9000)))
    with pytest.raises(BackendError, match="datum 0 has 8999 tokens, more than max_context"):
        lora.forward_backward([too_long], "ppo").result()
    with pytest.raises(BackendError, match="unknown loss_fn"):
        lora.forward_backward(DATA, "dpo").result()
    with pytest.raises(BackendError, match=r"lacks loss_fn_inputs\['weights'\]"):
        lora.forward_backward(DATA, "cross_entropy").result()
    with pytest.raises(BackendError, match="not a retool checkpoint"):
        lora.load_state("/nonexistent").result()


def test_failed_save_leaves_no_partial_checkpoint(lora, monkeypatch):
    import safetensors.torch

    root = lora.checkpoint_root / "state"
    good = lora.save_state("kept").result().path

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    # One line naming the checkpoint and the cause, the previous checkpoint kept.
    with pytest.raises(BackendError, match=r"kept: cannot write the checkpoint \(disk full\)"):
        lora.save_state("kept").result()
    with pytest.raises(BackendError, match=r"never: cannot write the checkpoint \(disk full\)"):
        lora.save_state("never").result()
    assert not (root / "never").exists()
    assert (root / "kept" / "retool_state.json").exists() and good.endswith("kept")
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
