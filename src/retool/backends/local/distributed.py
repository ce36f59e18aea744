"""The trainer's process group under ``torchrun``: one driver, the other ranks serve.

Launched by PyTorch's own launcher (``python -m torch.distributed.run
--nproc-per-node N -m retool train ...``), every process reads its place from
torchrun's environment (:func:`world`: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``). Without torchrun, or with ``WORLD_SIZE=1``, there is no group
and nothing here runs: the local backend behaves exactly as in one process
(``torch.distributed`` is imported only inside the functions that need it).

**One driver.** Rank 0 runs the command as in one process (the loop, rollouts,
sandbox, run directory, logs); its training client broadcasts each contract
call to the other ranks (:func:`send`), which wait in :func:`serve_calls` and
execute it on their shard of the model (``distributed_trainer.py``). The loop
never learns about ranks: the contract in ``retool.types`` is its only view.

**Two groups.** Collectives of the computation (FSDP2's all-gathers and
reduce-scatters, gathers of weights) run on the default group: gloo on CPU,
NCCL on CUDA (``"cpu:gloo,cuda:nccl"`` on a GPU host, so CPU objects still go
through gloo), with a short timeout (:data:`COLLECTIVE_TIMEOUT_S`, env
``RETOOL_COLLECTIVE_TIMEOUT_S``): a rank that dies mid-call stops the others
within it instead of hanging. The calls themselves travel on a second, gloo
group whose timeout is long: between two calls the driver may roll out for
many minutes while the others wait. (Within one node torchrun itself stops
every rank as soon as one exits.)

**The mesh** is made explicitly per device type (:func:`mesh`):
``init_device_mesh`` guessing the device on a GPU host moves a CPU model to
CUDA (pytorch#132471).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retool.errors import BackendError, ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

COLLECTIVE_TIMEOUT_S = 60.0  # default: a dead rank stops the others within a minute
LOST_GRACE_S = 3.0  # how long a failed collective waits to see which local rank died
CALL_WAIT_S = 7 * 24 * 3600.0  # a serving rank waits this long for the driver's next call
_group: dict[str, Any] = {}  # "control": the calls' gloo group; "meshes": by device type
_places: list[tuple[str, int]] = []  # (host, pid) by rank, swapped when the group forms


@dataclass(frozen=True)
class World:
    """This process's place in a torchrun job (rank 0 of 1 without torchrun)."""

    rank: int
    size: int
    local_rank: int

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def driver(self) -> bool:
        """Whether this process runs the command (the others serve its trainer's calls)."""
        return self.rank == 0


def world() -> World:
    """torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (unset: one process)."""
    values = {}
    for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)):
        text = os.environ.get(name, "").strip()
        try:
            values[name] = int(text) if text else default
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not an integer (set by torchrun)") from None
    size, rank, local = values["WORLD_SIZE"], values["RANK"], values["LOCAL_RANK"]
    if size < 1 or not 0 <= rank < size or local < 0:
        raise ConfigError(f"RANK={rank}, WORLD_SIZE={size}: not a place in a torchrun job")
    return World(rank, size, local)


def collective_timeout() -> float:
    text = os.environ.get("RETOOL_COLLECTIVE_TIMEOUT_S", "").strip()
    try:
        value = float(text) if text else COLLECTIVE_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"RETOOL_COLLECTIVE_TIMEOUT_S={text!r}: give seconds > 0")
    return value


def init_group() -> World:
    """Join the job's process group (once; every rank must call it): see the module
    docstring for the backends and timeouts."""
    me = world()
    if not me.distributed or "control" in _group:
        return me
    import torch
    import torch.distributed as dist

    backend = "gloo"
    # A GPU per rank: NCCL for CUDA tensors (gloo still for CPU ones). A host with fewer
    # GPUs than ranks (a CPU run on a GPU box) stays on gloo: set_device would fail.
    if torch.cuda.is_available() and me.local_rank < torch.cuda.device_count():
        torch.cuda.set_device(me.local_rank)
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=collective_timeout()))
    _group["control"] = dist.new_group(backend="gloo", timeout=timedelta(seconds=CALL_WAIT_S))
    _group["meshes"] = {}
    places: list[Any] = [None] * me.size  # (host, pid) by rank: who died, when one does
    dist.all_gather_object(places, (socket.gethostname(), os.getpid()), group=_group["control"])
    _places[:] = places  # kept past close_group: a signal may come after it
    return me


def close_group() -> None:
    """Leave the process group (the end of the command on every rank)."""
    if "control" not in _group:
        return
    import torch.distributed as dist

    _group.clear()
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # after a lost rank: nothing left to close cleanly
            dist.destroy_process_group()


def mesh(device_type: str) -> DeviceMesh:
    """The 1-D mesh of every rank on ``device_type``, named explicitly (pytorch#132471)."""
    from torch.distributed.device_mesh import init_device_mesh

    meshes: dict[str, DeviceMesh] = _group["meshes"]
    if device_type not in meshes:
        meshes[device_type] = init_device_mesh(device_type, (world().size,))
    return meshes[device_type]


def send(call: tuple[Any, ...]) -> None:
    """Rank 0: broadcast one call (a picklable tuple) to every serving rank."""
    import torch.distributed as dist

    dist.broadcast_object_list([call], src=0, group=_group["control"])


def receive() -> tuple[Any, ...]:
    """A serving rank: the driver's next call (waits up to :data:`CALL_WAIT_S`)."""
    import torch.distributed as dist

    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0, group=_group["control"])
    return tuple(box[0])


