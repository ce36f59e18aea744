"""The vllm serve client against a small fake server on 127.0.0.1 (no vLLM needed).

The fake (:mod:`tests.backends.fake_vllm`) records every request, so these tests
check what is sent, how replies are read, how requests spread and fail over,
the adapter publish/retire cycle and the one-line errors. They live outside
``tests/backends/vllm/``, whose conftest skips everything without vLLM.
"""

from __future__ import annotations

import pytest
from bench.vllm_launcher import free_port

from retool.backends.vllm.endpoints import Endpoint
from retool.backends.vllm.server_policy import policy_name
from retool.backends.vllm.server_sampler import ServerSamplingClient, prompt_logprobs
from retool.backends.vllm.servers import VllmServers
from retool.diagnostics.vllm_probe import probe
from retool.errors import BackendError, ConfigError
from retool.types import ModelInput, SamplerStop, SamplingParams
from tests.backends.fake_vllm import FakeVllm, Tokenizer


@pytest.fixture
def fake():
    server = FakeVllm()
    yield server
    server.close()


@pytest.fixture
def dead_url():
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_endpoint_parse():
    ep = Endpoint.parse("http://10.0.0.5:8000/v1/")
    assert (ep.host, ep.port, ep.prefix, ep.tls) == ("10.0.0.5", 8000, "", False)
    assert Endpoint.parse("https://h/proxy/v1").prefix == "/proxy"
    assert Endpoint.parse("https://h").port == 443
    for bad in ("ftp://h:1", "127.0.0.1:8000", "http://h:notaport"):
        with pytest.raises(ConfigError, match="sampler.urls"):
            Endpoint.parse(bad)


def test_unreachable_url_is_one_clear_line(dead_url):
    servers = VllmServers([dead_url], connect_timeout=2.0)
    client = servers.client("base", Tokenizer())
    with pytest.raises(BackendError) as info:
        client.sample(ModelInput.from_ints([1, 2]), 1, SamplingParams(max_tokens=2)).result()
    message = str(info.value)
    assert "\n" not in message
    assert f"cannot connect to {dead_url} (connection refused)" in message
    assert "sampler.urls" in message
    status = probe(dead_url)
    assert status.error and "connection refused" in status.error
    servers.close()


def test_request_fields_and_reply(fake):
    servers = VllmServers([fake.url])
    client = servers.client("base", Tokenizer(), 512)
    params = SamplingParams(max_tokens=2, temperature=0.7, seed=2**63 - 1, stop=("</code>", 7))
    response = client.sample(ModelInput.from_ints([5, 6, 8]), 2, params).result()
    (body,) = fake.completions()
    assert body["prompt"] == [5, 6, 8] and body["n"] == 2 and body["model"] == "base"
    assert body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["stop"] == ["</code>"] and body["stop_token_ids"] == [7]
    assert body["ignore_eos"] is True and body["include_stop_str_in_output"] is True
    assert body["skip_special_tokens"] is False and body["top_k"] == 0
    assert 0 <= body["seed"] < 2**62 and "detokenize" not in body
    assert [s.tokens for s in response.sequences] == [(10, 7), (11, 7)]
    first = response.sequences[0]
    assert first.logprobs == (-1.0, -2.0) and first.stop_reason is SamplerStop.STOP
    assert first.text == "t10 t7" and first.policy_version == "base"
    assert client.max_context_tokens == 512
    servers.close()


def test_greedy_samples_go_as_prompt_copies(fake):
    client = VllmServers([fake.url]).client("base", Tokenizer())
    response = client.sample(
        ModelInput.from_ints([3, 4]), 3, SamplingParams(temperature=0)
    ).result()
    (body,) = fake.completions()
    assert body["prompt"] == [[3, 4]] * 3 and body["n"] == 1
    assert len(response.sequences) == 3


def test_compute_logprobs(fake):
    client = VllmServers([fake.url]).client("base", Tokenizer())
    assert client.compute_logprobs(ModelInput.from_ints([4, 5, 6])).result() == [None, -0.5, -1.0]
    (body,) = fake.completions()
    assert body["prompt_logprobs"] == 0 and body["max_tokens"] == 1
    with pytest.raises(BackendError, match="no logprob for prompt token at position 1"):
        prompt_logprobs([None, {"99": {"logprob": -1.0}}], [1, 2])


