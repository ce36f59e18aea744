"""The local sampler: policy logprobs, seeds, stops, batching, prefix cache."""

import asyncio

import pytest
import torch

from retool.backends.local.engine import SamplingEngine
from retool.types import ModelInput, SamplerStop, SamplingParams

PROMPT = list(range(100, 130))


def _forward_logprobs(model, prompt, completion):
    ids = torch.tensor([prompt + list(completion)])
    with torch.no_grad():
        logprobs = model(input_ids=ids).logits[0].float().log_softmax(-1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def _assert_policy_logprobs(model, prompt, sequence):
    expected = _forward_logprobs(model, prompt, sequence.tokens)
    assert max(abs(a - b) for a, b in zip(expected, sequence.logprobs, strict=True)) <= 1e-4


def _sample(client, prompt, n=1, **params):
    return client.sample(ModelInput.from_ints(prompt), n, SamplingParams(**params)).result(120)


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.3, "top_k": 20},
        {"temperature": 0.0},
    ],
)
def test_logprobs_are_the_policys_own(sampler, params):
    response = _sample(sampler, PROMPT, n=3, max_tokens=24, seed=3, **params)
    for sequence in response.sequences:
        assert len(sequence.tokens) == len(sequence.logprobs) == 24
        expected = _forward_logprobs(sampler.engine.model, PROMPT, sequence.tokens)
        assert max(abs(a - b) for a, b in zip(expected, sequence.logprobs, strict=True)) <= 1e-4


def test_same_seed_same_tokens_different_seed_differs(sampler):
    a = _sample(sampler, PROMPT, n=2, max_tokens=16, seed=11)
    b = _sample(sampler, PROMPT, n=2, max_tokens=16, seed=11)
    c = _sample(sampler, PROMPT, n=2, max_tokens=16, seed=12)
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert [s.tokens for s in a.sequences] != [s.tokens for s in c.sequences]
    assert a.sequences[0].tokens != a.sequences[1].tokens  # samples of one request differ


def test_stop_token_and_stop_string_are_kept(sampler):
    free = _sample(sampler, PROMPT, max_tokens=20, seed=5).sequences[0]
    assert free.stop_reason == SamplerStop.LENGTH
    stop_token = free.tokens[6]
    first = free.tokens.index(stop_token)
    stopped = _sample(sampler, PROMPT, max_tokens=20, seed=5, stop=(stop_token,)).sequences[0]
    assert stopped.tokens == free.tokens[: first + 1]
    assert stopped.stop_reason == SamplerStop.STOP
    tokenizer = sampler.get_tokenizer()
    text = tokenizer.decode(free.tokens[:12], skip_special_tokens=False)
    needle = text[-3:]
    by_string = _sample(sampler, PROMPT, max_tokens=20, seed=5, stop=(needle,)).sequences[0]
    assert by_string.stop_reason == SamplerStop.STOP
    assert needle in tokenizer.decode(by_string.tokens, skip_special_tokens=False)
    assert by_string.tokens == free.tokens[: len(by_string.tokens)]
    assert by_string.text == tokenizer.decode(by_string.tokens, skip_special_tokens=True)


def test_requests_in_flight_share_decode_steps(service):
    client = service.create_sampling_client(base_model="tiny-random")
    try:
        engine = client.engine
        with engine.paused():
            futures = [
                client.sample(
                    ModelInput.from_ints(PROMPT[: 10 + i]), 2, SamplingParams(max_tokens=10, seed=i)
                )
                for i in range(4)
            ]
        results = [f.result(120) for f in futures]
        assert all(len(s.tokens) == 10 for r in results for s in r.sequences)
        assert engine.steps == 9  # 8 rows decoded together: the first token comes from prefill
    finally:
        client.close()


