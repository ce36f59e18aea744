"""Distributed bench: full fine-tuning at world size 1 and 2 on this host, one thread per rank.

    flock /tmp/bench.lock .venv/bin/python bench/distributed.py \
        [--models tiny-random smollm2-135m-instruct] [--sizes 1 2] [--tokens 256] [--steps 2]

For each model and world size, a full fine-tuning trainer (``model.lora_rank =
0``, float32) runs one warm-up step and ``--steps`` timed steps of
``forward_backward`` (the PPO loss on a fixed batch of datums, ``--tokens``
tokens in all) and ``optim_step``. World size 1 is one process, as without
torchrun; world size N is ``python -m torch.distributed.run --nproc-per-node
N`` with the trainer sharded by FSDP2 (``backends/local/distributed*.py``).
Every rank writes its own figures when it ends (a JSON file): peak RSS
(``resource.getrusage`` maxrss), the bytes of its parameters and optimizer
state as it holds them (a DTensor's local shard), and rank 0's full copy
for sampler snapshots, which sharding does not divide. The table gives the
step time (rank 0, median), each rank's figures and the ratio of a rank's
parameter+optimizer bytes to one process's: about 1/N is what FSDP2 buys.

No GPU here: on a GPU host the same command runs over NCCL, one GPU per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def tensor_bytes(tensor: Any) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


def holdings(trainer: Any) -> dict[str, int]:
    """Parameter, optimizer-state and full-copy bytes this rank holds."""
    params = sum(tensor_bytes(p) for p in trainer.model.parameters())
    optimizer = trainer._optimizer
    state = 0
    if optimizer is not None:
        for moments in optimizer.state.values():
            state += sum(tensor_bytes(v) for v in moments.values() if hasattr(v, "numel"))
    shadow = getattr(trainer, "shadow", None)
    copy = sum(tensor_bytes(p) for p in shadow.parameters()) if shadow is not None else 0
    return {"param_bytes": params, "optimizer_bytes": state, "full_copy_bytes": copy}


def write(out: Path, rank: int, figures: dict[str, Any]) -> None:
    figures["maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (out / f"rank{rank}.json").write_text(json.dumps(figures))


def child(out: Path, model: str, tokens: int, steps: int) -> int:
    """One rank (or the one process): rank 0 drives the steps, the others serve."""
    import torch

    from retool.backends.local import LocalServiceClient
    from retool.backends.local import distributed as dist_mod
    from retool.backends.local import service as service_mod
    from retool.types import AdamParams, Datum, ModelInput, TensorData

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="bench-dist-")

    def datum(start: int, length: int) -> Datum:
        ids = [(start + i) % 1000 + 10 for i in range(length + 1)]
        inputs = {
            "target_tokens": TensorData.from_list(ids[1:], "int64"),
            "logprobs": TensorData.from_list([-5.0] * length),
            "advantages": TensorData.from_list([0.5 if start % 2 else -0.5] * length),
        }
        return Datum(ModelInput.from_ints(ids[:-1]), inputs)

    lengths = [tokens // 4 + 16, tokens // 4 - 16, tokens // 4 + 8, tokens // 4 - 8]
    data = [datum(100 * i, n) for i, n in enumerate(lengths)]
    adam = AdamParams(learning_rate=1e-5, grad_clip_norm=1.0)

    def drive() -> int:
        service = LocalServiceClient(dtype="float32", checkpoint_root=root)
        trainer = service.create_training_client(model, seed=0)
        times = []
        for index in range(steps + 1):
            start = time.perf_counter()
            trainer.forward_backward(data, "ppo").result()
            trainer.optim_step(adam).result()
            if index:  # the first step builds the optimizer and warms the caches
                times.append(time.perf_counter() - start)
        write(out, 0, {"step_s": statistics.median(times), **holdings(trainer)})
        return 0

    def serve() -> int:  # service.serve_calls, keeping the trainer to measure it after
        trainers: dict[int, Any] = {}
        while True:
            call = dist_mod.receive()
            if call[0] == "exit":
                break
            if call[0] == "build":
                _, key, options, base, lora, seed = call
                service = service_mod.LocalServiceClient(**options)
                built = service.build_model(base, lora, seed)
                trainers[key] = service._trainer(built, base, lora, seed)
                continue
            _, key, method, args = call
            trainers[key].collective(method, *args)
        (trainer,) = trainers.values()
        write(out, dist_mod.world().rank, holdings(trainer))
        return 0

    return dist_mod.run_command(drive, serve)


def measure(model: str, size: int, tokens: int, steps: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as out:
        args = [str(Path(__file__).resolve()), "--child", out, model, str(tokens), str(steps)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
        if size == 1:
            command = [sys.executable, *args]
        else:
            launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            command = [*launch, "--nproc-per-node", str(size), *args]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"{model} at world size {size} failed:\n{done.stderr[-3000:]}")
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(size)]


def mib(n: float) -> str:
    return f"{n / 2**20:8.1f}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        out, model, tokens, steps = sys.argv[2:6]
        return child(Path(out), model, int(tokens), int(steps))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m-instruct"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    print(f"full fine-tuning, float32, {args.tokens} tokens a step, median of {args.steps} steps")
    header = "model                  N  rank  step s  param MiB  optim MiB  p+o ratio  copy MiB"
    print(header + "  maxRSS MiB")
    for model in args.models:
        alone = None
        for size in args.sizes:
            ranks = measure(model, size, args.tokens, args.steps)
            step = ranks[0]["step_s"]
            for rank, r in enumerate(ranks):
                held = r["param_bytes"] + r["optimizer_bytes"]
                alone = held if size == 1 and alone is None else alone
                ratio = f"{held / alone:9.3f}" if alone else "        -"
                print(
                    f"{model:22s} {size:2d}  {rank:4d}  {step:6.2f}  {mib(r['param_bytes'])}   "
                    f"{mib(r['optimizer_bytes'])}  {ratio}  {mib(r['full_copy_bytes'])}  "
                    f"{mib(r['maxrss_bytes'])}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
