"""vLLM in-process sampler: start-up, weight sync per step (merged vs lora), tok/s.

    flock /tmp/retool-bench.lock .venv/bin/python bench/vllm_sync.py [--model smollm2-135m-instruct]

One process, one trainer (LoRA r=32, float32, the local backend) and, in turn:

* the local sampler: ``save_weights_and_get_sampling_client`` (the snapshot), then
  the workload;
* vLLM with ``sync = "merged"`` and with ``sync = "lora"``: engine start-up
  (export + ``vllm.LLM``), the workload, then ``--steps`` times one optimizer
  step followed by ``snapshot()`` (the sync) and the workload again.

Workload: 4 prompts x ``num_samples=4`` to 128 new tokens (the first round of
``bench/local_backend.py --part sampling``), submitted at once. Prints each
figure and the ratios to the local sampler. Timings share the host with
whatever else runs: report the load (``uptime``) with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    "Compute 17 * 23 with Python and explain.",
    "What is the sum of the first 100 primes?",
    "Solve x^2 - 5x + 6 = 0.",
    "How many divisors does 360 have?",
]


def workload(client, tokenizer, max_tokens: int = 128) -> tuple[float, int]:
    from retool.types import ModelInput, SamplingParams

    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in PROMPTS
    ]
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    started = time.monotonic()
    futures = [
        client.sample(
            ModelInput.from_ints(p), 4, SamplingParams(max_tokens=max_tokens, seed=i, stop=())
        )
        for i, p in enumerate(prompts)
    ]
    tokens = sum(len(s.tokens) for f in futures for s in f.result().sequences)
    return time.monotonic() - started, tokens


def train_step(trainer) -> None:
    from retool.types import AdamParams, Datum, ModelInput, TensorData

    tokens = list(range(100, 164))
    datum = Datum(
        ModelInput.from_ints(tokens[:-1]),
        {
            "target_tokens": TensorData.from_list(tokens[1:], "int64"),
            "weights": TensorData.from_list([1.0] * (len(tokens) - 1)),
        },
    )
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(AdamParams(learning_rate=1e-3)).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--modes", default="local,merged,lora")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per sample")
    args = parser.parse_args()
    from retool.backends.local import LocalServiceClient
    from retool.backends.vllm import EngineOptions, VllmPolicySampler
    from retool.types import ModelInput, SamplingParams

    print(f"host: {os.uname().nodename}, load {os.getloadavg()}, cpus {os.cpu_count()}")
    root = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    service = LocalServiceClient(device="cpu", dtype="float32", checkpoint_root=root)
    trainer = service.create_lora_training_client(args.model, rank=32, seed=0)
    tokenizer = trainer.get_tokenizer()
    results: dict[str, dict[str, float]] = {}
    client: Any
    for mode in args.modes.split(","):
        row: dict[str, float] = {}
        if mode == "local":
            started = time.monotonic()
            client = trainer.save_weights_and_get_sampling_client()
            row["snapshot_s"] = time.monotonic() - started
            workload(client, tokenizer, 8)  # warm-up
            runs = [workload(client, tokenizer, args.max_tokens) for _ in range(2)]
            client.close()
            syncs = []
            for _ in range(args.steps):
                train_step(trainer)
                started = time.monotonic()
                client = trainer.save_weights_and_get_sampling_client()
                syncs.append(time.monotonic() - started)
                runs.append(workload(client, tokenizer, args.max_tokens))
                client.close()
        else:
            options = EngineOptions(dtype=args.dtype, max_model_len=2048, max_num_seqs=16)
            started = time.monotonic()
            policy = VllmPolicySampler(trainer, mode, options, root)
            row["startup_s"] = time.monotonic() - started
            row["engine_s"] = policy.engine.startup_s
            client = policy.snapshot()
            workload(client, tokenizer, 8)  # warm-up
            runs = [workload(client, tokenizer, args.max_tokens) for _ in range(2)]
            syncs = []
            for _ in range(args.steps):
                train_step(trainer)
                started = time.monotonic()
                client = policy.snapshot()
                syncs.append(time.monotonic() - started)
                runs.append(workload(client, tokenizer, args.max_tokens))
                probe = client.sample(
                    ModelInput.from_ints([1, 2, 3]), 1, SamplingParams(max_tokens=2)
                )
                (sequence,) = probe.result().sequences
                assert sequence.policy_version == client.policy_version  # the step's weights
            policy.close()
        row["sync_s"] = statistics.median(syncs)
        row["tok_s"] = statistics.median(tokens / seconds for seconds, tokens in runs)
        results[mode] = row
        print(mode, {k: round(v, 3) for k, v in row.items()}, flush=True)
    if "local" in results:
        base = results["local"]["tok_s"]
        for mode, row in results.items():
            print(f"{mode}: {row['tok_s']:.1f} tok/s = {row['tok_s'] / base:.2f}x local")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