def test_prefix_cache_hit_equals_cold_computation(service):
    warm = service.create_sampling_client(base_model="tiny-random")
    cold = service.create_sampling_client(base_model="tiny-random")
    try:
        first = _sample(warm, PROMPT, max_tokens=12, seed=1).sequences[0]
        continuation = PROMPT + list(first.tokens) + [7, 8, 9, 10]
        before = warm.prefix_stats()
        hot = _sample(warm, continuation, n=2, max_tokens=12, seed=2)
        after = warm.prefix_stats()
        assert after.hits == before.hits + 1
        assert after.tokens_reused - before.tokens_reused == len(PROMPT) + len(first.tokens) - 1
        fresh = _sample(cold, continuation, n=2, max_tokens=12, seed=2)
        assert cold.prefix_stats().hits == 0
        for a, b in zip(hot.sequences, fresh.sequences, strict=True):
            assert a.tokens == b.tokens
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    finally:
        warm.close()
        cold.close()


def test_prefix_cache_is_bounded(service):
    client = service.create_sampling_client(base_model="tiny-random")
    client.close()
    engine = SamplingEngine(client.engine.model, client.get_tokenizer(), prefix_cache_bytes=200_000)
    try:
        for start in range(0, 200, 20):
            engine.submit(
                list(range(start, start + 40)), 1, SamplingParams(max_tokens=4, seed=0)
            ).result(60)
        assert engine.prefix_stats().bytes <= 200_000
    finally:
        engine.close()


def test_sample_async_and_compute_logprobs(sampler):
    async def go():
        return await sampler.sample_async(
            ModelInput.from_ints(PROMPT), 1, SamplingParams(max_tokens=5, seed=9)
        )

    response = asyncio.run(go())
    sequence = response.sequences[0]
    logprobs = sampler.compute_logprobs(ModelInput.from_ints(PROMPT + list(sequence.tokens)))
    values = logprobs.result()
    assert values[0] is None and len(values) == len(PROMPT) + 5
    for got, want in zip(values[len(PROMPT) :], sequence.logprobs, strict=True):
        assert abs(got - want) < 1e-4


def test_bad_requests_fail_cleanly(sampler):
    with pytest.raises(ValueError, match="num_samples"):
        sampler.sample(ModelInput.from_ints(PROMPT), 0, SamplingParams()).result()
    with pytest.raises(ValueError, match="max_context_tokens"):
        sampler.sample(ModelInput.from_ints(PROMPT), 1, SamplingParams(max_tokens=9000)).result()


def test_clients_satisfy_the_contract(service, sampler):
    from retool.types import SamplingClient, ServiceClient, TrainingClient

    assert isinstance(service, ServiceClient)
    assert isinstance(sampler, SamplingClient)
    assert isinstance(service.create_lora_training_client("tiny-random", rank=2), TrainingClient)


def test_top_k_one_is_greedy(sampler):
    greedy = _sample(sampler, PROMPT, max_tokens=12, temperature=0.0).sequences[0]
    top1 = _sample(sampler, PROMPT, max_tokens=12, temperature=1.0, top_k=1, seed=3).sequences[0]
    assert greedy.tokens == top1.tokens


def test_num_samples_share_one_prefill(service):
    client = service.create_sampling_client(base_model="tiny-random")
    try:
        prompt = list(range(300, 340))
        _sample(client, prompt, n=4, max_tokens=3, seed=1)
        assert client.prefix_stats().tokens_prefilled == len(prompt)  # once, not 4 times
    finally:
        client.close()


def test_request_joins_a_running_batch(service):
    import time

    client = service.create_sampling_client(base_model="tiny-random")
    try:
        engine = client.engine
        alone = _sample(client, PROMPT[:12], max_tokens=20, temperature=0.0).sequences[0]
        start = engine.steps
        long_run = client.sample(
            ModelInput.from_ints(PROMPT), 1, SamplingParams(max_tokens=400, temperature=0.0)
        )
        deadline = time.monotonic() + 60
        while engine.steps < start + 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        joined = _sample(client, PROMPT[:12], max_tokens=20, temperature=0.0).sequences[0]
        assert not long_run.done()  # the short request finished inside the long one
        long_run.result(120)
        assert engine.steps - start == 399  # the joined rows cost no extra steps
        assert joined.tokens == alone.tokens
        assert max(abs(a - b) for a, b in zip(joined.logprobs, alone.logprobs, strict=True)) < 1e-4
    finally:
        client.close()


