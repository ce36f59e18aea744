"""The lean decode step against HF's forward, and the engine's clean stop."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from retool.backends.local.decode import lean_decoder_for
from retool.backends.local.kv import make_cache


@pytest.fixture(scope="module")
def model():
    from retool.backends.local.models import load_model

    return load_model("tiny-random", seed=3).eval()


def _batch(model, sequences):
    """Right-aligned KV of each sequence's prefill (all but its last token), and the mask."""
    width = max(len(s) for s in sequences) - 1
    layers = model.config.num_hidden_layers
    keys = [[] for _ in range(layers)]
    values = [[] for _ in range(layers)]
    valid = torch.zeros(len(sequences), width, dtype=torch.bool)
    with torch.no_grad():
        for row, tokens in enumerate(sequences):
            cache = model(input_ids=torch.tensor([tokens[:-1]]), use_cache=True).past_key_values
            pad = width - (len(tokens) - 1)
            valid[row, pad:] = True
            for i, layer in enumerate(cache.layers):
                keys[i].append(torch.nn.functional.pad(layer.keys, (0, 0, pad, 0)))
                values[i].append(torch.nn.functional.pad(layer.values, (0, 0, pad, 0)))
    kv = [(torch.cat(k), torch.cat(v)) for k, v in zip(keys, values, strict=True)]
    return kv, valid


def test_lean_step_equals_hf_forward_over_a_padded_batch(model):
    decoder = lean_decoder_for(model)
    assert decoder is not None
    generator = torch.Generator().manual_seed(0)
    sequences = [
        torch.randint(3, 40000, (n,), generator=generator).tolist() for n in (9, 23, 16, 23)
    ]
    kv, valid = _batch(model, sequences)
    ids = torch.tensor([s[-1] for s in sequences])
    positions = torch.tensor([len(s) - 1 for s in sequences])
    mask = torch.cat([valid, torch.ones(len(sequences), 1, dtype=torch.bool)], dim=1)
    cache = make_cache(kv, extra=4)
    with torch.no_grad():
        got = decoder.step(ids, positions, cache.layers, mask).log_softmax(-1)
        for row, tokens in enumerate(sequences):  # each row alone, no padding, full forward
            want = model(input_ids=torch.tensor([tokens])).logits[0, -1].log_softmax(-1)
            assert (got[row] - want).abs().max() <= 1e-5
    # The step appended each row's new key/value column.
    assert all(layer.get_seq_length() == valid.shape[1] + 1 for layer in cache.layers)
    with torch.no_grad():  # a second step reads what the first wrote
        ids2 = got.argmax(-1)
        mask2 = torch.cat([mask, torch.ones(len(sequences), 1, dtype=torch.bool)], dim=1)
        got2 = decoder.step(ids2, positions + 1, cache.layers, mask2).log_softmax(-1)
        for row, tokens in enumerate(sequences):
            want = model(input_ids=torch.tensor([[*tokens, int(ids2[row])]])).logits[0, -1]
            assert (got2[row] - want.log_softmax(-1)).abs().max() <= 1e-5


def test_lean_step_with_a_shared_prefix_equals_hf_forward(model):
    """Rows that share a prefix read it once (``BatchCache`` holds it apart from their own
    columns); a row that does not share it is masked off it; both equal HF's forward."""
    from retool.backends.local.kv import BatchCache

    decoder = lean_decoder_for(model)
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 40000, (12,), generator=generator).tolist()
    sequences = [
        prefix + torch.randint(3, 40000, (n,), generator=generator).tolist() for n in (3, 9, 5)
    ]
    sequences.append(torch.randint(3, 40000, (15,), generator=generator).tolist())  # no prefix
    with torch.no_grad():
        kvs = []
        for tokens in sequences:
            cache = model(input_ids=torch.tensor([tokens[:-1]]), use_cache=True).past_key_values
            kvs.append([(layer.keys, layer.values) for layer in cache.layers])
        shared = [(k[:, :, :12], v[:, :, :12]) for k, v in kvs[0]]
        batch = BatchCache(kvs[0], 4, 16, left=2, spare=3, prefix=(prefix, shared))
        slots = batch.add([(kv, 1, tokens[:-1]) for kv, tokens in zip(kvs, sequences, strict=True)])
        assert [s for (s,) in slots] == [0, 1, 2, 3]
        assert batch.shared[:4].tolist() == [True, True, True, False]
        tokens = [list(s) for s in sequences]
        for _ in range(5):  # more steps than the spare columns: the window moves left once
            ids = torch.tensor([t[-1] for t in tokens])
            positions = torch.tensor([len(t) - 1 for t in tokens])
            mask = batch.step_mask()
            got = decoder.step(ids, positions, batch.layers, mask, batch.step_prefix())
            batch.advance()
            for row, row_tokens in enumerate(tokens):
                want = model(input_ids=torch.tensor([row_tokens])).logits[0, -1]
                assert (got[row].log_softmax(-1) - want.log_softmax(-1)).abs().max() <= 1e-5
            for row, token in enumerate(got.argmax(-1).tolist()):
                tokens[row].append(token)
        assert (batch.moves, batch.copies) == (1, 0)