def gather_to_driver(value: Any) -> list[Any] | None:
    """Every rank's ``value``, in rank order, on rank 0 (None on the others)."""
    import torch.distributed as dist

    me = world()
    out: list[Any] | None = [None] * me.size if me.driver else None
    dist.gather_object(value, out, dst=0, group=_group["control"])
    return out


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (small objects: shapes, names, counters)."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, group=_group["control"])
    return box[0]


def split_by_tokens(lengths: Sequence[int], ranks: int) -> list[list[int]]:
    """Datum indices per rank, balanced by tokens, each rank's in the call's order.

    Longest first, each to the rank with the fewest tokens so far (the lowest
    rank on a tie): a deterministic function of the lengths, so every rank
    computes the same split from the same call.
    """
    load = [0] * ranks
    parts: list[list[int]] = [[] for _ in range(ranks)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        parts[rank].append(index)
        load[rank] += lengths[index]
    return [sorted(part) for part in parts]


TOKENS = "loss_tokens"


def merge_metrics(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """One call's loss metrics from its ranks' parts, as one process computes them.

    Totals (``:sum``, ``_tokens``) add; ``_max`` is the maximum over the ranks
    that had loss tokens (a rank without reports its neutral 1.0); every other
    metric is a rate per loss token, so it is weighted by the rank's
    ``loss_tokens`` (0 when no rank had any, as one process reports).
    """
    tokens = [float(p.get(TOKENS, 0.0)) for p in parts]
    merged: dict[str, float] = {}
    for name in sorted({k for p in parts for k in p}):
        present = [(float(p[name]), t) for p, t in zip(parts, tokens, strict=True) if name in p]
        values = [v for v, _ in present]
        if name.endswith(":sum") or name.endswith("_tokens"):
            merged[name] = sum(values)
        elif name.endswith("_max"):
            counted = [v for v, t in present if t > 0]
            merged[name] = max(counted or values)
        else:
            total = sum(t for _, t in present)
            merged[name] = sum(v * t for v, t in present) / total if total else 0.0
    return merged


class RankLost(BackendError):
    """A rank of the job stopped (killed, out of memory): the job stops with this one line."""


def _alive(pid: int) -> bool:
    try:  # a killed child not yet reaped by torchrun is a zombie: dead too
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X")


def lost_ranks() -> list[int]:
    """The ranks on this host whose process is gone (a rank elsewhere cannot be seen)."""
    host, me = socket.gethostname(), world().rank
    return [
        rank
        for rank, (where, pid) in enumerate(_places)
        if rank != me and where == host and not _alive(pid)
    ]


def rank_lost() -> RankLost | None:
    """The one line for a local rank that is gone (after a signal: torchrun stopping the
    job because a rank died), or None."""
    return _lost(None)


def _lost(error: BaseException | None) -> RankLost | None:
    """The one line for a job that lost a rank, or None if every rank here still runs.

    After a failed collective the dead peer is waited for a moment
    (:data:`LOST_GRACE_S`): a killed process closes its sockets while the kernel
    tears it down, before ``/proc`` shows it dead, so the survivor's collective can
    fail first; the line should still name the rank.
    """
    lost = lost_ranks()
    failed = error is not None and _collective_failure(error)
    deadline = time.monotonic() + LOST_GRACE_S
    while failed and not lost and time.monotonic() < deadline:
        time.sleep(0.05)
        lost = lost_ranks()
    if not lost and not failed:
        return None
    who = ", ".join(f"rank {r} (pid {_places[r][1]})" for r in lost)
    what = f"{who} stopped" if lost else f"a collective failed ({type(error).__name__})"
    return RankLost(
        f"{what}: the job stopped; every committed step is kept: run the same torchrun "
        "command with --resume to continue"
    )


def _collective_failure(error: BaseException) -> bool:
    import torch.distributed as dist

    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and "gloo" in str(error).lower()
    )


def run_command(command: Callable[[], int], serve: Callable[[], int]) -> int:
    """Under torchrun: join the group; rank 0 runs ``command`` and then releases the
    others, which ``serve`` until then. Returns the rank's exit status.

    A rank that dies makes the others' next collective fail at once (gloo: the
    connection closes; NCCL: within the collective timeout), and torchrun stops
    every rank of the node as soon as one exits (its SIGTERM is an interrupt
    here). Either way the survivors raise :class:`RankLost`, one line naming
    the dead rank, instead of the collective's traceback; the run directory
    holds what was committed, as after any interrupted step. (The CLI prints
    one line per rank whichever comes first: a command that already said the
    lost rank's line, then returned, is raised here again, and not said twice.)

    Stop signals are the caller's: the CLI's serving ranks keep serving after
    one until rank 0, which stops as one process does (its commit window and
    emergency checkpoint need them), sends ``exit``.
    """
    me = init_group()
    if not me.distributed:
        return command()
    try:
        try:
            status = serve() if not me.driver else command()
        except Exception as exc:
            lost = _lost(exc)
            if lost is None and me.driver:  # an error of its own: release the others
                with contextlib.suppress(Exception):
                    send(("exit",))
            raise (lost or exc) from None
        # torchrun stops the survivors with SIGTERM when a rank died. Ctrl-C (SIGINT) is
        # the user's wish: any rank gone by now has left by it, nothing to name.
        lost = _lost(None) if status not in (0, 128 + signal.SIGINT) else None
        if lost is not None:
            raise lost
        if me.driver:
            try:
                send(("exit",))
            except Exception as exc:
                if status == 0:  # an interrupted driver's peers may have left already
                    raise (_lost(exc) or exc) from None
        return status
    finally:
        close_group()
