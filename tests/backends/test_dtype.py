"""``model.dtype = "auto"``: the per-role choice from (injected) timings, its record,
and bf16 training and sampling against float32 on ``tiny-random``."""

import numpy as np
import pytest
import torch

from retool.backends.local.dtype import (
    BF16_MARGIN,
    ModelShapes,
    Numerics,
    Workload,
    choose_dtype,
    resolve_numerics,
    time_projections,
)
from retool.errors import ConfigError
from retool.types import AdamParams, ModelInput, SamplingParams
from tests.builders import policy_datum

SHAPES = ModelShapes(hidden=64, intermediate=128, kv=32, vocab=1000, layers=2)
SMOLLM2 = ModelShapes(hidden=576, intermediate=1536, kv=192, vocab=49152, layers=30)
HOST = {"cpu": "test", "flags": "avx512_bf16 amx_bf16 avx2"}  # a host where bf16 may pay


def test_bf16_is_chosen_only_beyond_the_margin():
    assert choose_dtype(1.0, 1.0 / (BF16_MARGIN + 0.01)) == "bfloat16"
    assert choose_dtype(1.0, 1.0 / (BF16_MARGIN - 0.01)) == "float32"  # faster, not enough
    assert choose_dtype(1.0, 3.0) == "float32"
    assert choose_dtype(1.0, 0.0) == "float32"


def _timer(speedups):
    """Fake timings: float32 takes rows ms; bf16 rows / speedup[role rows] ms."""
    calls = []

    def timer(shapes, rows, dtype, give_up_after):
        calls.append((rows, dtype))
        seconds = rows * 1e-3 if dtype == "float32" else rows * 1e-3 / speedups[rows]
        if give_up_after is not None and seconds > give_up_after:
            return give_up_after * 1.01, False
        return seconds, True

    return timer, calls


def test_auto_chooses_per_role_from_the_timings():
    # bf16 slower at the sampler's 16 rows (as on AMX hosts at few rows), 3x at 4096.
    timer, calls = _timer({16: 0.5, 4096: 3.0})
    numerics = resolve_numerics("auto", SMOLLM2, Workload(16, 4096), timer=timer, host=HOST)
    assert (numerics.sampler, numerics.trainer) == ("float32", "bfloat16")
    sampler, trainer = numerics.timings
    assert sampler.stopped_early and sampler.chosen == "float32" and sampler.speedup < 1
    assert trainer.speedup == pytest.approx(3.0) and not trainer.stopped_early
    assert calls == [(16, "float32"), (16, "bfloat16"), (4096, "float32"), (4096, "bfloat16")]
    assert "trainer bf16 3.00x at 4096 rows" in numerics.summary()
    assert Numerics.from_dict(numerics.to_dict()) == numerics


def test_the_trainer_is_timed_without_the_head_which_stays_float32():
    seen = []

    def timer(shapes, rows, dtype, give_up_after):
        seen.append((rows, shapes.vocab))
        return (1.0 if dtype == "float32" else 0.25), True

    numerics = resolve_numerics("auto", SMOLLM2, Workload(16, 4096), timer=timer, host=HOST)
    assert seen == [(16, SMOLLM2.vocab), (16, SMOLLM2.vocab), (4096, 0), (4096, 0)]
    assert numerics.trainer == "bfloat16"
    # tiny-random: a 49,152-word head on a 64-wide decoder. Without its head the trainer
    # is microseconds of work, so it stays float32 unmeasured on every host.
    tiny = ModelShapes(hidden=64, intermediate=128, kv=32, vocab=49152, layers=2)
    seen.clear()
    numerics = resolve_numerics("auto", tiny, Workload(32, 4096), timer=timer, host=HOST)
    assert (numerics.sampler, numerics.trainer) == ("float32", "float32") and seen == []


def test_auto_never_picks_bf16_on_noise_and_explicit_values_are_not_measured():
    timer, calls = _timer({32: 1.1, 4096: 1.15})
    numerics = resolve_numerics("auto", SMOLLM2, Workload(32, 4096), timer=timer, host=HOST)
    assert numerics.all_float32
    for explicit in ("float32", "bfloat16", "float16"):
        calls.clear()
        chosen = resolve_numerics(explicit, SHAPES, Workload(), timer=timer, host=HOST)
        assert (chosen.sampler, chosen.trainer, chosen.timings) == (explicit, explicit, ())
        assert calls == []


def test_a_cpu_without_bf16_instructions_stays_float32_unmeasured():
    timer, calls = _timer({16: 10.0, 4096: 10.0})
    avx2 = {"cpu": "test", "flags": "avx2"}
    numerics = resolve_numerics("auto", SMOLLM2, Workload(16, 4096), timer=timer, host=avx2)
    assert numerics.all_float32 and calls == []
    assert "no bf16 instructions on this CPU" in numerics.summary()


def test_a_tiny_model_stays_float32_unmeasured():
    timer, calls = _timer({8: 10.0, 65536: 10.0})
    numerics = resolve_numerics("auto", SHAPES, Workload(8, 65536), timer=timer, host=HOST)
    # Decoding 8 rows is ~2 MFLOP: not measured; 65536 training positions are 18 GFLOP.
    assert numerics.sampler == "float32" and calls[0] == (65536, "float32")
    assert numerics.trainer == "bfloat16"
    assert "sampler not measured at 8 rows" in numerics.summary()


