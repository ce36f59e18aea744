"""Numerics bench: float32 against bfloat16 for the sampler, the trainer and an RL step.

    flock /tmp/retool-bench.lock .venv/bin/python bench/numerics.py \
        [--new-tokens 32] [--train-rows 4 --train-tokens 256 --train-shared 180]
        [--rl-steps 1] [--skip-rl]
        [--init-from runs/demo-.../sft] [--full-step]

All in one run, on smollm2-135m-instruct (LoRA r=16), each dtype through the
local backend's own paths (``model.dtype = "float32"`` / ``"bfloat16"``: a bf16
sampler holds bf16 weights; a bf16 trainer runs the decoder under autocast with
float32 master weights and a float32 head):

1. the host (CPU, bf16 flags, torch threads) and what ``model.dtype = "auto"``
   chooses per role at the demo's shapes, with its timings;
2. sampler tok/s on the rollout-shaped workload of ``bench/local_backend.py``
   (4 prompts x 4 samples, then 16 continuations with a 40-token observation),
   ``--new-tokens`` each;
3. training ``forward_backward`` (``ppo``) tok/s on ``--train-rows`` datums of
   ``--train-tokens`` tokens (median of 4 after a warm-up), unrelated and sharing
   their first ``--train-shared`` tokens (an RL group's prompt: the shared-prefix
   path), for float32, bf16 eager (``model.compile = "off"``) and bf16 as a run
   gets it (``auto``: element-wise kernels compiled where a compiler is found;
   the time to start that trainer includes the compile);
4. the measured ``sampler_kl`` (mean over sampled tokens of log π_sampler -
   log π_trainer) for every sampler/trainer pair: fp32/fp32, bf16/bf16, and a
   bf16 sampler with an fp32 trainer;
5. ``--rl-steps`` RL steps of ``configs/demo.toml`` (reduced with ``--set``
   defaults below so a bf16 step on a host without fast bf16 stays short),
   per dtype: ``time/step_s`` and its rollout and training phases (from
   ``--init-from``, an SFT checkpoint, so that the steps train: the base model
   never answers, every group scores alike and nothing trains).

Prints every bf16/fp32 ratio, and which case it measured: on a host where
``auto`` picks float32 the bf16 targets printed beside the ratios (training >= 3x,
RL step >= 2x) do not apply (the ratios show what bf16 would cost there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_backend import _device, _observation, _prompts  # the same workload and device

MODEL = "smollm2-135m-instruct"
REPEATS = 4  # timed training calls per figure (median): 2 read 160 and 220 tok/s on one host
RL_SETTINGS = [
    "train.questions_per_batch=2",
    "rollout.max_assistant_tokens=64",
    "rollout.max_assistant_turns=2",
    "train.save_every=0",
]


def _ratio(new: float, old: float) -> str:
    return f"{new / old:.2f}x" if old > 0 else "n/a"


def auto_choice() -> object:
    from retool.backends.local.dtype import (
        ModelShapes,
        Workload,
        resolve_numerics,
        time_model_decode,
    )
    from retool.backends.local.models import load_model
    from retool.backends.local.threads import run_in_worker
    from retool.config import load_config

    config = load_config("configs/demo.toml")
    device = _device()  # LocalServiceClient's "auto"
    model = run_in_worker(lambda: load_model(MODEL).eval().to(device))
    shapes = ModelShapes.from_config(model.config)
    started = time.perf_counter()
    numerics = run_in_worker(  # as LocalServiceClient measures it at start
        lambda: resolve_numerics(
            "auto",
            shapes,
            Workload.from_config(config),
            device=device,
            sampler_timer=time_model_decode(model, device),
        )
    )
    return numerics, time.perf_counter() - started


def sample(sampler, tokenizer, new_tokens: int) -> tuple[int, float, list[tuple]]:
    """The rollout-shaped workload; (tokens, seconds, [(prompt, tokens, logprobs)])."""
    from retool.types import ModelInput, SamplingParams

    params = SamplingParams(max_tokens=new_tokens, seed=0)
    prompts = _prompts(tokenizer)
    started = time.perf_counter()
    first = [sampler.sample(ModelInput.from_ints(p), 4, params) for p in prompts]
    firsts = [(prompts[i], s) for i, f in enumerate(first) for s in f.result().sequences]
    follows = []
    for i, (prompt, seq) in enumerate(firsts):
        follow = prompt + list(seq.tokens) + _observation(tokenizer, i)
        params_i = SamplingParams(max_tokens=new_tokens, seed=1 + i)
        follows.append((follow, sampler.sample(ModelInput.from_ints(follow), 1, params_i)))
    seconds = time.perf_counter() - started
    done = [(p, s) for p, s in firsts]
    done += [(p, f.result().sequences[0]) for p, f in follows]
    seconds = time.perf_counter() - started
    tokens = sum(len(s.tokens) for _, s in done)
    return tokens, seconds, [(p, list(s.tokens), list(s.logprobs)) for p, s in done]


def sampled_datums(sequences: list[tuple]) -> list:
    from retool.types import Datum, ModelInput, TensorData

    out = []
    for prompt, tokens, logprobs in sequences:
        if not tokens:
            continue
        full = prompt + tokens
        n = len(full) - 1
        old = [0.0] * (len(prompt) - 1) + logprobs
        adv = [0.0] * (len(prompt) - 1) + [1.0] * len(tokens)
        out.append(
            Datum(
                ModelInput.from_ints(full[:-1]),
                {
                    "target_tokens": TensorData.from_list(full[1:], "int64"),
                    "logprobs": TensorData.from_list(old[:n]),
                    "advantages": TensorData.from_list(adv[:n]),
                },
            )
        )
    return out


def sampler_kl(trainer, datums: list) -> float:
    """Mean over sampled tokens of log pi_sampler - log pi_trainer (the loss's own metric)."""
    total, tokens = 0.0, 0
    for start in range(0, len(datums), 8):
        out = trainer.forward(datums[start : start + 8], "ppo").result()
        total += out.metrics["sampler_kl"] * out.metrics["loss_tokens"]
        tokens += int(out.metrics["loss_tokens"])
    return total / max(tokens, 1)


def train_rate(trainer, rows: int, tokens: int, shared: int = 0) -> float:
    """``forward_backward`` tok/s on ``rows`` random datums of ``tokens`` tokens whose first
    ``shared`` tokens agree (an RL group's prompt: the trainer's shared-prefix path)."""
    import numpy as np

    from retool.types import Datum, ModelInput, TensorData

    rng = np.random.default_rng(0)
    prefix = rng.integers(100, 40000, shared).tolist()
    data = []
    for _ in range(rows):
        ids = prefix + rng.integers(100, 40000, tokens + 1 - shared).tolist()
        data.append(
            Datum(
                ModelInput.from_ints(ids[:-1]),
                {
                    "target_tokens": TensorData.from_list(ids[1:], "int64"),
                    "logprobs": TensorData.from_list([-8.0] * tokens),
                    "advantages": TensorData.from_list([0.1] * tokens),
                },
            )
        )
    trainer.forward_backward(data, "ppo").result()  # warm-up
    seconds = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        trainer.forward_backward(data, "ppo").result()
        seconds.append(time.perf_counter() - started)
    trainer._optimizer = None
    for p in trainer._params:
        p.grad = None
    return rows * tokens / statistics.median(seconds)


def rl_steps(dtype: str, steps: int, init_from: str | None, full: bool) -> dict[str, float]:
    """Mean per-step figures of ``steps`` RL steps of the demo config in ``dtype``.

    From the base model every group scores alike (it never answers), so nothing
    trains and a step is its rollout; ``init_from`` (an SFT checkpoint, e.g. a
    demo's ``sft`` run directory) gives steps that train. ``full`` runs the
    demo's own step (4 questions x 4 samples, its token budgets) instead of the
    reduced one.
    """
    from retool.config import load_config
    from retool.training.loop import train

    reduced = ["train.save_every=0"] if full else RL_SETTINGS
    settings = [*reduced, f"train.steps={steps}", f"model.dtype={dtype}"]
    config = load_config("configs/demo.toml", settings)
    with tempfile.TemporaryDirectory(prefix="bench-numerics-") as scratch:
        run = train(config, run_dir=str(Path(scratch) / "run"), init_from=init_from, progress=False)
        metrics = run.metrics()
    keys = ("time/step_s", "time/rollout_s", "time/training_s")
    out = {k: statistics.mean(m[k] for m in metrics if k in m) for k in keys}
    kls = [m["train/sampler_kl"] for m in metrics if "train/sampler_kl" in m]
    out["train/sampler_kl"] = statistics.mean(kls) if kls else math.nan  # nothing trained
    out["trained_steps"] = float(len(kls))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--train-rows", type=int, default=4)
    parser.add_argument("--train-tokens", type=int, default=256)
    parser.add_argument(
        "--train-shared", type=int, default=180, help="tokens the second training batch shares"
    )
    parser.add_argument("--rl-steps", type=int, default=1)
    parser.add_argument("--skip-rl", action="store_true")
    parser.add_argument(
        "--init-from",
        default=None,
        help="RL steps from this checkpoint (e.g. a demo's sft run directory), so they train",
    )
    parser.add_argument(
        "--full-step", action="store_true", help="the demo's own RL step, not the reduced one"
    )
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    import torch

    from retool.backends.local import LocalServiceClient

    load = os.getloadavg()
    numerics, auto_s = auto_choice()
    gpu = f"; GPU {numerics.host['gpu']}" if "gpu" in numerics.host else ""
    print(f"host       {numerics.host['cpu']}; flags {numerics.host['flags']}{gpu}", flush=True)
    print(
        f"           torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at start",
        flush=True,
    )
    print(f"auto       {numerics.summary()}  [measured in {auto_s:.2f}s]", flush=True)
    picks_bf16 = not numerics.all_float32
    figures: dict[str, dict[str, float]] = {}
    trainers = {}
    samples = {}
    shared = min(args.train_shared, args.train_tokens - 1)
    # bf16 twice: eager (model.compile = off) and as a run gets it (auto: compiled where a
    # compiler is found); the sampler does not compile, so it is timed once per dtype.
    variants = (("float32", "auto"), ("bfloat16", "off"), ("bfloat16", "auto"))
    with tempfile.TemporaryDirectory(prefix="bench-numerics-") as scratch:
        for dtype, compile_request in variants:
            key = dtype if compile_request == "auto" else f"{dtype}-eager"
            service = LocalServiceClient(
                dtype=dtype, compile=compile_request, checkpoint_root=Path(scratch) / key
            )
            started = time.perf_counter()
            trainer = service.create_lora_training_client(MODEL, rank=16, seed=0)
            created = time.perf_counter() - started
            figures[key] = {"trainer_start_s": created}
            line = f"{key:<14} trainer {trainer.compile.summary()}, started in {created:.1f}s"
            if compile_request == "auto":
                sampler = trainer.save_weights_and_get_sampling_client()
                tokens, seconds, sequences = sample(
                    sampler, trainer.get_tokenizer(), args.new_tokens
                )
                sampler.close()
                figures[key]["sample_tok_s"] = tokens / seconds
                samples[key] = sampled_datums(sequences)
                line += (
                    f"; sampler {tokens} tokens in {seconds:.1f}s = {tokens / seconds:.1f} tok/s"
                )
            rate = train_rate(trainer, args.train_rows, args.train_tokens)
            rate_shared = train_rate(trainer, args.train_rows, args.train_tokens, shared)
            figures[key].update({"train_tok_s": rate, "train_shared_tok_s": rate_shared})
            line += (
                f"; training fwd+bwd {rate:.1f} tok/s, {rate_shared:.1f} with a "
                f"{shared}-token shared prefix"
            )
            print(line, flush=True)
            if compile_request == "auto":
                trainers[key] = trainer
        kls = {
            "fp32 sampler / fp32 trainer": sampler_kl(trainers["float32"], samples["float32"]),
            "bf16 sampler / bf16 trainer": sampler_kl(trainers["bfloat16"], samples["bfloat16"]),
            "bf16 sampler / fp32 trainer": sampler_kl(trainers["float32"], samples["bfloat16"]),
        }
        trainers.clear()
    for name, value in kls.items():
        print(f"sampler_kl {name}: {value:+.2e}", flush=True)
    if not args.skip_rl:
        for dtype in ("float32", "bfloat16"):
            figures[dtype].update(rl_steps(dtype, args.rl_steps, args.init_from, args.full_step))
            f = figures[dtype]
            print(
                f"{dtype:<10} RL step {f['time/step_s']:.1f}s (rollout {f['time/rollout_s']:.1f}s, "
                f"training {f['time/training_s']:.1f}s; {f['trained_steps']:.0f} of "
                f"{args.rl_steps} steps trained), train/sampler_kl {f['train/sampler_kl']:+.2e}",
                flush=True,
            )
    fp32, bf16, eager = figures["float32"], figures["bfloat16"], figures["bfloat16-eager"]
    ratios = [
        f"sampler {_ratio(bf16['sample_tok_s'], fp32['sample_tok_s'])}",
        f"training fwd+bwd {_ratio(bf16['train_tok_s'], fp32['train_tok_s'])} "
        f"(shared prefix {_ratio(bf16['train_shared_tok_s'], fp32['train_shared_tok_s'])}; "
        "target >= 3x)",
        f"bf16 eager training {_ratio(eager['train_tok_s'], fp32['train_tok_s'])} "
        f"(shared prefix {_ratio(eager['train_shared_tok_s'], fp32['train_shared_tok_s'])})",
    ]
    if not args.skip_rl:
        ratios.append(f"RL step {_ratio(fp32['time/step_s'], bf16['time/step_s'])} (target >= 2x)")
    print("RATIOS     bf16 speed / fp32 speed: " + "; ".join(ratios), flush=True)
    case = (
        "auto picks bf16 here: the targets apply"
        if picks_bf16
        else "auto picks float32 here: the 2x/3x targets do not apply; a run with auto "
        "runs float32, as before"
    )
    print(f"CASE       {case}", flush=True)
    end = os.getloadavg()
    print(f"           load average {end[0]:.1f} {end[1]:.1f} {end[2]:.1f} at the end", flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"numerics": numerics.to_dict(), "figures": figures, "kl": kls}, indent=2)
        )


if __name__ == "__main__":
    main()
