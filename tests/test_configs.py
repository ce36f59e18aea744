"""Every config shipped in configs/ loads and validates, and each says what it needs.

There is one per place the project runs: this CPU (demo), one GPU, a node of 8
GPUs, Tinker, PyTRIO, and the reference recipe (DAPO-Math-17k -> AIME 2025).
A config that no longer loads (a key renamed, a value out of range) fails
here, not in a user's first command. `retool doctor` on each, on a machine
without its model, data, GPU or credential, fails only on those (the config's
own settings pass), and a missing data file is one its comments prepare. The
`retool` commands in its comments parse; a model to download (none is shipped,
no network at run time) is named with the `huggingface-cli download` that
fetches it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from retool.cli import build_parser
from retool.config import load_config
from retool.evaluation.models import ALIASES

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


def test_there_are_configs():
    names = {path.name for path in CONFIGS}
    assert {"demo.toml", "gpu-node-8.toml", "gpu-1.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads(path):
    config = load_config(path)
    assert config.model.base_model


def test_node_of_8_trains_with_torchrun_and_samples_on_4_servers():
    config = load_config(Path(CONFIGS[0]).with_name("gpu-node-8.toml"))
    text = Path(CONFIGS[0]).with_name("gpu-node-8.toml").read_text()
    assert config.model.backend == "local" and config.model.lora_rank > 0
    assert config.sampler.engine == "vllm" and config.sampler.sync == "lora"
    assert len(config.sampler.url_list) == 4
    # the commands in its comments: servers with LoRA of at least the trainer's rank
    assert "torchrun --nproc-per-node 4" in text and "CUDA_VISIBLE_DEVICES=0,1,2,3" in text
    assert f"--max-lora-rank {config.model.lora_rank}" in text
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in text
    assert "download" in text and config.model.base_model in text


def test_one_gpu_shares_it_with_the_in_process_engine():
    path = Path(CONFIGS[0]).with_name("gpu-1.toml")
    config = load_config(path)
    assert config.sampler.engine == "vllm" and not config.sampler.url_list
    assert 0 < config.sampler.gpu_memory_utilization < 0.9  # the trainer keeps the rest
    assert config.model.device.startswith("cuda")
    assert "download" in path.read_text()


# -- every place it runs: what each config needs from outside, and nothing else ------------

HERE = Path(__file__).resolve().parents[1] / "configs"
EVERY_PLACE = {
    "demo.toml",  # this CPU
    "demo-long.toml",  # this CPU, the long run
    "gpu-1.toml",  # one GPU
    "gpu-node-8.toml",  # a node of 8 GPUs
    "tinker.toml",  # Tinker
    "qwen3.5-4b-pytrio.toml",  # PyTRIO
    "dapo-aime.toml",  # the reference recipe
}
# Rows of `retool doctor` that may fail on a machine without the config's outside things
# (a GPU, a downloaded model, prepared data, a credential, an optional package); the
# detail each must give. Anything else failing is the config's own fault.
OUTSIDE = {
    "device": ("not available",),
    "model": ("never downloaded",),
    "data.train": ("no such file",),
    "data.dev": ("no such file",),
    "train.eval_dataset": ("no such file",),
    "tinker credentials": ("TINKER_API_KEY",),
    "pytrio credentials": ("PYTRIO_API_KEY",),
    "extras": ("missing",),
    "sampler": ("not installed", "needs CUDA"),
    "sampler url": ("http://127.0.0.1:",),  # the `vllm serve` its comments start, not up
}


def commands(path: Path) -> list[list[str]]:
    """The ``retool`` commands written in a config's comments, as argv after ``retool``
    (also under ``torchrun ... -m retool``, after ``VAR=value`` prefixes)."""
    lines = [line.lstrip("#").strip() for line in path.read_text().splitlines()]
    lines = [line for line in lines if not line.startswith("#")]  # `#   # a comment`
    text = "\n".join(lines).replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        if not re.match(r"([A-Z_]+=\S*\s+)*(retool|torchrun)\s", line):
            continue  # prose
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        if words[:1] == ["retool"]:
            found.append(words[1:])
        elif words[:1] == ["torchrun"] and "-m" in words:
            at = words.index("-m")
            if words[at + 1 : at + 2] == ["retool"]:
                found.append(words[at + 2 :])
    return found


def test_there_is_a_config_for_every_place_it_runs():
    assert {path.name for path in CONFIGS} >= EVERY_PLACE


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_doctor_fails_only_on_what_the_config_needs_from_outside(path, tmp_path):
    """`retool doctor` without the model, the data, a GPU or a credential: the config
    itself (numerics, sampler settings, run directory) passes; every failing row is one
    of those, named as such, and a missing file is one the config's comments prepare."""
    from retool.diagnostics.doctor import diagnose

    report = diagnose(str(path), run_dir=str(tmp_path / "run"), sandbox=False)
    prepared = {p for argv in commands(path) for p in prepared_files(argv)}
    prepared |= set(re.findall(r"^#.* > (\S+)$", path.read_text(), re.M))  # cat ... > FILE
    for check in report.checks:
        if check.status != "fail":
            continue
        assert check.name in OUTSIDE, f"{path.name}: {check.name}: {check.detail}"
        assert any(f in check.detail for f in OUTSIDE[check.name]), f"{path.name}: {check.detail}"
        if check.detail.endswith("no such file"):
            missing = check.detail.split(":", 1)[0]
            assert missing in prepared, f"{path.name}: nothing in its comments writes {missing}"


