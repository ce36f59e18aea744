"""Time one RL-sized update against a remote trainer with a fixed round-trip latency.

    .venv/bin/python bench/remote_pipeline.py [--latency-ms 200] [--micro-batches 8]
        [--datums 4] [--tokens 400] [--compute-ms 0] [--repeats 3]
        [--service fake|tinker|pytrio]

The same update (``--micro-batches`` calls of ``forward_backward``, each of
``--datums`` datums of ``--tokens`` tokens, then one ``optim_step``) is
submitted two ways, on two trainers of the same service:

* **serial**, the baseline kept here: each call's future is waited on before
  the next call is submitted (what ``Session`` did before the pipelining);
* **pipelined**: :meth:`retool.training.session.Session.update`, which submits
  every call before it awaits the first (:mod:`retool.training.pipelining`).

It prints each one's wall time (the best of ``--repeats``) and their ratio.

Services:

* ``fake`` (the default): an in-process trainer far away. A request reaches
  it ``latency / 2`` after it is submitted; it runs requests one at a time in
  arrival order, ``--compute-ms`` each; the reply takes ``latency / 2`` back.
  Serial costs ``(M + 1) * (latency + compute)``, pipelined ``latency +
  (M + 1) * compute``: with no compute time the ratio is ``M + 1``.
* ``tinker`` / ``pytrio``: the real SDK against the fake service of
  ``tests/backends/remote/`` (``fake_tinker.py``, ``fake_pytrio.py``), every
  HTTP exchange taking ``--latency-ms``. Both SDKs send one training
  client's requests one at a time, in order, so a pipelined update still
  pays one exchange per call to send it. Tinker answers a send with a
  request id and the result takes a second exchange (``retrieve_future``),
  which pipelining overlaps: serial ``2 (M + 1)`` exchanges, pipelined
  ``M + 2``, a ratio near 2. PyTRIO's dispatcher sends one event at a time
  and the fake answers each event with its result, so both ways cost
  ``M + 1`` exchanges (a ratio near 1). Against the real services, whose
  calls take compute time, pipelining also overlaps that compute with the
  sends that follow.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the fake services live in tests/backends/remote

from retool.training.datum import TrainingDatum  # noqa: E402
from retool.training.session import LoopState, Phases, Session  # noqa: E402
from retool.types import (  # noqa: E402
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    Future,
    ModelInput,
    OptimStepOutput,
    TensorData,
)

ADAM = AdamParams(learning_rate=1e-5)
LOSS_CONFIG = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}


class FarTrainer:
    """A trainer ``latency`` away: requests run one at a time, in arrival order."""

    def __init__(self, latency: float, compute: float) -> None:
        self.latency, self.compute = latency, compute
        self._queue: list[tuple[float, Callable[[], Any], concurrent.futures.Future]] = []
        self._ready = threading.Condition()
        threading.Thread(target=self._serve, name="far-trainer", daemon=True).start()

    def _send(self, work: Callable[[], Any]) -> Future[Any]:
        inner: concurrent.futures.Future = concurrent.futures.Future()
        with self._ready:
            self._queue.append((time.monotonic() + self.latency / 2, work, inner))
            self._ready.notify()
        return Future(inner)

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                arrival, work, inner = self._queue.pop(0)
            time.sleep(max(0.0, arrival - time.monotonic()) + self.compute)
            reply = threading.Timer(self.latency / 2, inner.set_result, (work(),))
            reply.daemon = True
            reply.start()

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        tokens = float(sum(d.model_input.length for d in data))
        metrics = {"loss:sum": -0.1 * tokens, "loss_tokens": tokens}
        return self._send(lambda: ForwardBackwardOutput((), metrics))

    def optim_step(self, adam_params):
        return self._send(lambda: OptimStepOutput({"grad_norm": 0.5}))


def rl_datum(index: int, tokens: int) -> TrainingDatum:
    """A shifted policy datum: the first half prompt (advantage 0), the rest completion."""
    ids = [2 + (index * 31 + i * 7) % 190 for i in range(tokens + 1)]
    prompt = tokens // 2
    advantages = [0.0] * prompt + [1.0 if index % 2 else -1.0] * (tokens - prompt)
    datum = Datum(
        ModelInput.from_ints(ids[:-1]),
        {
            "target_tokens": TensorData.from_list(ids[1:], "int64"),
            "logprobs": TensorData.from_list([0.0] * prompt + [-0.5] * (tokens - prompt)),
            "advantages": TensorData.from_list(advantages),
        },
    )
    return TrainingDatum(datum, tokens, tokens - prompt, trajectory_index=index)


def serial_update(trainer: Any, micro_batches: list[list[TrainingDatum]]) -> None:
    """The baseline: wait on each call before submitting the next."""
    for batch in micro_batches:
        trainer.forward_backward([d.datum for d in batch], "ppo", LOSS_CONFIG).result()
    trainer.optim_step(ADAM).result()


def pipelined_update(trainer: Any, micro_batches: list[list[TrainingDatum]]) -> None:
    """``Session.update`` on a session that holds only what it reads."""
    session = Session.__new__(Session)
    session.trainer, session.adam, session.state = trainer, ADAM, LoopState()
    session.update(1, micro_batches, "ppo", LOSS_CONFIG, Phases(), lambda: None)


@contextlib.contextmanager
def trainers(service: str, latency: float, compute: float, tokens: int) -> Iterator[list[Any]]:
    """Two trainers of ``service`` (one per way of submitting), closed at the end."""
    if service == "fake":
        yield [FarTrainer(latency, compute), FarTrainer(latency, compute)]
        return
    import pytest
    from tests.backends.remote.fakes import make_tokenizer_dir

    from retool.backends import service_client
    from retool.config import ModelConfig

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        root = Path(tmp)
        tokenizer = make_tokenizer_dir(root / "tokenizer")
        if service == "tinker":
            from tests.backends.remote.fake_tinker import use_fake_tinker

            fake = use_fake_tinker(patch, root / "home", tokenizer, delay=latency)
            fake.max_context_length = tokens + 1
            base = fake.base_model
        else:
            import pytrio
            from tests.backends.remote.fake_pytrio import use_fake_pytrio

            fake = use_fake_pytrio(patch, root / "home", tokenizer, delay=latency)
            fake.max_seq_len = tokens + 1
            base = "Qwen/Qwen3-4B"
            pytrio.configure_observability(enabled=False)
        config = ModelConfig(backend=service, base_model=base, lora_rank=8)
        client = service_client(config, root / "checkpoints")
        try:
            yield [client.create_lora_training_client(base, rank=8, seed=s) for s in (1, 2)]
        finally:
            client.close()


def best(run: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=200.0, help="one round trip")
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--datums", type=int, default=4, help="datums per micro-batch")
    parser.add_argument("--tokens", type=int, default=400, help="tokens per datum")
    parser.add_argument("--compute-ms", type=float, default=0.0, help="fake: per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--service", choices=("fake", "tinker", "pytrio"), default="fake")
    args = parser.parse_args()
    latency, compute = args.latency_ms / 1000, args.compute_ms / 1000
    micro_batches = [
        [rl_datum(m * args.datums + i, args.tokens) for i in range(args.datums)]
        for m in range(args.micro_batches)
    ]
    with trainers(args.service, latency, compute, args.tokens) as (one, two):
        serial = best(lambda: serial_update(one, micro_batches), args.repeats)
        piped = best(lambda: pipelined_update(two, micro_batches), args.repeats)
    datums = args.micro_batches * args.datums
    print(
        f"service {args.service}: latency {args.latency_ms:.0f} ms, compute {args.compute_ms:.0f}"
        f" ms, {args.micro_batches} micro-batches x {args.datums} datums x {args.tokens} tokens"
        f" ({datums} datums), best of {args.repeats}"
    )
    print(f"serial     {serial * 1000:8.1f} ms  (wait on each call, then optim_step)")
    print(f"pipelined  {piped * 1000:8.1f} ms  (Session.update: all submitted, then awaited)")
    print(f"ratio      {serial / piped:8.2f}x")


if __name__ == "__main__":
    main()