def test_rows_keep_their_own_policy_in_any_batch(service):
    """A batch of requests of mixed kinds and prompt lengths (left padding) decodes each row
    as the model would alone: logprobs equal ``forward`` on the row's own tokens, and
    greedy rows pick the same tokens alone and together.

    Sampled (temperature > 0) tokens are not compared alone against together: a
    row's logits differ by float rounding (~1e-7) with the batch's shape, in HF's
    forward as in the lean decode step, and an inverse-CDF draw near a boundary
    can flip on that. Each row's draw uses only its own generator, so equal
    logits give equal tokens (``test_sample_tokens_rows_are_independent``).
    """
    client = service.create_sampling_client(base_model="tiny-random")
    model = client.engine.model
    kinds = [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.3, "top_k": 20},
        {"temperature": 0.0},
    ]
    try:
        greedy_alone = _sample(client, PROMPT, n=2, max_tokens=16, seed=21, **kinds[3])
        with client.engine.paused():  # every request, plus others, decoded together
            others = [
                client.sample(
                    ModelInput.from_ints(list(range(200, 205 + 7 * i))),
                    3,
                    SamplingParams(max_tokens=30, seed=i, temperature=0.5 + 0.2 * i),
                )
                for i in range(3)
            ]
            together = [
                client.sample(
                    ModelInput.from_ints(PROMPT), 2, SamplingParams(max_tokens=16, seed=21, **kind)
                )
                for kind in kinds
            ]
        for future in together:
            for sequence in future.result(120).sequences:
                _assert_policy_logprobs(model, PROMPT, sequence)
        greedy_together = together[3].result(120)
        assert [s.tokens for s in greedy_together.sequences] == [
            s.tokens for s in greedy_alone.sequences
        ]
        for i, future in enumerate(others):
            prompt = list(range(200, 205 + 7 * i))
            for sequence in future.result(120).sequences:
                _assert_policy_logprobs(model, prompt, sequence)
        # Joining a batch that is already decoding changes nothing either.
        long_run = client.sample(
            ModelInput.from_ints(list(range(400, 420))), 2, SamplingParams(max_tokens=300, seed=5)
        )
        joined = _sample(client, PROMPT, n=2, max_tokens=16, seed=21, **kinds[1])
        for sequence in joined.sequences:
            _assert_policy_logprobs(model, PROMPT, sequence)
        long_run.result(120)
    finally:
        client.close()


def test_sample_tokens_rows_are_independent():
    """A row's token depends only on its own logits, settings and uniform."""
    from retool.backends.local.engine import sample_tokens

    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 300, generator=generator) * 3
    logprobs = logits.log_softmax(-1)
    temperatures = [1.0, 0.7, 1.3, 0.0, 1.0, 0.9]
    top_ks = [-1, -1, 20, -1, 5, -1]
    top_ps = [1.0, 0.9, 1.0, 1.0, 0.8, 0.5]
    uniforms = [0.11, 0.52, 0.93, 0.4, 0.77, 0.05]
    together = sample_tokens(logits, logprobs, temperatures, top_ks, top_ps, uniforms).tolist()
    for i in range(6):
        alone = sample_tokens(
            logits[i : i + 1],
            logprobs[i : i + 1],
            temperatures[i : i + 1],
            top_ks[i : i + 1],
            top_ps[i : i + 1],
            uniforms[i : i + 1],
        ).tolist()
        assert alone == [together[i]]


