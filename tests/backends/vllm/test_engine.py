"""The in-process vLLM sampler against the sampling contract, and its merged weight sync.

One engine for the module (start-up is the cost: 20-50 s on a loaded 2-core host).
The contract checks are those of the local sampler (tests/backends/test_sampling.py):
the sampled logprobs are the policy's own (the trainer's forward, within 1e-4 in
float32), seeds repeat, stop ids and strings are kept. The sync checks train the
trainer one step and see the engine follow (and a stale engine refused).
"""

from __future__ import annotations

import pytest
import torch

from retool.backends.local import LocalServiceClient
from retool.backends.vllm import EngineOptions, VllmPolicySampler
from retool.config import RolloutConfig
from retool.data.examples import MathExample
from retool.errors import StalePolicyError
from retool.rollout import rollout_batch
from retool.types import AdamParams, Datum, ModelInput, SamplerStop, SamplingParams, TensorData

# the module's one engine takes 60-95 s to start on a loaded host: 12 s a test of ten
pytestmark = pytest.mark.slow(seconds=12)
PROMPT = list(range(100, 130))


@pytest.fixture(scope="module")
def trainer(tiny_llama, tmp_path_factory):
    service = LocalServiceClient(
        device="cpu", dtype="float32", checkpoint_root=tmp_path_factory.mktemp("ckpt")
    )
    return service.create_lora_training_client(str(tiny_llama), rank=4, seed=0)


@pytest.fixture(scope="module")
def policy(trainer, tmp_path_factory):
    options = EngineOptions(dtype="float32", max_model_len=1024, max_num_seqs=8)
    sampler = VllmPolicySampler(trainer, "merged", options, tmp_path_factory.mktemp("vllm"))
    yield sampler
    sampler.close()


def _forward_logprobs(trainer, prompt, completion):
    ids = torch.tensor([prompt + list(completion)])
    with torch.no_grad():
        logprobs = trainer.model(input_ids=ids).logits[0].float().log_softmax(-1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def _sample(client, prompt, n=1, **params):
    return client.sample(ModelInput.from_ints(prompt), n, SamplingParams(**params)).result(300)


def _train_one_step(trainer):
    tokens = [*PROMPT, 7, 8, 9, 10]
    datum = Datum(
        ModelInput.from_ints(tokens[:-1]),
        {
            "target_tokens": TensorData.from_list(tokens[1:], "int64"),
            "weights": TensorData.from_list([1.0] * (len(tokens) - 1)),
        },
    )
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(AdamParams(learning_rate=0.05)).result()


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.3, "top_k": 20},
        {"temperature": 0.0},
    ],
)
def test_logprobs_are_the_policys_own(policy, trainer, params):
    client = policy.snapshot()
    response = _sample(client, PROMPT, n=3, max_tokens=24, seed=3, **params)
    assert len(response.sequences) == 3
    for sequence in response.sequences:
        assert len(sequence.tokens) == len(sequence.logprobs) == 24
        assert sequence.stop_reason == SamplerStop.LENGTH
        expected = _forward_logprobs(trainer, PROMPT, sequence.tokens)
        assert max(abs(a - b) for a, b in zip(expected, sequence.logprobs, strict=True)) <= 1e-4


def test_same_seed_same_tokens_different_seed_differs(policy):
    client = policy.snapshot()
    a = _sample(client, PROMPT, n=2, max_tokens=16, seed=11)
    b = _sample(client, PROMPT, n=2, max_tokens=16, seed=11)
    c = _sample(client, PROMPT, n=2, max_tokens=16, seed=12)
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert [s.tokens for s in a.sequences] != [s.tokens for s in c.sequences]
    assert a.sequences[0].tokens != a.sequences[1].tokens  # samples of one request differ