def test_http_errors_name_the_url_and_the_server_message(fake):
    client = VllmServers([fake.url]).client("policy-step-3", Tokenizer())
    with pytest.raises(BackendError) as info:
        client.sample(ModelInput.from_ints([1]), 1, SamplingParams(max_tokens=1)).result()
    assert "HTTP 404: The model `policy-step-3` does not exist." in str(info.value)
    assert "adapter loaded" in str(info.value)
    fake.fail_next = [500]
    base = VllmServers([fake.url]).client("base", Tokenizer())
    with pytest.raises(BackendError, match="HTTP 500: failure 500"):
        base.sample(ModelInput.from_ints([1]), 1, SamplingParams(max_tokens=1)).result()
    # the rollout retries a failed call (rollout.sample_retries): the next one works
    assert base.sample(ModelInput.from_ints([1]), 1, SamplingParams(max_tokens=1)).result()


def test_requests_fail_over_and_spread(fake, dead_url):
    second = FakeVllm()
    try:
        servers = VllmServers([dead_url, fake.url, second.url], connect_timeout=2.0)
        client = servers.client("base", Tokenizer())
        futures = [
            client.sample(ModelInput.from_ints([1, i]), 1, SamplingParams(max_tokens=1))
            for i in range(12)
        ]
        assert all(len(f.result().sequences) == 1 for f in futures)
        counts = (len(fake.completions()), len(second.completions()))
        assert sum(counts) == 12 and min(counts) >= 2, counts
    finally:
        second.close()


def test_publish_loads_everywhere_and_retires_old_adapters(fake, tmp_path):
    second = FakeVllm()
    try:
        servers = VllmServers([fake.url, second.url])
        for step in (0, 1, 2):
            servers.publish(policy_name(step), tmp_path / f"step_{step}")
        for server in (fake, second):
            assert server.adapters == {"policy-step-2": str((tmp_path / "step_2").resolve())}
            loads = [b for p, b in server.requests if p == "/v1/load_lora_adapter"]
            assert [b["lora_name"] for b in loads] == [
                "policy-step-0",
                "policy-step-1",
                "policy-step-2",
            ]
            assert all(b["load_inplace"] for b in loads)
        models = servers.models()
        assert [m.id for m in models[1]] == ["base", "policy-step-2"]
        assert servers.base_model().id == "base"
        reply = servers.client("policy-step-2", Tokenizer()).sample(
            ModelInput.from_ints([1]), 1, SamplingParams(max_tokens=1)
        )
        assert reply.result().sequences[0].policy_version == "policy-step-2"
        servers.close()
        assert fake.adapters == {} and second.adapters == {}
    finally:
        second.close()


def test_publish_to_a_dead_url_fails(fake, dead_url, tmp_path):
    servers = VllmServers([fake.url, dead_url], connect_timeout=2.0)
    with pytest.raises(BackendError, match=f"cannot connect to {dead_url}"):
        servers.publish(policy_name(1), tmp_path)


