"""How the vLLM samplers fail for a careless user: one line, nothing half-written.

No vLLM needed: the servers are the fake of :mod:`tests.backends.fake_vllm`, the
in-process engine is replaced by a stand-in that fails as vLLM does (its start,
its adapter load), and the exported model is a tiny transformers Llama. What is
checked is what a user meets: a URL typed wrong is a ``ConfigError`` naming
``sampler.urls`` (never a ``ValueError`` from ``urlsplit``), an adapter the
servers or the engine refused is deleted (so a run that stops at its first
publish leaves no ``checkpoints/sampler/vllm_*`` and its skeleton can be
removed), a server gone at the end says nothing, and a dead engine is an error
the rollout does not retry.
"""

from __future__ import annotations

import errno
import logging
import sys
import types
from pathlib import Path

import pytest

from retool.backends.vllm import engine as engine_module
from retool.backends.vllm.endpoints import Endpoint
from retool.backends.vllm.engine import EngineOptions, VllmPolicySampler, dead_engine
from retool.backends.vllm.server_policy import ServerPolicySampler
from retool.backends.vllm.servers import VllmServers
from retool.backends.vllm.sync import export_model
from retool.cli import main
from retool.diagnostics.vllm_probe import probe
from retool.errors import BackendError, ConfigError, SamplerDeadError, StalePolicyError
from retool.types import Future, ModelInput, SamplingParams, SaveStateOutput
from tests.backends.fake_vllm import FakeVllm, Tokenizer
from tests.builders import write_run_toml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake():
    server = FakeVllm()
    yield server
    server.close()


# -- sampler.urls typed wrong -------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/",  # the bracket never closed
        "http://[zz]:8000",  # a bracketed host that is no address
        "http://[::1]:99999",  # port out of range
        "http://127.0.0.1:-1",
        "http://127.0.0.1:80:80",
        "http://127.0.0.1:0",  # would have become port 80
        "http://:8000",
        "127.0.0.1:8000",  # no scheme
        "ftp://127.0.0.1:8000",
        "",
    ],
)
def test_a_url_typed_wrong_is_one_config_error_naming_it(url):
    with pytest.raises(ConfigError) as info:
        Endpoint.parse(url)
    message = str(info.value)
    assert message.startswith("sampler.urls: ") and repr(url) in message and "\n" not in message
    with pytest.raises(ConfigError, match="sampler.urls"):
        VllmServers(["http://127.0.0.1:8000", url])
    status = probe(url)  # retool doctor's row: an error, never a traceback
    assert status.error is not None and "sampler.urls" in status.error


def test_credentials_in_a_url_are_refused_without_echoing_them():
    with pytest.raises(ConfigError, match="credentials") as info:
        Endpoint.parse("http://admin:hunter2@127.0.0.1:8000")
    assert "hunter2" not in str(info.value)


def test_an_ipv6_url_parses_and_is_named_as_written():
    endpoint = Endpoint.parse(" http://[::1]:8000/v1/ ")
    assert (endpoint.host, endpoint.port, endpoint.prefix) == ("::1", 8000, "")
    assert str(endpoint) == f"{endpoint}" == "http://[::1]:8000/v1"  # never the dataclass repr


def test_train_with_a_url_typed_wrong_is_one_line_and_no_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "--run-dir",
            str(run_dir),
            "--set",
            "sampler.engine=vllm",
            "--set",
            "sampler.sync=lora",
            "--set",
            "sampler.urls=http://127.0.0.1:8000,http://[::1/",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("retool: error: ") and "http://[::1/" in line and "sampler.urls" in line
    assert not run_dir.exists()


# -- publishing an adapter: all or nothing -----------------------------------------------


class AdapterTrainer:
    """What the samplers use of a LoRA trainer: adapters saved under ``checkpoints/sampler``
    as the local trainer saves them (whole or not at all)."""

    def __init__(self, run: Path, model=None) -> None:
        self.checkpoint_root = run / "checkpoints"
        self.checkpoint_root.mkdir(parents=True, exist_ok=True)
        self.steps = 0
        self.lora = types.SimpleNamespace(rank=4)
        self.model = model

    def get_tokenizer(self):
        return SavingTokenizer()

    def sampler_model(self):
        return self.model

    def save_weights_for_sampler(self, name: str):
        path = self.checkpoint_root / "sampler" / name
        path.mkdir(parents=True)
        (path / "adapter_config.json").write_text("{}")
        return Future.completed(SaveStateOutput(str(path)))