def test_sample_tokens_inverse_cdf_and_filters():
    from retool.backends.local.engine import sample_tokens

    probs = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    logits = probs.log().unsqueeze(0).expand(6, -1).contiguous()
    logprobs = logits.log_softmax(-1)
    uniforms = [0.05, 0.15, 0.35, 0.99, 1.0 - 1e-16, 0.5]
    tokens = sample_tokens(logits, logprobs, [1.0] * 6, [-1] * 6, [1.0] * 6, uniforms)
    assert tokens.tolist() == [0, 1, 2, 3, 3, 2]  # never the zero-probability token
    # top-k 2 keeps tokens 3 and 2 (mass 0.4 / 0.3 after renormalising: 4/7, 3/7), in that order
    tokens = sample_tokens(logits[:2], logprobs[:2], [1.0] * 2, [2, 2], [1.0] * 2, [0.5, 0.6])
    assert tokens.tolist() == [3, 2]
    # top-p 0.5 keeps 3 and 2 (0.4 alone is short of 0.5); top-p 0.3 keeps only 3
    top_ps = [0.5, 0.3, 1.0]
    tokens = sample_tokens(logits[:3], logprobs[:3], [1.0] * 3, [-1] * 3, top_ps, [0.9] * 3)
    assert tokens.tolist() == [2, 3, 3]
    # greedy ignores the uniform; rows of mixed kinds in one call
    tokens = sample_tokens(
        logits[:3], logprobs[:3], [0.0, 1.0, 2.0], [-1, 1, -1], [1.0, 1.0, 1.0], [0.99, 0.99, 0.0]
    )
    assert tokens.tolist() == [3, 3, 0]


def _reference_token(row, temperature, top_k, top_p, uniform):
    """The plain algorithm: sort the whole vocabulary, filter, inverse CDF."""
    scores = row / temperature
    if top_k > 0:
        scores = scores.masked_fill(scores < torch.topk(scores, top_k).values[-1], float("-inf"))
    ordered, order = torch.sort(scores, descending=True)
    probs = torch.softmax(ordered, -1)
    ordered = ordered.masked_fill(probs.cumsum(-1) - probs > top_p, float("-inf"))
    cdf = torch.softmax(ordered, -1).cumsum(-1, dtype=torch.float64)
    index = int(torch.searchsorted(cdf, torch.tensor([uniform * float(cdf[-1])]), right=True))
    return int(order[min(index, len(cdf) - 1)])


@pytest.mark.parametrize("spread", [4.0, 0.05])  # peaked: 1024 candidates suffice; flat: they don't
def test_sample_tokens_top_p_matches_a_full_sort(spread):
    from retool.backends.local.engine import sample_tokens

    generator = torch.Generator().manual_seed(0)
    vocab = 5000
    logits = torch.randn(8, vocab, generator=generator) * spread
    logprobs = logits.log_softmax(-1)
    temperatures = [0.7, 1.0, 1.3, 0.9, 1.0, 0.7, 1.1, 1.0]
    top_ks = [-1, -1, 40, 2000, -1, 1500, -1, 3]
    top_ps = [0.9, 0.5, 0.95, 0.8, 0.99, 1.0, 0.3, 1.0]
    for uniform in [0.01, 0.3, 0.61, 0.97]:
        uniforms = [uniform] * 8
        got = sample_tokens(logits, logprobs, temperatures, top_ks, top_ps, uniforms).tolist()
        want = [
            _reference_token(logits[i], temperatures[i], top_ks[i], top_ps[i], uniform)
            for i in range(8)
        ]
        assert got == want


@pytest.mark.parametrize(
    ("lean", "common"),
    [(True, 0), (False, 0), (True, 40), (False, 40)],
    ids=["lean-decode", "hf-forward", "lean-decode-shared-prefix", "hf-forward-shared-prefix"],
)
def test_rows_joining_and_leaving_all_the_time_keep_their_policy(service, lean, common):
    """Requests of many prompt lengths, each submitted the moment an earlier one finishes
    (as an evaluation does): rows take the slots finished rows freed, longer prompts widen
    the batch to the left, and every sequence's logprobs still equal ``forward`` on its own
    tokens, through the lean decode step and through HF's forward over the same cache.
    ``common``: the prompts start with the same tokens (a system prompt), which the lean
    step reads once for every row that shares it."""
    import threading

    template = service.create_sampling_client(base_model="tiny-random")
    model, tokenizer = template.engine.model, template.engine.tokenizer
    template.close()
    engine = SamplingEngine(model, tokenizer, lean_decode=lean)
    done, lock, results = threading.Event(), threading.Lock(), []
    head = list(range(2000, 2000 + common))
    prompts = [head + list(range(100 + i, 108 + 9 * i)) for i in range(10)]
    queue = list(enumerate(prompts))

    def submit() -> None:
        with lock:
            if not queue:
                return
            i, prompt = queue.pop(0)
        params = SamplingParams(max_tokens=6 + 7 * (i % 4), seed=i, temperature=0.9)
        future = engine.submit(prompt, 1 + i % 3, params)
        future.add_done_callback(lambda f, p=prompt: finished(f, p))

    def finished(future, prompt) -> None:
        with lock:
            results.append((prompt, future.result()))
            if len(results) == len(prompts):
                done.set()
        submit()

    try:
        for _ in range(4):  # four in flight, then one more as each finishes
            submit()
        assert done.wait(120)
        assert engine.joins == sum(1 + i % 3 for i in range(10)) - sum(
            s.stop_reason is SamplerStop.STOP and len(s.tokens) == 1
            for _, r in results
            for s in r.sequences
        )
        assert engine.batch_copies < len(prompts)  # most joins copied nothing
        assert (engine.prefix_rows > 0) == (lean and common > 0)
        for prompt, response in results:
            for sequence in response.sequences:
                _assert_policy_logprobs(model, prompt, sequence)
    finally:
        engine.close()


