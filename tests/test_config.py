import os

import pytest

from retool.config import (
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    SandboxConfig,
    load_config,
    parse_override,
)
from retool.errors import ConfigError


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"group_size": 0}, "rollout.group_size must be > 0"),
        ({"max_trajectory_tokens": -5}, "rollout.max_trajectory_tokens must be > 0"),
        ({"max_assistant_tokens": 9000, "max_trajectory_tokens": 8192}, "max_assistant_tokens"),
        ({"temperature": -1.0}, "rollout.temperature must be >= 0"),
        ({"top_p": 0.0}, r"rollout.top_p must be in \(0, 1\]"),
        ({"top_p": 1.01}, r"rollout.top_p must be in \(0, 1\]"),
        ({"protocol": "xml"}, "rollout.protocol must be one of"),
    ],
)
def test_rollout_config_rejects(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RolloutConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_workers": 0}, "sandbox.max_workers must be > 0"),
        ({"timeout": 0}, "sandbox.timeout must be > 0"),
        ({"isolation": "maybe"}, "sandbox.isolation"),
    ],
)
def test_sandbox_config_rejects(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SandboxConfig(**kwargs)


def test_load_toml_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[rollout]\ngroup_size = 4\nprotocol = "hermes_json"\n[sandbox]\ntimeout = 3\n')
    config = load_config(path, ["rollout.temperature=0.7", "rollout.protocol=qwen3_xml"])
    assert config.rollout.group_size == 4
    assert config.rollout.temperature == 0.7
    assert config.rollout.protocol == "qwen3_xml"
    assert config.sandbox.timeout == 3.0


def test_unknown_keys_and_sections(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[rollout]\ngroup_sise = 4\n")
    with pytest.raises(ConfigError, match="unknown key.*group_sise"):
        load_config(path)
    path.write_text("[rollouts]\n")
    with pytest.raises(ConfigError, match=r"unknown section \[rollouts\]"):
        load_config(path)
    with pytest.raises(ConfigError, match="must be an integer, got 'many'$"):
        load_config(None, ["rollout.group_size=many"])
    # Python reads these as numbers, TOML as strings: the error says how to write them
    with pytest.raises(
        ConfigError, match=r"got '\.001' \(a string, not a TOML number: write 0\.001\)"
    ):
        load_config(None, ["train.learning_rate=.001"])
    with pytest.raises(ConfigError, match=r"got '4' \(a string, not a TOML number: write 4\)"):
        load_config(None, ['rollout.group_size="4"'])


def test_invalid_toml_names_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[rollout\n")
    with pytest.raises(ConfigError, match="bad.toml: invalid TOML"):
        load_config(path)


def test_rollout_budget_must_fit_training_context():
    with pytest.raises(ConfigError, match="max_train_tokens"):
        load_config(None, ["rollout.max_trajectory_tokens=10000"])


def test_parse_override():
    assert parse_override("a.b=3") == ("a", "b", 3)
    assert parse_override("a.b=word") == ("a", "b", "word")
    with pytest.raises(ConfigError):
        parse_override("nodot=3")


@pytest.mark.parametrize(
    "value, kwargs, message",
    [
        ("8", {"integer": True, "low": 1}, "x must be an integer >= 1, got the string '8'"),
        (True, {"integer": True}, "x must be an integer, got True"),
        (None, {}, "x must be a finite number, got None"),
        (float("nan"), {"low": 0}, "x must be a finite number >= 0, got nan"),
        (float("inf"), {}, "x must be a finite number, got inf"),
        (2.5, {"integer": True}, "x must be an integer, got 2.5"),
        (0, {"low": 0, "low_open": True}, "x must be > 0, got 0"),
        (-1, {"low": 0, "high": 10}, "x must be >= 0 and <= 10, got -1"),
        (11, {"low": 0, "high": 10}, "x must be <= 10 and >= 0, got 11"),
        (2**40, {"high": 2**32 - 1}, r"x must be <= 2\*\*32 - 1, got"),
    ],
)
def test_check_number_names_the_field_and_the_range(value, kwargs, message):
    from retool.checks import check_number

    with pytest.raises(ConfigError, match=message):
        check_number("x", value, **kwargs)


def test_check_number_accepts_numpy_scalars_and_bounds():
    import numpy as np

    from retool.checks import check_number

    check_number("x", np.int64(3), 1, 3, integer=True)
    check_number("x", np.float32(0.5), 0, 1, low_open=True)
    check_number("x", 1, 0, 1)  # an int where a float is expected


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.learning_rate=nan", "train.learning_rate"),
        ("train.steps=100000000", "train.steps must be <= 10**7"),
        ("train.eps=0", "train.eps must be > 0"),
        ("train.clip_high=0.5", "train.clip_high must be >= 1"),
        ("train.seed=-1", "train.seed must be >= 0"),
        ("reward.timeout=1e12", "reward.timeout must be <= 3600"),
        ("reward.workers=1000", "reward.workers must be <= 256"),
        ("reward.function=nocolon", "package.module:function"),
        ("data.seed=4294967296", "data.seed must be <= 2**32 - 1"),
        ('data.train=""', "data.train must not be empty"),
        ("model.device=tpu", "model.device must be auto, cpu, cuda, cuda:N or mps"),
        ("model.device=cuda:x", "model.device"),
    ],
)
def test_override_errors_name_their_origin(override, fragment):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=[override])
    assert str(caught.value).startswith(f"--set {override}: ")
    assert fragment in str(caught.value)


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12", "mps"])
def test_devices_that_are_accepted(device):
    assert load_config(overrides=[f"model.device={device}"]).model.device == device


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("[train]\nlearning_rate = inf\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: train.learning_rate"):
        load_config(bad)
    nul = tmp_path / "nul.toml"
    nul.write_text('[train]\nrun_dir = "a\\u0000b"\n')
    with pytest.raises(ConfigError, match="train.run_dir must not contain a NUL"):
        load_config(nul)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"[rollout]\nprotocol = '\xe9'\n"), r":2: not UTF-8 .*column 13"),
        (lambda p: None, "no such file"),
    ],
    ids=["directory", "latin1", "missing"],
)
def test_unreadable_config_files_are_one_error(tmp_path, make, message):
    path = tmp_path / "c.toml"
    make(path)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_devices_and_fifos_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config("/dev/zero")  # reading it would never end


