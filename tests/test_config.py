import pytest

from retool.config import RolloutConfig, SandboxConfig, load_config, parse_override
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
    with pytest.raises(ConfigError, match="must be an integer"):
        load_config(None, ["rollout.group_size=many"])


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