def test_a_batch_begun_by_one_prompt_shares_the_prefix_with_the_prompts_that_join_later(service):
    """An evaluation's first request reaches the engine alone: the batch it starts has no
    shared prefix. A continuation of the first prompt joining says nothing about what other
    questions share, so it sets none; when prompts with the same head join while it
    decodes, the batch takes their common head as its shared prefix; the later rows read
    it once per step, and every sequence's logprobs still equal ``forward`` on its own
    tokens."""
    import time

    template = service.create_sampling_client(base_model="tiny-random")
    model, tokenizer = template.engine.model, template.engine.tokenizer
    template.close()
    engine = SamplingEngine(model, tokenizer)
    head = list(range(2000, 2040))
    prompts = [head + list(range(100 + i, 108 + 5 * i)) for i in range(4)]
    try:
        # no stop: the first rows decode all their tokens, long after the others joined
        first = engine.submit(prompts[0], 2, SamplingParams(max_tokens=1500, seed=0))
        deadline = time.monotonic() + 60
        while engine.steps == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        continued = prompts[0] + [7, 8, 9]  # the first prompt and a few more tokens
        with engine.paused():
            assert not first.done() and engine.prefix_rows == 0  # decoding alone, no prefix
            follow = engine.submit(continued, 1, SamplingParams(max_tokens=1500, seed=1))
        while engine.joins < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        with engine.paused():  # the later prompts join together, while the first decodes
            assert engine._batch is not None and engine._batch.step_prefix() is None
            assert not first.done() and not follow.done()
            later = [
                engine.submit(p, 2, SamplingParams(max_tokens=8, seed=i, temperature=0.9))
                for i, p in enumerate(prompts[1:], start=1)
            ]
        responses = [f.result(timeout=120) for f in [first, *later]]
        assert engine._batch is None or engine._batch.prefix_tokens == tuple(head)
        follow.result(timeout=120)
        assert engine.prefix_rows == 6  # the 3 later prompts' 2 rows each
        for prompt, response in zip([prompts[0], *prompts[1:]], responses, strict=True):
            for sequence in response.sequences:
                _assert_policy_logprobs(model, prompt, sequence)
    finally:
        engine.close()


def test_a_finished_batch_is_freed_without_the_garbage_collector(sampler):
    """An emptied batch's KV buffers go when the engine drops them, not at a full gc.

    Its layers once held it strongly (a cycle), so every RL step's batch buffers
    lived until Python's rare full collection: the long demo grew ~1.85 GB a step.
    ``gc.get_objects`` lists uncollected cyclic garbage too, so it sees a leak.
    """
    import gc

    from retool.backends.local.kv import BatchCache

    gc.collect()
    gc.disable()
    try:
        for seed in (1, 2):  # two batches, one after the other
            response = _sample(sampler, PROMPT, n=3, max_tokens=12, seed=seed)
            assert len(response.sequences) == 3
            with sampler.engine.paused():  # the step that finished the rows has returned
                alive = [o for o in gc.get_objects() if type(o) is BatchCache]
            assert alive == [], f"{len(alive)} batch cache(s) outlived their rows"
    finally:
        gc.enable()