def test_publish_without_runtime_lora_says_how_to_start_the_server(fake, tmp_path):
    fake.fail_next = [404]
    with pytest.raises(BackendError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        VllmServers([fake.url]).publish(policy_name(1), tmp_path)


def test_probe_and_different_base_models(fake):
    status = probe(fake.url)
    assert status.error is None and status.models == ("base",)
    assert status.max_model_len == 512 and status.runtime_lora is True
    other = FakeVllm(served="other")
    try:
        with pytest.raises(BackendError, match="different base models"):
            VllmServers([fake.url, other.url]).base_model()
    finally:
        other.close()


def test_client_satisfies_the_protocol(fake):
    from retool.types import SamplingClient

    client = VllmServers([fake.url]).client("base", Tokenizer())
    assert isinstance(client, SamplingClient) and isinstance(client, ServerSamplingClient)


class FakeTrainer:
    """What ServerPolicySampler uses of a LoRA training client."""

    def __init__(self, root) -> None:
        self.root = root
        self.steps = 0
        self.lora = object()
        self.saved: list[str] = []

    def get_tokenizer(self) -> Tokenizer:
        return Tokenizer()

    def save_weights_for_sampler(self, name: str):
        from retool.types import Future, SaveStateOutput

        path = self.root / name
        path.mkdir()
        (path / "adapter_config.json").write_text("{}")
        self.saved.append(name)
        return Future.completed(SaveStateOutput(str(path)))


def test_policy_sampler_publishes_each_step_once(fake, tmp_path):
    from retool.backends.vllm.server_policy import ServerPolicySampler

    trainer = FakeTrainer(tmp_path)
    sampler = ServerPolicySampler(trainer, VllmServers([fake.url]))
    first = sampler.snapshot()
    tag = sampler.run_tag
    assert first.policy_version == f"policy-step-0.{tag}" and list(fake.adapters) == [
        f"policy-step-0.{tag}"
    ]
    assert sampler.snapshot().policy_version == f"policy-step-0.{tag}"
    assert len(trainer.saved) == 1
    trainer.steps = 1
    client = sampler.snapshot()
    assert list(fake.adapters) == [f"policy-step-1.{tag}"] and len(trainer.saved) == 2
    assert not (tmp_path / trainer.saved[0]).exists()  # the retired adapter's directory
    seq = client.sample(ModelInput.from_ints([1]), 1, SamplingParams(max_tokens=1)).result()
    assert seq.sequences[0].policy_version == client.policy_version == f"policy-step-1.{tag}"
    assert ServerPolicySampler(trainer, VllmServers([fake.url])).run_tag != tag  # per run
    assert client.max_context_tokens == 512 and len(sampler.sync_seconds) == 2
    sampler.close()
    assert fake.adapters == {} and not (tmp_path / trainer.saved[1]).exists()


def test_overlapped_steps_keep_the_older_policies_served(fake, tmp_path):
    """train.max_off_policy_steps = 1 keeps two adapters: the rollout still sampling with the
    policy one step behind is served while the newest is published, then both retire."""
    from retool.backends.vllm.server_policy import ServerPolicySampler

    trainer = FakeTrainer(tmp_path)
    sampler = ServerPolicySampler(trainer, VllmServers([fake.url]), keep=2)
    tag = sampler.run_tag
    older = sampler.snapshot()
    trainer.steps = 1
    sampler.snapshot()
    assert sorted(fake.adapters) == [f"policy-step-0.{tag}", f"policy-step-1.{tag}"]
    seq = older.sample(ModelInput.from_ints([1]), 1, SamplingParams(max_tokens=1)).result()
    assert seq.sequences[0].policy_version == older.policy_version == f"policy-step-0.{tag}"
    trainer.steps = 2
    sampler.snapshot()
    assert sorted(fake.adapters) == [f"policy-step-1.{tag}", f"policy-step-2.{tag}"]
    assert not (tmp_path / trainer.saved[0]).exists() and (tmp_path / trainer.saved[1]).exists()
    sampler.close()
    assert fake.adapters == {} and not any((tmp_path / name).exists() for name in trainer.saved)


def test_a_stale_server_is_visible_in_every_sample(fake, tmp_path):
    """A server that answers with other weights than asked for (a sync that did not apply)."""
    fake.adapters["policy-step-1"] = str(tmp_path)
    fake.served_override = "policy-step-0"
    client = VllmServers([fake.url]).client("policy-step-1", Tokenizer())
    response = client.sample(ModelInput.from_ints([1]), 2, SamplingParams(max_tokens=1)).result()
    assert {s.policy_version for s in response.sequences} == {"policy-step-0"}
    assert client.policy_version == "policy-step-1"  # what the rollout compares against


def test_server_mode_config_needs_lora_sync():
    from retool.config import load_config

    with pytest.raises(ConfigError, match='sampler.sync = "lora"'):
        load_config(None, ["sampler.engine=vllm", "sampler.urls=http://127.0.0.1:8000"])
    config = load_config(
        None, ["sampler.engine=vllm", "sampler.urls=http://a:1,http://b:2", "sampler.sync=lora"]
    )
    assert config.sampler.url_list == ("http://a:1", "http://b:2")


def test_a_server_that_exits_at_start_is_one_line(tmp_path):
    from bench.vllm_launcher import ServerProcess, server_command, server_env

    argv = server_command("/models/m", 8123, max_lora_rank=16, kv_cache_gb=0.5)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(1 << 29)
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "16"
    # No CUDA here: whole prompts only (a seeded request's partial prefill chunk killed a
    # CPU engine); a GPU keeps vLLM's chunked prefill.
    assert "--no-enable-chunked-prefill" in argv
    on_gpu = server_command("/models/m", 8123, chunked_prefill=True)
    assert "--no-enable-chunked-prefill" not in on_gpu
    env = server_env("0-1", base={})
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    process = ServerProcess("/models/m", tmp_path / "log", python="/bin/false", env={})
    with pytest.raises(BackendError, match="exited with status 1 before answering") as info:
        process.start(timeout=30)
    assert "\n" not in str(info.value)