def test_an_adapter_the_server_refuses_is_deleted(fake, tmp_path):
    trainer = AdapterTrainer(tmp_path / "run")
    sampler = ServerPolicySampler(trainer, VllmServers([fake.url]))
    fake.fail_next = [404]  # started without VLLM_ALLOW_RUNTIME_LORA_UPDATING
    with pytest.raises(BackendError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        sampler.snapshot()
    # nothing under checkpoints/: the run's skeleton can be removed
    assert list(trainer.checkpoint_root.rglob("*")) == []
    fake.fail_next = []
    client = sampler.snapshot()  # the next try publishes from scratch
    assert list(fake.adapters) == [client.policy_version]
    sampler.close()
    assert fake.adapters == {} and list(trainer.checkpoint_root.rglob("*")) == []


def test_an_adapter_one_of_two_servers_refuses_is_unloaded_from_the_other(fake, tmp_path):
    second = FakeVllm()
    try:
        trainer = AdapterTrainer(tmp_path / "run")
        sampler = ServerPolicySampler(trainer, VllmServers([fake.url, second.url]))
        second.fail_next = [500]
        with pytest.raises(BackendError, match=f"{second.url}/v1/load_lora_adapter answered"):
            sampler.snapshot()
        assert fake.adapters == {} and second.adapters == {}
        assert not (trainer.checkpoint_root / "sampler").exists()
    finally:
        second.close()


def test_an_interrupt_while_publishing_leaves_no_adapter(fake, tmp_path, monkeypatch):
    trainer = AdapterTrainer(tmp_path / "run")
    servers = VllmServers([fake.url])
    sampler = ServerPolicySampler(trainer, servers)

    def interrupted(name, path, keep=1):
        raise KeyboardInterrupt

    monkeypatch.setattr(servers, "publish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sampler.snapshot()
    assert list(trainer.checkpoint_root.rglob("*")) == []


def test_a_run_s_sampler_checkpoints_stay_when_its_adapter_is_deleted(fake, tmp_path):
    trainer = AdapterTrainer(tmp_path / "run")
    kept = trainer.checkpoint_root / "sampler" / "step_000001"
    kept.mkdir(parents=True)
    sampler = ServerPolicySampler(trainer, VllmServers([fake.url]))
    sampler.snapshot()
    trainer.steps = 1
    sampler.snapshot()
    sampler.close()
    assert [p.name for p in (trainer.checkpoint_root / "sampler").iterdir()] == [kept.name]


def test_a_server_gone_at_the_end_says_nothing(fake, tmp_path, caplog):
    sampler = ServerPolicySampler(AdapterTrainer(tmp_path / "run"), VllmServers([fake.url]))
    client = sampler.snapshot()
    fake.close()  # the server died (or was stopped) during the run
    with pytest.raises(BackendError) as info:
        client.sample(ModelInput.from_ints([1]), 1, SamplingParams(max_tokens=1)).result()
    assert f"cannot connect to {fake.url} (connection refused)" in str(info.value)
    assert not isinstance(info.value, StalePolicyError)  # it may come back: the rollout retries
    with caplog.at_level(logging.INFO):
        sampler.close()  # unloading from a server that is gone: nothing to say
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


def test_train_against_a_server_without_runtime_adapters_is_one_line(fake, tmp_path, capsys):
    fake.fail_next = [404]  # /v1/load_lora_adapter not routed
    config = write_run_toml(
        tmp_path / "run.toml",
        rollout={"max_trajectory_tokens": 512},
        train={"max_train_tokens": 512},
        sampler={"engine": "vllm", "sync": "lora", "urls": fake.url},
    )
    run_dir = tmp_path / "run"
    sys.path.insert(0, str(ROOT))  # the config's reward function lives under tests/
    try:
        code = main(["train", "--config", str(config), "--run-dir", str(run_dir), "--no-progress"])
    finally:
        sys.path.remove(str(ROOT))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in line
    assert not run_dir.exists()  # the adapter was deleted: the skeleton went too


# -- the in-process engine ----------------------------------------------------------------


class SavingTokenizer(Tokenizer):
    """A tokenizer that saves a file, or fails the way a full disk or an interrupt does."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail

    def save_pretrained(self, path) -> None:
        if self.fail is not None:
            raise self.fail
        (Path(path) / "tokenizer.json").write_text("{}")


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return AutoModelForCausalLM.from_config(config)


def test_an_export_that_fails_leaves_the_previous_one_and_no_partial_files(tiny_model, tmp_path):
    target = tmp_path / "vllm" / "model"
    export_model(tiny_model, SavingTokenizer(), target, merged=False)
    before = sorted(p.name for p in target.iterdir())
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(before)
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(BackendError) as info:
        export_model(tiny_model, SavingTokenizer(full), target, merged=True)
    message = str(info.value)
    assert str(target) in message and "No space left on device" in message
    assert "free disk space" in message and "\n" not in message
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]  # no temporary left
    assert sorted(p.name for p in target.iterdir()) == before
    with pytest.raises(KeyboardInterrupt):
        export_model(tiny_model, SavingTokenizer(KeyboardInterrupt()), tmp_path / "m2", False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm"]


class RefusingEngine:
    """Stands in for :class:`VllmEngine`: starts (or not), runs calls against a fake LLM
    whose ``add_lora`` refuses every adapter."""

    start_error: BaseException | None = None

    def __init__(self, model_dir, options) -> None:
        if RefusingEngine.start_error is not None:
            raise RefusingEngine.start_error
        assert (Path(model_dir) / "config.json").exists()
        self.closed = False
        llm_engine = types.SimpleNamespace(
            add_lora=lambda request: False,
            remove_lora=lambda lora_id: True,
            set_weight_version=lambda version: None,
        )
        self.llm = types.SimpleNamespace(llm_engine=llm_engine)

    def call(self, fn):
        return fn(self.llm)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def refusing_engine(monkeypatch):
    monkeypatch.setattr(engine_module, "VllmEngine", RefusingEngine)
    monkeypatch.setattr(RefusingEngine, "start_error", None)
    # LoRARequest without importing vLLM (seconds, and absent where it is not installed)
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, lora_id, path: types.SimpleNamespace(  # type: ignore[attr-defined]
        lora_name=name, lora_int_id=lora_id, lora_path=path
    )
    for name, module in (
        ("vllm", types.ModuleType("vllm")),
        ("vllm.lora", types.ModuleType("vllm.lora")),
        ("vllm.lora.request", request),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    return RefusingEngine


@pytest.mark.parametrize(
    "error",
    [
        BackendError("vllm: the engine did not start for m (ValueError: bad config)"),
        KeyboardInterrupt(),
    ],
)
def test_an_engine_that_does_not_start_leaves_nothing(tiny_model, tmp_path, refusing_engine, error):
    trainer = AdapterTrainer(tmp_path / "run", tiny_model)
    refusing_engine.start_error = error
    with pytest.raises(type(error)):
        VllmPolicySampler(trainer, "lora", EngineOptions(), trainer.checkpoint_root / "vllm")
    assert list(trainer.checkpoint_root.iterdir()) == []  # no checkpoints/vllm, no export


def test_an_adapter_the_engine_refuses_is_deleted(tiny_model, tmp_path, refusing_engine):
    trainer = AdapterTrainer(tmp_path / "run", tiny_model)
    sampler = VllmPolicySampler(trainer, "lora", EngineOptions(), trainer.checkpoint_root / "vllm")
    with pytest.raises(BackendError, match="did not load the adapter"):
        sampler.snapshot()
    assert not (trainer.checkpoint_root / "sampler").exists()
    sampler.close()
    assert list(trainer.checkpoint_root.iterdir()) == []


def test_a_dead_engine_is_an_error_the_rollout_does_not_retry(smol_tokenizer):
    from retool.data.examples import MathExample
    from retool.rollout import rollout_batch
    from tests.builders import scripted_rollout
    from tests.rollout.fakes import FakeSandbox, ScriptedSampler

    failure = RuntimeError("Unsupported CPU attention configuration: head_dim=16 isa=2")
    dead = dead_engine(failure)
    assert isinstance(dead, SamplerDeadError) and isinstance(dead, StalePolicyError)
    message = str(dead)
    assert "head_dim=16" in message and 'sampler.engine = "local"' in message
    assert "\n" not in message and "--resume" not in message
    sampler = ScriptedSampler(smol_tokenizer, lambda call: "x", fail=lambda n: dead)
    config = scripted_rollout(group_size=1, sample_retries=5, max_in_flight_samples=1)
    with pytest.raises(SamplerDeadError):
        rollout_batch(
            sampler,
            smol_tokenizer,
            FakeSandbox(lambda code: ""),
            [MathExample("q1", "What is 2^10?", "1024")],
            config,
        )
    assert len(sampler.requests) == 1  # five retries were allowed: none was made