def prepared_files(argv: list[str]) -> list[str]:
    """The data files a ``retool prepare-data`` command writes."""
    if argv[:2] != ["prepare-data", "dapo-math"]:
        return []
    args = build_parser().parse_args(argv)
    return [str(args.output_dir / name) for name in ("train.jsonl", "dev.jsonl")]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_commands_in_each_configs_comments_parse_and_name_it(path):
    parser = build_parser()
    found = commands(path)
    assert found, f"{path.name}: no retool command in its comments"
    for argv in found:
        args = parser.parse_args(argv)  # an argument error (SystemExit) fails the test
        config = getattr(args, "config", None)
        if config is not None:
            assert (ROOT / config).is_file(), f"{path.name}: {shlex.join(argv)}"
        if args.command in {"train", "preflight"}:
            assert config == f"configs/{path.name}", f"{path.name}: {shlex.join(argv)}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_model_to_download_is_named_with_the_command_that_downloads_it(path):
    config = load_config(path)
    if config.model.backend != "local" or config.model.base_model in ALIASES:
        return  # a service's model name, or an alias that ships with a package
    text = path.read_text()
    line = f"--local-dir {config.model.base_model}"
    assert "huggingface-cli download" in text and line in text, path.name


def test_one_gpu_trains_lora_in_bf16_on_an_hf_directory():
    config = load_config(HERE / "gpu-1.toml")
    assert config.model.backend == "local" and config.model.lora_rank > 0
    assert config.model.dtype == "bfloat16" and config.sampler.dtype == "bfloat16"
    assert config.model.base_model.startswith("models/")  # a directory the user downloads


def test_tinker_trains_on_the_service_with_its_credential_named():
    path = HERE / "tinker.toml"
    config = load_config(path)
    text = path.read_text()
    assert config.model.backend == "tinker" and config.model.lora_rank >= 1
    assert config.sampler.engine == "local"  # the service samples: no vLLM here
    for needed in ("retool-rl[tinker]", "TINKER_API_KEY", "tinker auth login"):
        assert needed in text


def test_the_reference_recipe_trains_on_dapo_and_evaluates_aime_2025_with_its_budgets():
    path = HERE / "dapo-aime.toml"
    config = load_config(path)
    text = path.read_text()
    # DAPO-Math-17k, as `retool prepare-data dapo-math` writes it (the command is above)
    assert config.data.train == "data/dapo/train.jsonl"
    assert "retool prepare-data dapo-math" in text and "DAPO-Math-17k" in text
    # AIME 2025 every eval_every steps with N samples: Average@N and Pass@N
    assert "aime2025" in config.train.eval_dataset and config.train.eval_every > 0
    assert config.train.eval_n >= 2
    assert "aime2025-I.jsonl" in text and "aime2025-II.jsonl" in text
    # the reference's budgets, the same as its PyTRIO setting's
    pytrio = load_config(HERE / "qwen3.5-4b-pytrio.toml")
    assert config.rollout == pytrio.rollout
    assert config.sandbox == pytrio.sandbox
    for key in ("steps", "questions_per_batch", "loss", "clip_low", "clip_high"):
        assert getattr(config.train, key) == getattr(pytrio.train, key), key
    for key in ("learning_rate", "beta1", "beta2", "eps", "max_train_tokens"):
        assert getattr(config.train, key) == getattr(pytrio.train, key), key
    assert (config.rollout.group_size, config.train.questions_per_batch) == (8, 8)
    assert config.rollout.max_trajectory_tokens == 8192 and config.sandbox.timeout == 10.0
