"""The vLLM sampler's settings and conversions, without vLLM installed (no engine starts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from retool.backends.local.dtype import Numerics
from retool.backends.vllm import open_policy_sampler
from retool.backends.vllm.convert import finish_to_stop, prompt_logprobs, request_fields, sequence
from retool.config import load_config
from retool.errors import BackendError, ConfigError
from retool.training.numerics import resolve_correction, sampler_numerics
from retool.types import SamplerStop, SamplingParams


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sampler.engine=sglang"], "sampler.engine must be local, vllm or auto"),
        (["sampler.sync=full"], "sampler.sync must be lora or merged"),
        (["sampler.dtype=int8"], "sampler.dtype must be"),
        (["sampler.kv_cache_gb=0"], "sampler.kv_cache_gb"),
        (["sampler.threads_bind=all"], "sampler.threads_bind"),
        (['sampler.urls="ftp://x"'], "sampler.urls"),
        (["sampler.engine=vllm", "model.backend=tinker"], 'needs model.backend = "local"'),
        (["sampler.engine=vllm", "sampler.sync=lora", "model.lora_rank=0"], "needs a LoRA"),
    ],
)
def test_bad_sampler_settings_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_urls_split_at_commas():
    urls = 'sampler.urls="http://127.0.0.1:8000, http://[::1]:8001"'
    config = load_config(overrides=["sampler.engine=vllm", "sampler.sync=lora", urls])
    assert config.sampler.url_list == ("http://127.0.0.1:8000", "http://[::1]:8001")


def test_the_local_engine_opens_no_vllm_sampler():
    assert open_policy_sampler(load_config(), trainer=None, work_dir="unused") is None


def test_a_bf16_vllm_sampler_turns_the_auto_correction_on():
    local = Numerics(requested="float32", sampler="float32", trainer="float32")
    config = load_config(overrides=["sampler.engine=vllm", "sampler.dtype=bfloat16"])
    numerics = sampler_numerics(local, config)
    assert (numerics.sampler, numerics.trainer) == ("bfloat16", "float32")
    assert resolve_correction("auto", numerics) == "tis"
    fp32 = sampler_numerics(local, load_config(overrides=["sampler.engine=vllm"]))
    assert resolve_correction("auto", fp32) == "none"
    assert sampler_numerics(local, load_config()) is local


def test_request_fields_keep_our_contract():
    params = SamplingParams(max_tokens=7, temperature=0.5, top_k=-1, seed=9, stop=("```", 2))
    fields = request_fields(params, 3)
    assert fields["n"] == 3 and fields["top_k"] == 0 and fields["seed"] == 9
    assert fields["stop"] == ["```"] and fields["stop_token_ids"] == [2]
    assert fields["ignore_eos"] and fields["include_stop_str_in_output"]
    assert fields["logprobs"] == 0 and fields["detokenize"]
    assert not request_fields(SamplingParams(stop=(2,)), 1)["detokenize"]
    # vLLM matches stop strings in its own detokenized text: with special tokens
    # skipped there, "<|im_end|>" as a stop string could never match (in process and
    # on a server alike, as in our sampler, which matches text with special tokens).
    assert request_fields(SamplingParams(stop=("<|im_end|>",)), 1)["skip_special_tokens"] is False


def test_outputs_convert_and_bad_ones_are_refused():
    logprob = SimpleNamespace(logprob=-0.5)
    seq = sequence([5, 6], [-0.5, -1.0], "stop", 8, text="ab", policy_version="policy-step-1")
    assert seq.stop_reason == SamplerStop.STOP and seq.policy_version == "policy-step-1"
    assert finish_to_stop("length", 8, 8) == SamplerStop.LENGTH
    with pytest.raises(BackendError, match="abort"):
        finish_to_stop("abort", 3, 8)
    with pytest.raises(BackendError, match="non-finite"):
        sequence([5], [float("nan")], "stop", 8)
    assert prompt_logprobs([None, {6: logprob}, {7: -0.25}], [5, 6, 7]) == [None, -0.5, -0.25]
    with pytest.raises(BackendError, match="prompt logprobs"):
        prompt_logprobs([None], [5, 6])


def test_a_file_named_vllm_that_shadows_the_package_is_named(tmp_path, monkeypatch):
    # `python bench/vllm.py` once put that script first on sys.path: `import vllm` found
    # it and the engine "did not start" with "module 'vllm' has no attribute 'LLM'".
    import sys

    from retool.backends.vllm.engine import import_vllm
    from retool.errors import DependencyError

    (tmp_path / "vllm.py").write_text("# a user's script\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    original = sys.modules.pop("vllm", None)
    try:
        with pytest.raises(DependencyError, match="shadows it") as caught:
            import_vllm()
        assert str(tmp_path / "vllm.py") in str(caught.value)
    finally:
        sys.modules.pop("vllm", None)
        if original is not None:
            sys.modules["vllm"] = original