def test_the_real_timer_measures_and_stops_early():
    seconds, complete = time_projections(SHAPES, 4, "float32")
    assert seconds > 0 and complete
    partial, complete = time_projections(SHAPES, 4, "bfloat16", give_up_after=0.0)
    assert not complete and partial > 0


def test_shapes_and_workload_from_configs():
    from retool.backends.local.models import tiny_random_config
    from retool.config import load_config

    shapes = ModelShapes.from_config(tiny_random_config(49152))
    assert shapes == ModelShapes(hidden=64, intermediate=128, kv=32, vocab=49152, layers=2)
    config = load_config(None, ["train.questions_per_batch=4", "rollout.group_size=4"])
    assert Workload.from_config(config) == Workload(decode_rows=16, train_rows=16384)
    wide = load_config(None, ["train.questions_per_batch=100"])  # capped by samples in flight
    assert Workload.from_config(wide).decode_rows == 64


def test_a_pinned_choice_conflicting_with_an_explicit_dtype_is_refused(tmp_path):
    from retool.backends.local import LocalServiceClient

    pinned = Numerics("auto", "float32", "bfloat16", (), HOST)
    with pytest.raises(ConfigError, match="differs from the run's recorded numerics"):
        LocalServiceClient(dtype="float32", checkpoint_root=tmp_path, numerics=pinned)
    service = LocalServiceClient(
        dtype="auto", checkpoint_root=tmp_path, numerics=pinned, compile="off"
    )
    trainer = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    assert service.numerics is pinned  # a resumed auto run keeps its choice, unmeasured
    assert trainer.autocast_dtype == torch.bfloat16 and trainer.sampler_dtype == torch.float32


# -- bf16 against float32 on tiny-random --------------------------------------------


DATA = [policy_datum(list(range(10, 60)), 1.0), policy_datum(list(range(100, 130)), -0.5)]


def _clients(tmp_path, full):
    from retool.backends.local import LocalServiceClient

    out = []
    for dtype in ("float32", "bfloat16"):
        service = LocalServiceClient(dtype=dtype, checkpoint_root=tmp_path / dtype)
        if full:
            out.append(service.create_training_client("tiny-random", seed=0))
        else:
            out.append(service.create_lora_training_client("tiny-random", rank=4, seed=0))
    return out


@pytest.mark.slow(seconds=35)  # 30-50 s each under make test
@pytest.mark.parametrize("full", [False, True], ids=["lora", "full"])
def test_bf16_training_matches_float32_within_tolerance(tmp_path, full):
    """Loss within 2% and gradients within a cosine of 0.99 (bf16 keeps ~3 digits);
    master weights and optimizer state stay float32."""
    fp32, bf16 = _clients(tmp_path, full)
    if not full:  # LoRA B starts at 0: one step first, so every adapter weight has a gradient
        for client in (fp32, bf16):
            client.forward_backward(DATA, "importance_sampling").result()
            client.optim_step(AdamParams(learning_rate=1e-2)).result()
        for a, b in zip(fp32._params, bf16._params, strict=True):
            b.data.copy_(a.data)  # the same weights, so only the arithmetic differs
    loss32 = fp32.forward_backward(DATA, "importance_sampling").result()
    loss16 = bf16.forward_backward(DATA, "importance_sampling").result()
    assert loss16.metrics["loss:sum"] == pytest.approx(loss32.metrics["loss:sum"], rel=0.02)
    lp32 = np.concatenate([o["logprobs"].to_numpy() for o in loss32.loss_fn_outputs])
    lp16 = np.concatenate([o["logprobs"].to_numpy() for o in loss16.loss_fn_outputs])
    assert np.abs(lp32 - lp16).max() < 0.05
    g32 = torch.cat([p.grad.flatten() for p in fp32._params if p.grad is not None])
    g16 = torch.cat([p.grad.flatten() for p in bf16._params if p.grad is not None])
    assert g16.dtype == torch.float32 and g16.numel() == g32.numel()
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.99
    assert float(g16.norm() / g32.norm()) == pytest.approx(1.0, abs=0.05)
    bf16.optim_step(AdamParams(learning_rate=1e-3)).result()
    assert all(p.dtype == torch.float32 for p in bf16._params)
    frozen = {p.dtype for p in bf16.model.parameters() if not p.requires_grad}
    # LoRA: the frozen base is held in bf16 (no master needed); full: nothing is frozen
    assert frozen == (set() if full else {torch.bfloat16})
    state = bf16._optimizer.state[bf16._params[0]]
    assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32


def test_bf16_sampler_holds_bf16_weights_and_its_logprobs_are_close(tmp_path):
    from retool.backends.local import LocalServiceClient

    service = LocalServiceClient(dtype="bfloat16", checkpoint_root=tmp_path)
    trainer = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    sampler = trainer.save_weights_and_get_sampling_client()
    try:
        assert next(sampler.engine.model.parameters()).dtype == torch.bfloat16
        prompt = list(range(10, 30))
        response = sampler.sample(
            ModelInput.from_ints(prompt), 2, SamplingParams(max_tokens=8, seed=1)
        ).result()
    finally:
        sampler.close()
    seq = response.sequences[0]
    tokens = prompt + list(seq.tokens)
    datum = policy_datum(tokens, 1.0)
    out = trainer.forward([datum], "importance_sampling").result()
    trained = out.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1 :]
    assert np.abs(np.asarray(seq.logprobs) - trained).max() < 0.1
    assert "sampler_kl" in out.metrics  # every RL loss reports the mismatch
