"""``model.compile``: the choice, parity of compiled training with eager on ``tiny-random``
(plain and shared-prefix batches, float32 and bf16), the fallback when the compiler
fails, and sampling snapshots that decode eagerly."""

import numpy as np
import pytest
import torch

from retool.backends.local import compiled
from retool.backends.local.compiled import CompileChoice, resolve_compile
from retool.config import ModelConfig
from retool.errors import ConfigError
from tests.builders import policy_datum


def test_auto_compiles_a_bf16_trainer_only(monkeypatch):
    monkeypatch.setattr(compiled, "compiler_missing", lambda device: None)
    assert resolve_compile("auto", "bfloat16").enabled
    choice = resolve_compile("auto", "float32")
    assert not choice.enabled and choice.reason == "auto: trainer float32"
    assert resolve_compile("on", "float32").enabled
    assert not resolve_compile("off", "bfloat16").enabled
    assert resolve_compile("auto", "bfloat16").summary() == "compile on (auto: bf16 trainer)"
    with pytest.raises(ValueError, match="compile must be one of"):
        resolve_compile("yes", "float32")


def test_without_a_compiler_auto_stays_eager_and_on_says_why(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    assert compiled.compiler_missing("cpu") == "no C++ compiler (g++, c++ or clang++) on PATH"
    choice = resolve_compile("auto", "bfloat16")
    assert not choice.enabled and "no C++ compiler" in choice.reason
    on = resolve_compile("on", "bfloat16")
    assert not on.enabled and on.reason.startswith("model.compile = on, but no C++ compiler")


def test_compile_on_without_a_compiler_is_refused_when_the_model_loads(monkeypatch, tmp_path):
    from retool.backends.local import LocalServiceClient

    monkeypatch.setattr(compiled, "compiler_missing", lambda device: "no C++ compiler (g++)")
    client = LocalServiceClient(dtype="float32", compile="on", checkpoint_root=tmp_path)
    with pytest.raises(ConfigError, match="no C\\+\\+ compiler .*set model.compile = off"):
        client.create_lora_training_client("tiny-random", rank=4, seed=0)
    with pytest.raises(ConfigError, match="compile must be one of auto, on, off"):
        LocalServiceClient(compile="fast", checkpoint_root=tmp_path)


def test_config_field_is_checked():
    assert ModelConfig().compile == "auto"
    with pytest.raises(ConfigError, match="model.compile must be auto, on or off; got 'yes'"):
        ModelConfig(compile="yes")
    with pytest.raises(ConfigError, match="model.compile = on describes the local trainer"):
        ModelConfig(backend="tinker", base_model="Qwen/Qwen3-8B", compile="on")


# -- compiled against eager on tiny-random --------------------------------------------


PREFIX = list(range(10, 40))  # 30 shared tokens: the shared-prefix path
BATCHES = [
    [
        policy_datum(PREFIX + list(range(100, 120)), 1.0),
        policy_datum(PREFIX + list(range(200, 240)), -0.5),
    ],
    [  # the plain path
        policy_datum(list(range(10, 60)), 1.0),
        policy_datum(list(range(300, 330)), -0.5),
    ],
    [policy_datum(PREFIX + list(range(400, 407)), 0.7)],  # one row, another length
]


def _train(tmp_path, dtype, compile_request):
    from retool.backends.local import LocalServiceClient

    service = LocalServiceClient(
        dtype=dtype, compile=compile_request, checkpoint_root=tmp_path / compile_request
    )
    trainer = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    with torch.no_grad():  # LoRA B starts at 0: give every adapter weight a gradient
        for param in trainer._params:
            param.add_(0.02 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    logprobs = []
    for batch in BATCHES:
        out = trainer.forward_backward(batch, "importance_sampling").result()
        logprobs.append(np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs]))
    grads = torch.cat([p.grad.flatten() for p in trainer._params])
    return trainer, np.concatenate(logprobs), grads


@pytest.mark.parametrize(
    ("dtype", "logprob_tol", "grad_tol"),
    [("float32", 1e-5, 1e-5), ("bfloat16", 0.05, 0.05)],
)
def test_compiled_training_matches_eager(tmp_path, dtype, logprob_tol, grad_tol):
    """float32: to float rounding (the sampler's 1e-4 contract holds); bf16: within the
    bf16-vs-float32 tolerances of test_dtype.py, here against eager bf16."""
    eager, lp_eager, g_eager = _train(tmp_path, dtype, "off")
    fused, lp_fused, g_fused = _train(tmp_path, dtype, "on")
    assert not eager.compile.enabled
    assert fused.compile == CompileChoice("on", True, "model.compile = on")
    layers = len(fused._causal_lm().model.layers)
    patched = [m for m in fused.model.modules() if compiled._is_patched(m)]
    assert len(patched) == 3 * layers + 1  # each layer's MLP and two norms, the final norm
    assert {type(m) for m in patched} <= set(compiled._COMPILED)  # they ran compiled
    assert np.abs(lp_eager - lp_fused).max() < logprob_tol
    assert float((g_eager - g_fused).norm() / g_eager.norm()) < grad_tol


def test_sampling_snapshots_decode_eagerly(tmp_path):
    trainer, _, _ = _train(tmp_path, "float32", "on")
    sampler = trainer.save_weights_and_get_sampling_client()
    try:
        assert not any(compiled._is_patched(m) for m in sampler.engine.model.modules())
    finally:
        sampler.close()
    assert any(compiled._is_patched(m) for m in trainer.model.modules())  # the trainer keeps it


def test_a_failing_compiler_falls_back_to_eager_before_any_step(tmp_path, monkeypatch):
    def broken(cls):
        def run(*args, **kwargs):
            raise torch._dynamo.exc.TorchDynamoException("inductor: cannot build kernels")

        return run

    monkeypatch.setattr(compiled, "_compiled_forward", broken)
    monkeypatch.setattr(compiled, "_FAILED", [])
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*runs eagerly"):
        fused, lp_fused, g_fused = _train(tmp_path, "float32", "on")
    assert not fused.compile.enabled
    assert fused.compile.reason == "compile failed: inductor: cannot build kernels"
    _, lp_eager, g_eager = _train(tmp_path, "float32", "off")
    np.testing.assert_array_equal(lp_eager, lp_fused)  # eager: the same computation
    assert torch.equal(g_eager, g_fused)


def test_a_graph_failing_after_start_runs_that_call_and_later_ones_eagerly(tmp_path, monkeypatch):
    from retool.backends.local import LocalServiceClient

    monkeypatch.setattr(compiled, "_FAILED", [])
    service = LocalServiceClient(dtype="float32", compile="on", checkpoint_root=tmp_path)
    trainer = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    assert trainer.compile.enabled  # the warm-up compiled

    def broken(cls):
        def run(*args, **kwargs):
            raise torch._dynamo.exc.TorchDynamoException("a new shape class")

        return run

    monkeypatch.setattr(compiled, "_compiled_forward", broken)
    batch = BATCHES[1]
    with pytest.warns(RuntimeWarning, match="torch.compile failed \\(a new shape class\\)"):
        fused = trainer.forward(batch, "importance_sampling").result()
    assert compiled._FAILED == ["compile failed: a new shape class"]
    eager = (
        LocalServiceClient(dtype="float32", compile="off", checkpoint_root=tmp_path / "e")
        .create_lora_training_client("tiny-random", rank=4, seed=0)
        .forward(batch, "importance_sampling")
        .result()
    )
    for a, b in zip(fused.loss_fn_outputs, eager.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(a["logprobs"].to_numpy(), b["logprobs"].to_numpy(), atol=1e-6)
