"""Batch bench: the engine's slot cache and shared prefix against copying the batch per join.

    flock /tmp/retool-bench.lock .venv/bin/python bench/batch_cache.py \
        [--questions 16] [--samples 4] [--max-tokens 128] [--in-flight 64] [--repeats 2]
        [--dtype float32|bfloat16]

An evaluation-shaped workload on smollm2-135m-instruct (or ``--model``, sampler
weights such as a demo's SFT checkpoint) through the real ``SamplingEngine``:
``--questions`` questions of ``demo:test`` (the demo's prompt) x ``--samples``
trajectories at temperature 0.7, at most ``--in-flight`` in flight, turns of
``--max-tokens`` with the markdown protocol's stops; a turn that stopped on a
tool call is continued (its completion and a 40-token observation) the
moment it finishes, up to ``--turns`` turns: rows join and leave the batch all
the time, as in ``retool eval`` and a rollout (without the sandbox).

The first question arrives alone and the others once the engine decodes it,
as in ``retool eval`` and a rollout, whose first request reaches the engine
thread before the next ones are submitted (``--together``: all at once).

Three variants, alternated within each repeat, the same requests and seeds:

* ``copy`` (the engine before 2026-12-02, the baseline): every batch of
  joining rows copies the whole batch into new buffers (live rows compacted,
  then the new rows), which is what ``rebuild_batch`` did; no shared prefix;
* ``before`` (the engine of 2026-12-04, commit 32470b2): a joining row takes a
  free slot, a finished row frees one; compaction and a window that reaches
  the buffers' right end copy the batch into new buffers; a shared prefix only
  when the batch's first join has two prompts or more;
* ``ours`` (the engine as it is): slots, compaction and window moves inside
  the buffers, and the prefix every prompt shares held once and read once per
  step by the lean decode step, also when the batch began with one prompt.

Prints per variant: wall seconds, decode steps, tokens/s, batch copies, and
the ratio. The model runs in the engine's thread as in the backend (loading in
a worker thread, so the caller holds no OpenMP pool; see ``threads.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_backend import _observation  # the same 40-token observation
from retool.backends.local.engine import SamplingEngine
from retool.backends.local.kv import BatchCache
from retool.backends.local.threads import run_in_worker

MODEL = "smollm2-135m-instruct"


class ReallocatingBatch(BatchCache):
    """The batch cache of 32470b2: compaction and a full window copy into new buffers."""

    def compact(self) -> list[int]:
        live = self.live()
        self._reallocate(max(len(live), 1), self._live_width(), live)
        return live

    def _move_window(self, width: int) -> None:
        self._reallocate(self.slots, width)


class BeforeEngine(SamplingEngine):
    """The engine of 32470b2: new buffers for every copy; a prefix only from the first join."""

    batch_cache_class = ReallocatingBatch

    def _shared_prefix(self, groups, running=()):
        return None if running else super()._shared_prefix(groups)


class CopyingEngine(SamplingEngine):
    """The engine with the old bookkeeping: a copy of the whole batch on every join."""

    batch_cache_class = ReallocatingBatch

    def _shared_prefix(self, groups, running=()):
        return None

    def _join(self, joining=()) -> None:
        batch = self._batch
        if batch is not None and joining:
            live = batch.live()
            rows = sum(len(r) for r, _ in joining)
            widest = max(kv[0][0].shape[2] for _, kv in joining)
            batch._reallocate(len(live) + rows, max(widest, batch._live_width()), live)
            self._rows = [self._rows[i] for i in live]
            self._positions = [self._positions[i] for i in live]
        super()._join(joining)


def prompts(tokenizer, count: int) -> list[list[int]]:
    from retool.data import load_dataset
    from retool.protocol import get_protocol

    dialect = get_protocol("markdown")
    problems = load_dataset("demo:test")[:count]
    return [
        dialect.render_prompt(tokenizer, dialect.initial_messages(p.question, tokenizer))
        for p in problems
    ]


def run(engine_class, model, tokenizer, args, seed: int) -> dict[str, float]:
    """The workload through a fresh engine of ``engine_class``; its figures."""
    from retool.protocol import get_protocol
    from retool.types import SamplerStop, SamplingParams

    stop = list(get_protocol("markdown").stop_sequences(tokenizer))
    engine = engine_class(model, tokenizer)
    pending = list(enumerate(prompts(tokenizer, args.questions)))
    lock, done = threading.Lock(), threading.Event()
    state = {"in_flight": 0, "trajectories": 0, "tokens": 0}

    def params(key: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=args.max_tokens, seed=seed + key, stop=stop, temperature=0.7
        )

    def submit_questions() -> None:
        """Start questions (``--samples`` trajectories each) while there is room."""
        with lock:
            while pending and state["in_flight"] + args.samples <= args.in_flight:
                index, prompt = pending.pop(0)
                state["in_flight"] += args.samples
                state["trajectories"] += args.samples
                future = engine.submit(prompt, args.samples, params(1000 * index))
                future.add_done_callback(
                    lambda f, i=index, p=prompt: turn_done(
                        f, [(i, k, p, 1) for k in range(args.samples)]
                    )
                )

    def turn_done(future, keys) -> None:
        """Continue every trajectory that stopped on a tool call, up to ``--turns`` turns."""
        for (index, k, prompt, turn), sequence in zip(keys, future.result().sequences, strict=True):
            with lock:
                state["tokens"] += len(sequence.tokens)
                if sequence.stop_reason is SamplerStop.STOP and turn < args.turns:
                    observation = _observation(tokenizer, 4 * index + k)
                    follow = prompt + list(sequence.tokens) + observation
                    key = 1000 * index + 10 * k + turn
                    next_keys = [(index, k, follow, turn + 1)]
                    engine.submit(follow, 1, params(key)).add_done_callback(
                        lambda f, n=next_keys: turn_done(f, n)
                    )
                    continue
                state["in_flight"] -= 1
                state["trajectories"] -= 1
                finished = state["trajectories"] == 0 and not pending
            if finished:
                done.set()
        submit_questions()

    started = time.perf_counter()
    if not args.together:  # the first question alone, the others once it decodes
        with lock:
            index, prompt = pending.pop(0)
            state["in_flight"] += args.samples
            state["trajectories"] += args.samples
        future = engine.submit(prompt, args.samples, params(1000 * index))
        future.add_done_callback(
            lambda f, i=index, p=prompt: turn_done(f, [(i, k, p, 1) for k in range(args.samples)])
        )
        while engine.steps == 0 and not future.done():
            time.sleep(0.001)
    submit_questions()
    if not done.wait(timeout=3600):
        raise RuntimeError("the workload did not finish within an hour")
    seconds = time.perf_counter() - started
    figures = {
        "seconds": seconds,
        "steps": engine.steps,
        "tokens": state["tokens"],
        "copies": engine.batch_copies,
        "joins": engine.joins,
        "prefix_rows": engine.prefix_rows,
    }
    engine.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--model",
        default=None,
        help="sampler weights to decode with (e.g. a demo's sft/checkpoints/sampler/step_000040; "
        "a policy that calls the tool stops its turns early, as in an evaluation); "
        "default: the base model",
    )
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument(
        "--together", action="store_true", help="submit the first questions at once"
    )
    parser.add_argument(
        "--variants", default="copy,before,ours", help="comma-separated, of copy, before, ours"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()

    import torch

    from retool.backends.local.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(MODEL)
    if args.model:
        from retool.backends.local import LocalServiceClient

        with tempfile.TemporaryDirectory(prefix="bench-batch-") as scratch:
            service = LocalServiceClient(dtype=args.dtype, checkpoint_root=scratch)
            client = service.create_sampling_client(model_path=args.model)
            model = client.engine.model
            client.close()
    else:
        dtype = getattr(torch, args.dtype)
        model = run_in_worker(lambda: load_model(MODEL, dtype=dtype).eval())
    load = os.getloadavg()
    print(
        f"host: {_cpu()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.dtype}, {args.model or MODEL}; load average {load[0]:.1f} at start",
        flush=True,
    )
    classes = {"copy": CopyingEngine, "before": BeforeEngine, "ours": SamplingEngine}
    names = [n.strip() for n in args.variants.split(",")]
    if any(n not in classes for n in names) or not names:
        parser.error(f"--variants: choose among {', '.join(classes)}, got {args.variants!r}")
    variants = [(n, classes[n]) for n in names]
    figures: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
    for repeat in range(args.repeats):
        for name, cls in variants:
            out = run(cls, model, tokenizer, args, seed=repeat * 10_000)
            figures[name].append(out)
            print(
                f"  {name:<5} repeat {repeat + 1}: {out['seconds']:.1f}s, {out['steps']} steps, "
                f"{out['tokens']} tokens = {out['tokens'] / out['seconds']:.1f} tok/s, "
                f"{out['copies']} batch copies for {out['joins']} rows joining, "
                f"{out['prefix_rows']} of them on the shared prefix",
                flush=True,
            )
    median = {name: statistics.median(f["seconds"] for f in figures[name]) for name in figures}
    base = names[0]
    end = os.getloadavg()
    ratios = " | ".join(
        f"{name} {median[name]:.1f}s ({median[base] / median[name]:.2f}x)" for name in names
    )
    print(
        f"BATCH CACHE  {ratios}, against {base}; medians of {args.repeats}; "
        f"load average {end[0]:.1f} at the end",
        flush=True,
    )


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
