"""Local backend benchmark: our sampler and trainer against plain transformers.

    .venv/bin/python bench/local_backend.py [--repeats 3] [--part sampling|decode|training|all]

1. Rollout-shaped sampling on smollm2-135m-instruct, CPU: 4 prompts x
   ``num_samples=4``, then 16 continuation prompts (each first-round output plus
   a 40-token observation), every request to 128 new tokens. Baseline: HF
   ``generate`` per request, then the forward pass a user writes to get the
   logprobs of what was sampled. Ours: every request submitted to one
   ``LocalSamplingClient`` (batched decode, shared prefill, prefix cache).
2. ``forward_backward`` with ``ppo`` on 8 datums x 512 tokens, LoRA r=32.
   Baseline: one HF forward over full logits + log-softmax + the same loss +
   backward. Ours: ``LocalTrainingClient.forward_backward``. Each variant runs
   in its own process so that peak RSS is its own.

3. One decode step at 4, 16 and 32 rows: 4 prompts x ``num_samples`` rows decoded
   together by the engine, once with the lean Llama decode step (the default)
   and once with HF's forward, interleaved. The engine's whole step (forward,
   sampling, stop checks, bookkeeping) against the model's own forward for that
   batch, timed two ways: the engine's model call inside the step, and a bare
   HF forward of the same number of rows x 1 token over an HF cache of the same
   length (an all-ones mask, no padding). Target: the step within 1.5x of the
   forward.

Model loading, the baseline and the bare forwards run in a worker thread
(``retool.backends.local.threads.run_in_worker``), as the backend's own calls
do, so that the main thread holds no OpenMP pool that would slow the sampling
engine's thread (see ``threads.py``); each variant is timed in its best setting.

Prints medians over the repeats, absolute figures and the ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from functools import partial

from retool.backends.local.threads import run_in_worker

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is 123456 * 789?",
    "How many primes are there below 1000?",
    "What is the sum of the digits of 2^100?",
    "What is 17^23 mod 1000?",
]


def _device() -> str:
    """Where the models run: the GPU if there is one, as ``LocalServiceClient(device="auto")``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    """Wait for queued GPU work (a CUDA call returns once its kernels are queued)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _prompts(tokenizer):
    from retool.protocol import get_protocol

    dialect = get_protocol("markdown")
    return [
        dialect.render_prompt(tokenizer, dialect.initial_messages(q, tokenizer)) for q in QUESTIONS
    ]


def _observation(tokenizer, i: int) -> list[int]:
    text = "<|im_end|>\n<|im_start|>user\n```output\n" + " ".join(
        str(7919 * (i + k)) for k in range(40)
    )
    return tokenizer.encode(text, add_special_tokens=False)[:40]


def sampling_baseline(model, tokenizer, seed: int) -> tuple[int, float]:
    """HF generate per request, then logprobs recomputed with a forward pass."""
    import torch

    torch.manual_seed(seed)
    tokens = 0
    started = time.perf_counter()

    def generate(prompt: list[int], n: int) -> list[list[int]]:
        ids = torch.tensor([prompt], device=model.device)
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=128,
                min_new_tokens=128,
                num_return_sequences=n,
                pad_token_id=tokenizer.eos_token_id,
            )
            completions = out[:, len(prompt) :]
            # The logprob recomputation a user writes: one forward over each sequence.
            logits = model(input_ids=out).logits[:, len(prompt) - 1 : -1].float()
            logits.log_softmax(-1).gather(-1, completions.unsqueeze(-1))
        return [row.tolist() for row in completions]

    firsts = [c for p in _prompts(tokenizer) for c in generate(p, 4)]
    tokens += sum(len(c) for c in firsts)
    prompts = _prompts(tokenizer)
    for i, completion in enumerate(firsts):
        follow = prompts[i // 4] + completion + _observation(tokenizer, i)
        tokens += sum(len(c) for c in generate(follow, 1))
    return tokens, time.perf_counter() - started


def sampling_ours(model, tokenizer, seed: int, lean: bool = True) -> tuple[int, float, dict]:
    from retool.backends.local.sampling import LocalSamplingClient
    from retool.types import ModelInput, SamplingParams

    client = LocalSamplingClient(model, tokenizer, lean_decode=lean)
    params = SamplingParams(max_tokens=128, seed=seed)
    started = time.perf_counter()
    prompts = _prompts(tokenizer)
    first = [client.sample(ModelInput.from_ints(p), 4, params) for p in prompts]
    firsts = [list(s.tokens) for f in first for s in f.result().sequences]
    follows = [
        client.sample(
            ModelInput.from_ints(prompts[i // 4] + c + _observation(tokenizer, i)),
            1,
            SamplingParams(max_tokens=128, seed=seed + 1 + i),
        )
        for i, c in enumerate(firsts)
    ]
    seconds = 0.0
    tokens = sum(len(c) for c in firsts)
    tokens += sum(len(s.tokens) for f in follows for s in f.result().sequences)
    seconds = time.perf_counter() - started
    stats = client.prefix_stats()
    client.close()
    return (
        tokens,
        seconds,
        {
            "prefix_hits": stats.hits,
            "tokens_reused": stats.tokens_reused,
            "tokens_prefilled": stats.tokens_prefilled,
        },
    )


def run_sampling(repeats: int) -> None:
    from retool.backends.local.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(MODEL)
    model = run_in_worker(lambda: load_model(MODEL).eval().to(_device()))
    rates: dict[str, list[float]] = {"baseline": [], "ours": [], "ours, HF decode": []}
    for repeat in range(repeats):
        n, seconds = run_in_worker(partial(sampling_baseline, model, tokenizer, seed=repeat))
        rates["baseline"].append(n / seconds)
        print(
            f"  sampling baseline        repeat {repeat + 1}: {n} tokens in {seconds:.1f}s "
            f"= {n / seconds:.1f} tok/s",
            flush=True,
        )
        for name, lean in (("ours", True), ("ours, HF decode", False)):
            n, seconds, stats = sampling_ours(model, tokenizer, seed=repeat, lean=lean)
            rates[name].append(n / seconds)
            print(
                f"  sampling {name:<15} repeat {repeat + 1}: {n} tokens in {seconds:.1f}s "
                f"= {n / seconds:.1f} tok/s  {stats}",
                flush=True,
            )
    base, ours, hf = (statistics.median(rates[k]) for k in rates)
    print(
        f"SAMPLING  baseline {base:.1f} tok/s | ours {ours:.1f} tok/s | "
        f"ratio {ours / base:.2f}x (target >= 5x) | ours with HF's forward for decode "
        f"{hf:.1f} tok/s ({hf / base:.2f}x)",
        flush=True,
    )


def decode_profile(model, tokenizer, rows: int, lean: bool, new_tokens: int = 48) -> dict:
    """Median per-step seconds of the engine's decode step and of its model call.

    ``lean``: the engine's lean Llama decode step (the default), else HF's forward.
    """
    import torch

    from retool.backends.local.engine import SamplingEngine
    from retool.types import SamplingParams

    steps: list[float] = []
    calls: list[float] = []
    widths: list[int] = []
    engine = SamplingEngine(model, tokenizer, lean_decode=lean)
    original_step = engine._step

    def timed(call):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                _sync()
                if lean or kwargs.get("attention_mask") is not None:  # decode, not prefill
                    calls.append(time.perf_counter() - started)

        return run

    def timed_step():
        assert engine._batch is not None
        widths.append(engine._batch.width)
        started = time.perf_counter()
        original_step()
        steps.append(time.perf_counter() - started)

    engine._step = timed_step
    if lean:
        assert engine.decoder is not None
        engine.decoder.step = timed(engine.decoder.step)
    else:
        model.forward = timed(model.forward)
    try:
        params = SamplingParams(max_tokens=new_tokens, seed=0, stop=("<never-stops>",))
        with engine.paused():
            futures = [engine.submit(p, rows // 4, params) for p in _prompts(tokenizer)]
        for future in futures:
            future.result()
    finally:
        if not lean:
            del model.forward
        engine.close()
    width = int(statistics.median(widths))
    # The bare forward: rows x 1 token over a cache of the same length, HF's own cache.
    from transformers.cache_utils import DynamicCache

    config = model.config
    heads = config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    bare: list[float] = []

    def bare_forwards() -> None:
        for _ in range(5):
            cache = DynamicCache()
            for layer in range(config.num_hidden_layers):
                keys, values = (
                    torch.randn(rows, heads, width, dim, dtype=model.dtype, device=model.device)
                    for _ in range(2)
                )
                cache.update(keys, values, layer)
            ids = torch.randint(0, 1000, (rows, 1), device=model.device)
            # An all-ones mask: without one, transformers asks SDPA for its GQA mode,
            # which is slower on CPU than the packed-GQA path a mask selects.
            mask = torch.ones(rows, width + 1, dtype=torch.long, device=model.device)
            _sync()
            started = time.perf_counter()
            with torch.no_grad():
                kwargs = {engine._cache_kwarg: cache}  # an unknown name would drop the cache
                model(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs)
            _sync()
            bare.append(time.perf_counter() - started)

    run_in_worker(bare_forwards)
    return {
        "step": statistics.median(steps),
        "call": statistics.median(calls),
        "bare": statistics.median(bare),
        "width": width,
    }


def run_decode(repeats: int) -> None:
    """Per row count: the HF-forward engine and the lean engine, interleaved in one run."""
    from retool.backends.local.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(MODEL)
    model = run_in_worker(lambda: load_model(MODEL).eval().to(_device()))
    for rows in (4, 16, 32):
        results: dict[bool, list[dict]] = {False: [], True: []}
        for repeat in range(repeats):
            for lean in (False, True):
                r = decode_profile(model, tokenizer, rows, lean)
                results[lean].append(r)
                print(
                    f"  decode {rows} rows {'lean' if lean else 'HF  '} repeat {repeat + 1}: "
                    f"step {r['step'] * 1e3:.0f} ms | its model call {r['call'] * 1e3:.0f} ms | "
                    f"bare HF forward {r['bare'] * 1e3:.0f} ms (cache {r['width']} tokens)",
                    flush=True,
                )
        med = {
            lean: {k: statistics.median(r[k] for r in rs) for k in ("step", "call", "bare")}
            for lean, rs in results.items()
        }
        hf, lean = med[False], med[True]
        bare = statistics.median(r["bare"] for rs in results.values() for r in rs)
        print(
            f"DECODE {rows} rows  lean step {lean['step'] * 1e3:.0f} ms "
            f"({rows / lean['step']:.0f} tok/s) | HF-forward step {hf['step'] * 1e3:.0f} ms | "
            f"lean speed-up {hf['step'] / lean['step']:.2f}x | step / its model call "
            f"{lean['step'] / lean['call']:.2f}x | step / bare HF forward {bare * 1e3:.0f} ms "
            f"{lean['step'] / bare:.2f}x (target <= 1.5x)",
            flush=True,
        )


def training_child(variant: str) -> None:
    """One forward_backward in this process; prints JSON with time and peak RSS."""
    import torch

    from retool.backends.local import LocalServiceClient
    from retool.backends.local.losses import compute_loss
    from retool.types import Datum, ModelInput, TensorData

    torch.manual_seed(0)
    if variant == "ours":
        service = LocalServiceClient(checkpoint_root="/tmp/retool-bench-ckpt")
        client = service.create_lora_training_client(MODEL, rank=32, seed=0)
    else:  # what a user writes with transformers + peft: no retool code in the model path
        from peft import LoraConfig, get_peft_model

        from retool.backends.local.models import load_model
        from retool.backends.local.training import DEFAULT_TARGET_MODULES

        model = get_peft_model(
            load_model(MODEL).to(_device()),
            LoraConfig(
                r=32,
                lora_alpha=32,
                lora_dropout=0.0,
                task_type="CAUSAL_LM",
                target_modules=list(DEFAULT_TARGET_MODULES),
            ),
        )
        model.train()
    vocab = 49152
    data = []
    for i in range(8):
        tokens = torch.randint(0, vocab, (513,), generator=torch.Generator().manual_seed(i))
        data.append(
            Datum(
                ModelInput.from_ints(tokens[:-1].tolist()),
                {
                    "target_tokens": TensorData.from_numpy(tokens[1:].numpy()),
                    "logprobs": TensorData.from_list([-10.0] * 512),
                    "advantages": TensorData.from_list([0.5 if i % 2 else -0.5] * 512),
                },
            )
        )
    device = _device()
    started = time.perf_counter()
    if variant == "ours":
        client.forward_backward(data, "ppo").result()
    else:
        ids = torch.tensor([d.model_input.to_ints() for d in data], device=device)
        targets = torch.tensor(
            [d.loss_fn_inputs["target_tokens"].tolist() for d in data], device=device
        )
        logits = model(input_ids=ids).logits.float()
        logprobs = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        old = torch.full_like(logprobs, -10.0)
        adv = torch.tensor([[0.5 if i % 2 else -0.5] * 512 for i in range(8)], device=device)
        loss, _ = compute_loss(
            "ppo",
            logprobs.reshape(-1),
            {"logprobs": old.reshape(-1), "advantages": adv.reshape(-1)},
        )
        loss.backward()
    _sync()
    seconds = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    figures = {"seconds": seconds, "peak_rss_gb": peak_kb / 1024 / 1024}
    if device == "cuda":  # the activations live on the GPU: RSS does not see them
        figures["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 1024**3
    print(json.dumps(figures))


def run_training(repeats: int) -> None:
    results: dict[str, list[dict]] = {"baseline": [], "ours": []}
    for repeat in range(repeats):
        for variant in ("baseline", "ours"):
            done = subprocess.run(
                [sys.executable, __file__, "--child", variant],
                capture_output=True,
                text=True,
                check=True,
            )
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            results[variant].append(figures)
            gpu = figures.get("peak_cuda_gb")
            print(
                f"  training {variant:<8} repeat {repeat + 1}: {figures['seconds']:.1f}s, "
                f"{8 * 512 / figures['seconds']:.0f} tok/s, peak RSS "
                f"{figures['peak_rss_gb']:.2f} GB" + (f", peak CUDA {gpu:.2f} GB" if gpu else ""),
                flush=True,
            )
    med = {
        v: (
            statistics.median(r["seconds"] for r in rs),
            statistics.median(r["peak_rss_gb"] for r in rs),
        )
        for v, rs in results.items()
    }
    (bs, brss), (os_, orss) = med["baseline"], med["ours"]
    print(
        f"TRAINING  baseline {8 * 512 / bs:.0f} tok/s, {brss:.2f} GB | ours "
        f"{8 * 512 / os_:.0f} tok/s, {orss:.2f} GB | speed {bs / os_:.2f}x (target >= 1.3x), "
        f"peak RSS {orss / brss:.2f} of baseline (target <= 0.5)",
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--part", choices=["sampling", "decode", "training", "all"], default="all")
    parser.add_argument("--child", choices=["baseline", "ours"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        training_child(args.child)
    else:
        if args.part in ("training", "all"):
            run_training(args.repeats)
        if args.part in ("sampling", "all"):
            run_sampling(args.repeats)
        if args.part in ("decode", "all"):
            run_decode(args.repeats)