def test_seeded_prompts_beyond_one_steps_token_budget_all_sample(policy):
    # 8 seeded prompts of 700 tokens are 5,600 tokens, over vLLM's CPU budget of 4,096 a
    # step: with chunked prefill, a partial chunk's seeded generator was rewound
    # (`set_offset`, CUDA generators only) and the engine died (a demo step's 48 rows).
    client = policy.snapshot()
    prompts = [[100 + (i * 7 + j) % 500 for j in range(700)] for i in range(8)]
    futures = [
        client.sample(ModelInput.from_ints(p), 1, SamplingParams(max_tokens=4, seed=i))
        for i, p in enumerate(prompts)
    ]
    results = [f.result(300) for f in futures]
    assert [len(r.sequences[0].tokens) for r in results] == [4] * 8


def test_stop_token_and_stop_string_are_kept(policy):
    client = policy.snapshot()
    free = _sample(client, PROMPT, max_tokens=20, seed=5).sequences[0]
    stop_token = free.tokens[6]
    first = free.tokens.index(stop_token)
    stopped = _sample(client, PROMPT, max_tokens=20, seed=5, stop=(stop_token,)).sequences[0]
    assert stopped.tokens == free.tokens[: first + 1]
    assert stopped.stop_reason == SamplerStop.STOP
    tokenizer = client.get_tokenizer()
    needle = tokenizer.decode(free.tokens[:12], skip_special_tokens=False)[-3:]
    by_string = _sample(client, PROMPT, max_tokens=20, seed=5, stop=(needle,)).sequences[0]
    assert by_string.stop_reason == SamplerStop.STOP
    assert needle in tokenizer.decode(by_string.tokens, skip_special_tokens=False)
    assert by_string.tokens == free.tokens[: len(by_string.tokens)]
    assert by_string.text == tokenizer.decode(by_string.tokens, skip_special_tokens=True)


def test_compute_logprobs_matches_the_forward(policy, trainer):
    tokens = [*PROMPT, 7, 8, 9]
    got = policy.snapshot().compute_logprobs(ModelInput.from_ints(tokens)).result(300)
    expected = _forward_logprobs(trainer, tokens[:1], tokens[1:])
    assert got[0] is None
    assert max(abs(a - b) for a, b in zip(expected, got[1:], strict=True)) <= 1e-4


def test_merged_sync_follows_the_trainer_and_a_stale_engine_is_refused(
    policy, trainer, monkeypatch
):
    before = policy.snapshot()
    old = _sample(before, PROMPT, max_tokens=12, seed=1).sequences[0]
    assert old.policy_version == before.policy_version == f"policy-step-{trainer.steps}"
    _train_one_step(trainer)
    after = policy.snapshot()  # syncs: the trainer moved
    assert after.policy_version == f"policy-step-{trainer.steps}" != before.policy_version
    new = _sample(after, PROMPT, max_tokens=12, seed=1).sequences[0]
    assert new.policy_version == after.policy_version
    expected = _forward_logprobs(trainer, PROMPT, new.tokens)
    assert max(abs(a - b) for a, b in zip(expected, new.logprobs, strict=True)) <= 1e-4
    # the engine really changed: the old tokens now score as the trained policy says
    rescored = after.compute_logprobs(ModelInput.from_ints(PROMPT + list(old.tokens))).result(300)
    assert (
        max(abs(a - b) for a, b in zip(old.logprobs, rescored[len(PROMPT) :], strict=True)) > 1e-3
    )

    # A sync that silently does nothing: the engine keeps the previous weights and label.
    monkeypatch.setattr(policy, "push_merged", lambda step: None)
    _train_one_step(trainer)
    stale = policy.snapshot()
    assert _sample(stale, PROMPT, max_tokens=4, seed=1).sequences[0].policy_version == (
        after.policy_version
    )
    example = MathExample(id="q1", question="What is 1 + 1?", answer="2")
    config = RolloutConfig(group_size=2, max_assistant_tokens=8, max_trajectory_tokens=512)
    with pytest.raises(StalePolicyError, match="policy-step"):
        rollout_batch(stale, stale.get_tokenizer(), None, [example], config, step=3)


def test_the_engine_leaves_torch_thread_setting_to_the_process(policy):
    # vLLM's CPU worker makes torch.set_num_threads a no-op; the trainer's threads need it
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
