"""Settings a command would silently ignore, as a careless user gives them: refused, one line.

The rule (README, "bad input"; :mod:`retool.cli.common`): a ``--set`` key the
command does not read is refused, naming the key and what to use instead;
keys of a ``--config`` file that the command does not read are accepted (one
file serves several commands); settings that contradict each other are
refused from any source. What slipped through before: ``sampler.*`` under
``sft`` and ``rollout``, ``sampler.sync``/``sampler.urls`` under ``eval`` (it
samples fixed weights in process),
``demo.*`` under every command but ``demo``, ``rollout.dynamic_sampling``
under ``rollout``, vLLM settings while the engine is the local one,
``rollout.max_oversample`` without dynamic sampling, and ``sampler.urls``
while ``sampler.engine`` is ``local`` (the URLs were never contacted).

Each refusal runs the real console script (:func:`tests.cli.test_bad_input._run`):
exit 2, one ``retool: error:`` line naming the key, no traceback, nothing
written. The acceptances run in-process: what must keep working.
"""

from __future__ import annotations

import argparse

import pytest

from retool.cli.common import load_command_config
from retool.cli.eval import UNUSED as EVAL_UNUSED
from retool.cli.rollout import UNUSED as ROLLOUT_UNUSED
from retool.cli.sft import UNUSED as SFT_UNUSED
from retool.errors import ConfigError
from tests.cli.test_bad_input import _run_all, case

EVAL = "eval --model tiny-random --dataset demo --output out.jsonl"
SFT = "sft --data d.jsonl"
DEMOS = {"d.jsonl": '{"id": "c", "messages": []}\n'}  # refused before it is read
SERVER = "--set sampler.engine=vllm --set sampler.sync=lora --set sampler.urls=http://127.0.0.1:9"
URLS_IN_FILE = '[sampler]\nurls = "http://127.0.0.1:8000"\n'  # engine left at "local"

REFUSED = [
    # sections and keys a command never reads
    case("eval-sampler-sync", f"{EVAL} --set sampler.engine=vllm --set sampler.sync=lora",
         "`retool eval` does not use sampler.sync", "nothing syncs"),
    case("eval-sampler-urls", f"{EVAL} --set sampler.engine=vllm --set sampler.urls=http://h:9",
         "`retool eval` does not use sampler.urls"),
    case("eval-demo-key", f"{EVAL} --set demo.eval_n=2", "does not use demo.eval_n",
         "`retool demo`"),
    case("eval-cost", f"{EVAL} --set cost.max_tokens=100", "does not use cost.max_tokens"),
    case("eval-loss-reduction", f"{EVAL} --set model.loss_reduction=sum",
         "does not use model.loss_reduction"),
    case("eval-advantage", f"{EVAL} --set rollout.advantage=mean_std",
         "does not use rollout.advantage"),
    case("sft-sampler", f"{SFT} --set sampler.engine=vllm", "`retool sft` does not use "
         "sampler.engine", **DEMOS),
    case("sft-sampler-urls", f"{SFT} --set sampler.urls=http://127.0.0.1:8000",
         "does not use sampler.urls", **DEMOS),
    case("sft-old-logprobs", f"{SFT} --set train.old_logprobs=recompute",
         "does not use train.old_logprobs", **DEMOS),
    case("sft-correction", f"{SFT} --set train.rollout_correction=tis",
         "does not use train.rollout_correction", **DEMOS),
    case("sft-updates", f"{SFT} --set train.updates_per_step=2",
         "does not use train.updates_per_step", **DEMOS),
    case("sft-demo", f"{SFT} --set demo.sft_steps=3", "does not use demo.sft_steps", **DEMOS),
    case("rollout-dynamic-sampling", "rollout --set rollout.dynamic_sampling=true",
         "`retool rollout` does not use rollout.dynamic_sampling", "`retool train`"),
    case("rollout-oversample", "rollout --set rollout.max_oversample=2",
         "does not use rollout.max_oversample"),
    case("rollout-drop-void", "rollout --set rollout.drop_void=true",
         "`retool rollout` does not use rollout.drop_void", "`retool train`"),
    case("eval-drop-void", f"{EVAL} --set rollout.drop_void=true",
         "does not use rollout.drop_void"),
    case("rollout-sampler", "rollout --set sampler.kv_cache_gb=2",
         "does not use sampler.kv_cache_gb"),
    case("rollout-cost", "rollout --set cost.sample_price=1", "does not use cost.sample_price"),
    case("train-demo", "train --set demo.rl_steps=2", "`retool train` does not use demo.rl_steps"),
    case("preflight-demo", "preflight --set demo.eval_n=2",
         "`retool preflight` does not use demo.eval_n"),
    case("preflight-idle-vllm-key", "preflight --set sampler.dtype=bfloat16",
         "sampler.dtype has no effect while sampler.engine = \"local\""),
    # keys the resolved settings make a no-op
    case("train-vllm-dtype-local-engine", "train --set sampler.dtype=bfloat16",
         "sampler.dtype has no effect while sampler.engine = \"local\"",
         "--set sampler.engine=vllm"),
    case("train-vllm-sync-local-engine", "train --set sampler.sync=lora",
         "sampler.sync has no effect"),
    case("train-engine-in-file-eager-set",
         "train --config c.toml --set sampler.enforce_eager=false",
         "sampler.enforce_eager has no effect", **{"c.toml": '[sampler]\nengine = "local"\n'}),
    case("train-server-gpu-share", f"train {SERVER} --set sampler.gpu_memory_utilization=0.5",
         "sampler.gpu_memory_utilization has no effect while sampler.urls", "vllm serve"),
    case("train-server-eager", f"train {SERVER} --set sampler.enforce_eager=false",
         "sampler.enforce_eager has no effect"),
    case("train-oversample-no-dynamic", "train --set rollout.max_oversample=4",
         "rollout.max_oversample has no effect while rollout.dynamic_sampling = false",
         "--set rollout.dynamic_sampling=true"),
    # contradictions, from any source
    case("train-urls-local-engine", "train --set sampler.urls=http://127.0.0.1:8000",
         "sampler.urls", 'sampler.engine = "local"', 'sampler.engine = "vllm"'),
    case("train-urls-local-engine-file", "train --config c.toml", "c.toml:", "sampler.urls",
         'sampler.engine = "local"', **{"c.toml": URLS_IN_FILE}),
    case("eval-urls-local-engine-file", f"{EVAL} --config c.toml", "c.toml:", "sampler.urls",
         'sampler.engine = "local"', **{"c.toml": URLS_IN_FILE}),
    case("train-urls-unclosed-ipv6", "train --set sampler.engine=vllm --set sampler.sync=lora "
         "--set 'sampler.urls=\"http://[::1\"'", "sampler.urls", "http://[::1"),
    case("train-urls-port-out-of-range", "train --set sampler.engine=vllm --set sampler.sync=lora "
         "--set sampler.urls=http://127.0.0.1:99999", "sampler.urls", "99999"),
]  # fmt: skip