def test_a_bf16_model_decodes_over_a_float32_batch_cache(model):
    """A bf16 model on CPU keeps its batch cache in float32 (bf16 batched products at
    decode shapes are 2-3x slower there): rows go in and come back out in bf16 bit for
    bit, and the step's logprobs stay within bf16 rounding of HF's bf16 forward."""
    import copy

    from retool.backends.local.kv import BatchCache

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    decoder = lean_decoder_for(bf16)
    assert decoder is not None and decoder.cache_dtype == torch.float32
    generator = torch.Generator().manual_seed(4)
    prefix = torch.randint(3, 40000, (10,), generator=generator).tolist()
    sequences = [
        prefix + torch.randint(3, 40000, (n,), generator=generator).tolist() for n in (4, 7)
    ]
    sequences.append(torch.randint(3, 40000, (13,), generator=generator).tolist())
    with torch.no_grad():
        kvs = []
        for tokens in sequences:
            cache = bf16(input_ids=torch.tensor([tokens[:-1]]), use_cache=True).past_key_values
            kvs.append([(layer.keys, layer.values) for layer in cache.layers])
        assert kvs[0][0][0].dtype == torch.bfloat16
        shared = [(k[:, :, :10], v[:, :, :10]) for k, v in kvs[0]]
        batch = BatchCache(
            kvs[0], 3, 16, left=2, spare=3, prefix=(prefix, shared), dtype=torch.float32
        )
        batch.add([(kv, 1, tokens[:-1]) for kv, tokens in zip(kvs, sequences, strict=True)])
        assert batch.keys[0].dtype == torch.float32 and batch.kv_dtype == torch.bfloat16
        for slot, kv in enumerate(kvs):  # a round trip through float32 is exact
            if slot < 2:  # a sharing row reads the prefix's columns from the batch's copy
                kv = [
                    (torch.cat([pk, k[:, :, 10:]], 2), torch.cat([pv, v[:, :, 10:]], 2))
                    for (pk, pv), (k, v) in zip(shared, kv, strict=True)
                ]
            back = batch.row_kv(slot)
            assert all(k.dtype == v.dtype == torch.bfloat16 for k, v in back)
            assert all(
                torch.equal(k, k0) and torch.equal(v, v0)
                for (k, v), (k0, v0) in zip(back, kv, strict=True)
            )
        tokens = [list(s) for s in sequences]
        worst = 0.0
        for _ in range(4):
            ids = torch.tensor([t[-1] for t in tokens])
            positions = torch.tensor([len(t) - 1 for t in tokens])
            got = decoder.step(ids, positions, batch.layers, batch.step_mask(), batch.step_prefix())
            batch.advance()
            assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
            for row, row_tokens in enumerate(tokens):
                want = bf16(input_ids=torch.tensor([row_tokens])).logits[0, -1].float()
                diff = got[row].float().log_softmax(-1) - want.log_softmax(-1)
                worst = max(worst, float(diff.abs().max()))
            for row, token in enumerate(got.argmax(-1).tolist()):
                tokens[row].append(token)
        assert worst <= 0.02, worst  # measured 0.005


def test_other_architectures_fall_back_to_hf():
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    from retool.backends.local.models import load_model

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    assert lean_decoder_for(gpt2) is None
    llama = load_model("tiny-random")
    config = LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")
    assert lean_decoder_for(get_peft_model(llama, config)) is None
    assert lean_decoder_for(llama) is None  # its q_proj layers are LoRA layers now


def test_engine_without_lean_decode_samples_the_same_policy(model, smol_tokenizer):
    from retool.backends.local.engine import SamplingEngine
    from retool.types import SamplingParams

    prompt = list(range(100, 130))
    engine = SamplingEngine(model, smol_tokenizer, lean_decode=False)
    try:
        assert engine.decoder is None
        response = engine.submit(prompt, 2, SamplingParams(max_tokens=8, seed=4)).result(120)
    finally:
        engine.close()
    for sequence in response.sequences:
        ids = torch.tensor([prompt + list(sequence.tokens)])
        with torch.no_grad():
            logprobs = model(input_ids=ids).logits[0].log_softmax(-1)
        want = [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(sequence.tokens)]
        assert max(abs(a - b) for a, b in zip(want, sequence.logprobs, strict=True)) <= 1e-4


def test_close_fails_requests_in_flight_and_queued(model, smol_tokenizer):
    from retool.backends.local.engine import SamplingEngine
    from retool.types import SamplingParams

    engine = SamplingEngine(model, smol_tokenizer)
    with engine.paused():
        running = engine.submit(list(range(5, 50)), 2, SamplingParams(max_tokens=4000, seed=0))
    deadline = time.monotonic() + 60
    while engine.steps < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    engine.close()
    assert engine.closed and not engine._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        running.result(5)
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit([1, 2, 3], 1, SamplingParams(max_tokens=4)).result(5)
    engine.close()  # idempotent


_CHILD = textwrap.dedent(
    """
    import sys
    import time

    from retool.backends.local import LocalServiceClient
    from retool.types import ModelInput, SamplingParams

    client = LocalServiceClient(checkpoint_root={root!r}).create_sampling_client(
        base_model="tiny-random"
    )
    future = client.sample(
        ModelInput.from_ints(list(range(5, 200))), 16, SamplingParams(max_tokens=4000, seed=0)
    )
    while client.engine.steps < 3:
        time.sleep(0.001)
    try:  # entered before the parent hears "sampling" and sends SIGINT
        print("sampling", flush=True)
        future.result()  # never closed: interpreter exit must still stop the engine cleanly
    except KeyboardInterrupt:
        sys.exit(130)  # what the CLI does
    """
)


def test_ctrl_c_while_sampling_exits_130_without_abort(tmp_path):
    """Ctrl-C with the engine thread inside torch: exit 130, no 'terminate called' abort."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(root=str(tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # SIGINT's default disposition, whatever the test runner inherited
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert child.stdout.readline().strip() == "sampling"
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert "terminate called" not in stderr and "Fatal Python error" not in stderr
    assert child.returncode == 130, stderr[-2000:]
