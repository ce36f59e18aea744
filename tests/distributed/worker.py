"""A torchrun worker for the parity tests: one trainer step, rank 0 saves what it saw.

``python -m torch.distributed.run --nproc-per-node N tests/distributed/worker.py
OUT KINDS ROOT`` (or plain ``python`` for one process): for each trainer kind of
the comma-separated KINDS (``lora``, ``full``), one after the other in the same
processes, builds it on ``tiny-random``, runs one ``forward_backward`` on
:data:`DATA` and one ``optim_step``, and writes to ``OUT/KIND.pt`` (a
``torch.save`` file) the trainable weights, the call's logprobs and metrics, and
the step's gradient norm. Ranks other than 0 only serve. Both kinds in one launch:
each launch costs two ranks' imports (about 7 s each on a 2-core host).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from retool.backends.local import LocalServiceClient
from retool.backends.local.checkpoints import read_trainable
from retool.backends.local.distributed import run_command
from retool.backends.local.service import serve_calls
from retool.types import AdamParams, Datum, ModelInput, TensorData


def policy_datum(tokens: list[int], advantage: float, old: float) -> Datum:
    n = len(tokens) - 1
    inputs = {
        "target_tokens": TensorData.from_list(tokens[1:], "int64"),
        "logprobs": TensorData.from_list([old] * n),
        "advantages": TensorData.from_list([advantage] * n),
    }
    return Datum(ModelInput.from_ints(tokens[:-1]), inputs)


# Uneven lengths (the split balances tokens), a shared first stretch on two of them
# (the shared-prefix path), advantages of both signs, old logprobs that clip.
DATA = [
    policy_datum(list(range(10, 40)), 1.0, -2.0),
    policy_datum(list(range(10, 30)) + list(range(200, 212)), -0.5, -9.0),
    policy_datum(list(range(70, 91)), 0.25, -11.0),
    policy_datum(list(range(300, 306)), 0.75, -10.0),
    policy_datum(list(range(400, 447)), -1.0, -10.5),
]
ADAM = AdamParams(learning_rate=5e-3, grad_clip_norm=1.0)


def step(out: Path, kind: str, service: LocalServiceClient) -> None:
    if kind == "lora":
        trainer = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    else:
        trainer = service.create_training_client("tiny-random", seed=0)
    result = trainer.forward_backward(DATA, "ppo").result()
    norm = trainer.optim_step(ADAM).result().metrics["grad_norm"]
    again = trainer.forward(DATA, "ppo").result()
    # One datum for two ranks: rank 1 takes part with nothing of its own.
    single = trainer.forward_backward(DATA[3:4], "ppo").result()
    path = trainer.save_state(f"one-{kind}").result().path
    torch.save(
        {
            "weights": read_trainable(Path(path)),
            "logprobs": [o["logprobs"].to_numpy() for o in result.loss_fn_outputs],
            "after": [o["logprobs"].to_numpy() for o in again.loss_fn_outputs],
            "metrics": result.metrics,
            "single": single.loss_fn_outputs[0]["logprobs"].to_numpy(),
            "single_metrics": single.metrics,
            "grad_norm": norm,
            "state": path,
        },
        out / f"{kind}.pt",
    )


def steps(out: str, kinds: str, checkpoint_root: str) -> int:
    service = LocalServiceClient(dtype="float32", checkpoint_root=checkpoint_root)
    Path(out).mkdir(parents=True, exist_ok=True)
    for kind in kinds.split(","):
        step(Path(out), kind, service)
    return 0


if __name__ == "__main__":
    out, kinds, root = sys.argv[1:4]
    sys.exit(run_command(lambda: steps(out, kinds, root), lambda: serve_calls() or 0))