def test_case_names_are_unique():
    names = [c.name for c in REFUSED]
    assert len(names) == len(set(names))


@pytest.mark.slow  # one process per case
def test_a_setting_no_command_reads_is_refused_in_one_line(tmp_path):
    failures = _run_all(tmp_path, REFUSED)
    assert not failures, f"{len(failures)} of {len(REFUSED)} cases:\n" + "\n".join(failures)


def _args(*overrides: str, config: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(config=config, overrides=list(overrides))


def test_a_shared_config_file_may_carry_what_a_command_does_not_read(tmp_path):
    shared = tmp_path / "shared.toml"
    shared.write_text(
        '[sampler]\nengine = "vllm"\nsync = "lora"\ndtype = "bfloat16"\n'
        "[demo]\neval_n = 2\n[cost]\nmax_tokens = 100\n"
        "[rollout]\ndynamic_sampling = true\nmax_oversample = 4\n"
    )
    for command, unused in (("eval", EVAL_UNUSED), ("rollout", ROLLOUT_UNUSED)):
        config = load_command_config(_args(config=str(shared)), command, unused=unused)
        assert config.sampler.engine == "vllm" and config.demo.eval_n == 2
    config = load_command_config(_args(config=str(shared)), "sft", unused=SFT_UNUSED)
    assert config.cost.max_tokens == 100


def test_settings_that_take_effect_are_accepted():
    vllm = ("sampler.engine=vllm", "sampler.dtype=bfloat16", "sampler.kv_cache_gb=2")
    config = load_command_config(_args(*vllm), "train")
    assert (config.sampler.dtype, config.sampler.kv_cache_gb) == ("bfloat16", 2)
    server = ("sampler.engine=vllm", "sampler.sync=lora", "sampler.urls=http://127.0.0.1:9")
    assert load_command_config(_args(*server), "train").sampler.url_list == ("http://127.0.0.1:9",)
    dynamic = ("rollout.dynamic_sampling=true", "rollout.max_oversample=2")
    assert load_command_config(_args(*dynamic), "train").rollout.max_oversample == 2
    # a command's own flags are not --set: eval's --temperature stays a flag
    assert load_command_config(_args(), "eval", flags=["rollout.temperature=0.5"]) is not None


def test_the_idle_check_reads_the_resolved_engine_not_the_order_of_the_flags(tmp_path):
    # the engine comes after the vLLM key on the command line, or from the file: still vLLM
    order = ("sampler.dtype=bfloat16", "sampler.engine=vllm")
    assert load_command_config(_args(*order), "train").sampler.dtype == "bfloat16"
    file = tmp_path / "vllm.toml"
    file.write_text('[sampler]\nengine = "vllm"\n')
    config = load_command_config(_args("sampler.dtype=float16", config=str(file)), "train")
    assert config.sampler.dtype == "float16"
    # and a --set turning the engine back to local makes the file's vLLM keys moot, not an error
    file.write_text('[sampler]\nengine = "vllm"\ndtype = "bfloat16"\n')
    config = load_command_config(_args("sampler.engine=local", config=str(file)), "train")
    assert config.sampler.engine == "local"
    with pytest.raises(ConfigError, match=r"^--set sampler.sync=merged: sampler.sync has no"):
        load_command_config(_args("sampler.engine=local", "sampler.sync=merged"), "train")