@pytest.mark.parametrize(
    "setting",
    [
        "rollout.group_size=100000",
        "rollout.max_code_calls=1000000",
        "rollout.max_in_flight_samples=100000",
        "rollout.sample_retries=5000",
        "rollout.retry_backoff=1e9",
        "rollout.temperature=1e6",
        "rollout.seed=-1",
        "rollout.seed=99999999999999",
    ],
)
def test_rollout_settings_have_upper_bounds(setting):
    # a typo with extra zeros is one error naming the key, not a run that never ends
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^--set {setting}: {key} must be "):
        load_config(None, [setting])


# -- the config and the code that enforces a limit refuse the same values ------------------


def _outcome(check, *args):
    """``None`` when ``check(*args)`` accepts, else its ConfigError's message."""
    try:
        check(*args)
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("backend", ["pytrio", "tinker"])
def test_a_service_rank_is_refused_by_the_config_as_by_its_client(backend):
    """model.lora_rank: what the service client refuses, the config refuses first, with the
    same words; what the client accepts, the config accepts."""
    from retool.backends.pytrio import PytrioServiceClient
    from retool.backends.tinker import TinkerServiceClient

    client_class = {"pytrio": PytrioServiceClient, "tinker": TinkerServiceClient}[backend]
    client = object.__new__(client_class)  # check_rank reads no state: no SDK, no login
    refused = 0
    for rank in (1, 2, 3, 4, 5, 63, 64, 65, 128, 4096):
        by_client = _outcome(client.check_rank, rank)
        by_config = _outcome(lambda r: ModelConfig(backend=backend, lora_rank=r), rank)
        assert by_config == by_client, (backend, rank)
        refused += by_client is not None
    assert refused or backend == "tinker"  # pytrio refuses ranks outside [4, 64]
    # past any hidden size, every backend's config refuses before the service is asked
    assert _outcome(lambda: ModelConfig(backend=backend, lora_rank=2**12 + 1)) is not None


def test_the_reward_workers_and_the_config_share_bounds():
    """reward.timeout / reward.workers at the verifier's bound pass both checks; one past it
    fails both (a typo with extra zeros never reaches the worker pool)."""
    from retool.limits import REWARD_MAX_TIMEOUT_S, REWARD_MAX_WORKERS
    from retool.reward.arguments import check_timeout, check_workers

    for value, ok in ((REWARD_MAX_TIMEOUT_S, True), (REWARD_MAX_TIMEOUT_S * 1.001, False)):
        assert (_outcome(check_timeout, "t", value) is None) is ok
        assert (_outcome(lambda v: RewardConfig(timeout=v), value) is None) is ok
    for value, ok in ((REWARD_MAX_WORKERS, True), (REWARD_MAX_WORKERS + 1, False), (0, False)):
        assert (_outcome(check_workers, "w", value) is None) is ok
        assert (_outcome(lambda v: RewardConfig(workers=v), value) is None) is ok


def test_the_sections_keep_their_public_home():
    """Every section RunConfig holds is importable from retool.config, as callers import it,
    and a loaded config is made of those very classes."""
    import dataclasses

    import retool.config

    config = load_config(None, ["rollout.group_size=2"])
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        assert getattr(retool.config, type(value).__name__) is type(value), section.name
        assert type(value).__name__ in retool.config.__all__
