"""``model.dtype = "auto"``: float32 or bfloat16 per role, chosen by measuring this host.

Whether bf16 pays depends on the CPU and on the batch shape, and nothing but a
measurement on the host tells (2026-12-01 on hosts of one machine kind, at
SmolLM2's shapes: AVX2 only, bf16 4-28x *slower*; AVX-512 BF16 without AMX,
about equal; AMX-BF16, 0.3-1.0x at 1-4 rows but 1.9-4.4x at 64 rows and
3.9-6.7x at 512). So at start the local backend measures both dtypes at
the rows each role will run: for the sampler, the loaded model's own
one-token forward at its decode batch (questions x group size, at most the
samples in flight), against a bf16 copy (a decode step is bound by reading
the weights, which only the real model shows: on this AVX2 host single cached
matrices at 16 rows looked 2x faster in bf16 while the model was slower); for
the trainer, the decoder's projections (hidden, intermediate and key/value
sizes from its config; not the output head, whose logits a bf16 trainer
computes in float32 too) with ``F.linear`` at the micro-batch's positions
(compute-bound, so one matrix per shape is representative).
``retool doctor``, which loads no weights, times projections for both roles.

On a GPU these timers read launch and synchronisation overhead as much as
arithmetic. Measured 2026-12-04 on an H200 (SmolLM2-135M, four runs): ``auto``
chose float32 for both roles in two runs, and float32 was the faster choice at
the demo's shapes: our bf16 sampler ran at 0.56-0.80x of float32's tok/s, a bf16
``forward_backward`` at 0.71-0.93x up to 8 x 512 tokens (1.72x only at
16 x 1024): a 135M model there is bound by kernel launches, to which bf16's
casts add. A timer of the real decoder's forward in a bf16 copy, tried for the
trainer, read bf16 1.45-2.50x faster while the real calls were slower, and the
sampler's one-token timer read 1.12-1.50x (around the margin) while the engine
was slower; so neither times what our bf16 paths cost on a GPU, and a larger
model there should set ``model.dtype`` itself (``bfloat16`` for a 4B model).
A role gets bf16 only when it is at least :data:`BF16_MARGIN` times faster,
so timing noise can never make a run slower than float32.

Bounded cost: output widths above :data:`MAX_OUT` and row counts above
:data:`MAX_ROWS` are timed at those sizes (throughput per output column and
per row has saturated there) and scaled, and the bf16 timing stops as soon
as its running total passes what float32 needed for all the shapes (it can no
longer win). On an AVX2 host the whole measurement takes well under a second.

A role whose step is under :data:`MIN_FLOP` (``tiny-random``'s decode) is not
measured and stays float32: microseconds of work are timing noise. A CPU
without bf16 instructions (no ``avx512_bf16``/``amx_bf16`` on x86, like this
AVX2 host) is not measured either and stays float32 for both roles: torch
converts to float32 around every product there, so bf16 can only lose, and
on a machine loaded by other jobs the one-token forward once read 1.22x
faster in bf16 (against 0.43-0.94x in calmer runs): a measurement there would
let noise choose.

Explicit ``float32`` / ``bfloat16`` win and are not measured; ``float16``
keeps its old meaning (the model held in float16 for both roles). What bf16
means per role: the sampler holds its weights in bf16 (logits and
log-softmax in float32); the trainer keeps float32 master weights and
optimizer state and runs the decoder under ``torch.autocast(bfloat16)``, with
the output head's logits and log-softmax in float32
(``losses.chunked_target_logprobs``). A LoRA trainer holds its *frozen* base
weights in bf16 (:func:`frozen_in_bfloat16`): they are never updated, so they
need no float32 master, and autocast would otherwise cast every one of them
(and the float32 residual stream around it) in every forward and recompute:
on an AMX host that copying was a fifth of a bf16 ``forward_backward``.
Sampling snapshots then merge into the same rounded base, so a bf16 sampler
and a bf16 trainer hold identical weights.

:func:`choose_dtype` and :func:`resolve_numerics` take injected timings, so the
choice is unit-tested without a clock.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # config sits a floor above the backends: annotations only
    import torch

    from retool.config import RunConfig

BF16_MARGIN = 1.2  # bf16 must be this many times faster to be chosen
MAX_OUT = 2048  # wider projections are timed at this width and scaled
MAX_ROWS = 512  # more rows are timed at this count and scaled
MIN_BATCH_S = 2e-3  # each timed batch of one shape lasts at least this long
MIN_FLOP = 2e9  # a role doing less per step (a tiny test model) stays float32, unmeasured
REQUESTS = ("auto", "float32", "bfloat16", "float16")
DTYPES = ("float32", "bfloat16", "float16")  # what a role computes in
ROLES = ("sampler", "trainer")
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2")


@dataclass(frozen=True)
class ModelShapes:
    """The matrix shapes one decoder forward multiplies by (per token)."""

    hidden: int
    intermediate: int
    kv: int  # key/value width: key-value heads x head dim
    vocab: int
    layers: int

    @classmethod
    def from_config(cls, config: Any) -> ModelShapes:  # an HF model config, or its JSON's keys
        hidden = int(config.hidden_size)
        heads = int(getattr(config, "num_attention_heads", 1) or 1)
        head_dim = int(getattr(config, "head_dim", 0) or hidden // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
        return cls(
            hidden=hidden,
            intermediate=int(config.intermediate_size),
            kv=kv_heads * head_dim,
            vocab=int(config.vocab_size),
            layers=int(config.num_hidden_layers),
        )

    def flops(self, rows: int) -> float:
        """Multiply-adds x 2 of one forward's projections at ``rows`` rows."""
        return 2.0 * rows * sum(i * o * calls for i, o, calls in self.projections())

    def projections(self) -> list[tuple[int, int, float]]:
        """``(in, out, calls per forward)``: q, k, v, o, gate, up, down per layer; the head."""
        h, i, kv, n = self.hidden, self.intermediate, self.kv, self.layers
        shapes = [(h, h, 2.0 * n), (h, kv, 2.0 * n), (h, i, 2.0 * n), (i, h, 1.0 * n)]
        return [*shapes, (h, self.vocab, 1.0)] if self.vocab else shapes

    def decoder_only(self) -> ModelShapes:
        """These shapes without the output head (``vocab = 0``): what a trainer's dtype changes.

        A bf16 trainer computes the head's logits in float32 all the same
        (``losses.chunked_target_logprobs``), so timing the head in bf16 would
        credit bf16 with a speed-up it never gets, and for ``tiny-random`` (a
        49,152-word head on a 64-wide model) it would make a test model's
        trainer look worth measuring.
        """
        return dataclasses.replace(self, vocab=0)


@dataclass(frozen=True)
class Workload:
    """The rows each role multiplies at once."""

    decode_rows: int = 32  # sequences decoded per step (questions x group size, capped)
    train_rows: int = 4096  # positions per forward_backward (micro-batch rows x tokens)

    @classmethod
    def from_config(cls, config: RunConfig) -> Workload:
        """From a :class:`~retool.config.RunConfig`."""
        rollout, train = config.rollout, config.train
        decode = min(train.questions_per_batch * rollout.group_size, rollout.max_in_flight_samples)
        return cls(decode_rows=max(1, decode), train_rows=max(1, train.micro_batch_tokens))


@dataclass(frozen=True)
class RoleTiming:
    """One role's measurement: seconds per forward of all projections, in each dtype."""

    role: str  # sampler | trainer
    rows: int  # rows the role runs
    float32_s: float
    bfloat16_s: float  # a lower bound when ``stopped_early``
    chosen: str
    stopped_early: bool = False  # bf16 passed float32's total before all shapes were timed

    @property
    def speedup(self) -> float:
        """float32 time / bf16 time (> 1: bf16 faster; an upper bound when stopped early)."""
        return self.float32_s / self.bfloat16_s if self.bfloat16_s > 0 else 0.0


@dataclass(frozen=True)
class Numerics:
    """What each role computes in, why, and on which host."""

    requested: str  # model.dtype as configured
    sampler: str  # float32 | bfloat16 | float16
    trainer: str
    timings: tuple[RoleTiming, ...] = ()  # empty when not measured (explicit dtype)
    host: Mapping[str, str] = field(default_factory=dict)  # cpu, flags, torch, device

    @property
    def all_float32(self) -> bool:
        return self.sampler == self.trainer == "float32"

    def summary(self) -> str:
        """One line: ``sampler float32, trainer float32 (auto: bf16 0.21x at 32 rows, ...)``."""
        text = f"sampler {self.sampler}, trainer {self.trainer}"
        if not self.timings:
            return f"{text} (model.dtype = {self.requested})"
        parts = []
        for t in self.timings:
            if t.float32_s == 0:
                parts.append(f"{t.role} not measured at {t.rows} rows")
                continue
            speed = f"{'<= ' if t.stopped_early else ''}{t.speedup:.2f}x"
            parts.append(f"{t.role} bf16 {speed} at {t.rows} rows")
        need = f"bf16 needs >= {BF16_MARGIN}x"
        if not any(t.float32_s for t in self.timings) and not has_bf16_instructions(
            self.host.get("flags", "")
        ):
            need = "no bf16 instructions on this CPU"
        return f"{text} (auto: {', '.join(parts)}; {need}; flags {self.host.get('flags', '?')})"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["host"] = dict(self.host)
        out["timings"] = [asdict(t) | {"speedup": t.speedup} for t in self.timings]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Numerics:
        """The numerics :meth:`to_dict` wrote (``numerics.json``).

        The file lives in a run directory a user can edit or damage, so every
        field is checked for what ``to_dict`` writes: a :class:`ValueError`
        names the first field that is not (``'sampler' is 'int8', expected one
        of ...``), never a ``KeyError`` from a later ``torch`` dtype lookup.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a JSON object, got {_kind(data)}")
        timings = data.get("timings", [])
        if not isinstance(timings, list | tuple):
            raise ValueError(f"'timings' must be a list, got {_kind(timings)}")
        host = data.get("host", {})
        if not isinstance(host, Mapping):
            raise ValueError(f"'host' must be an object, got {_kind(host)}")
        return cls(
            requested=_choice(data, "requested", REQUESTS),
            sampler=_choice(data, "sampler", DTYPES),
            trainer=_choice(data, "trainer", DTYPES),
            timings=tuple(_timing(t, f"timings[{i}]") for i, t in enumerate(timings)),
            host={str(k): str(v) for k, v in host.items()},
        )


def _kind(value: Any) -> str:
    """What a JSON value is, for a message: ``a list``, ``'int8'``, ``true``."""
    if isinstance(value, str):
        return repr(value[:40])
    names = {dict: "an object", list: "a list", bool: "a boolean", type(None): "null"}
    return names.get(type(value), f"{type(value).__name__} {value!r:.40}")


def _choice(data: Mapping[str, Any], key: str, allowed: tuple[str, ...], where: str = "") -> str:
    """``data[key]`` if it is one of ``allowed``, else a ValueError naming the field."""
    if key not in data:
        raise ValueError(f"no '{where}{key}' field")
    value = data[key]
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"'{where}{key}' is {_kind(value)}, expected one of {', '.join(allowed)}")
    return value


def _number(data: Mapping[str, Any], key: str, where: str, integer: bool = False) -> Any:
    """A finite, non-negative number (an integer with ``integer``) at ``data[key]``."""
    value = data.get(key)
    kinds = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        what = "an integer" if integer else "a number"
        raise ValueError(f"'{where}{key}' must be {what} >= 0, got {_kind(value)}")
    if value < 0:
        raise ValueError(f"'{where}{key}' must be >= 0, got {value}")
    return value


def _timing(data: Any, where: str) -> RoleTiming:
    if not isinstance(data, Mapping):
        raise ValueError(f"'{where}' must be an object, got {_kind(data)}")
    where += "."
    stopped = data.get("stopped_early", False)
    if not isinstance(stopped, bool):
        raise ValueError(f"'{where}stopped_early' must be true or false, got {_kind(stopped)}")
    return RoleTiming(
        role=_choice(data, "role", ROLES, where),
        rows=_number(data, "rows", where, integer=True),
        float32_s=float(_number(data, "float32_s", where)),
        bfloat16_s=float(_number(data, "bfloat16_s", where)),
        chosen=_choice(data, "chosen", DTYPES, where),
        stopped_early=stopped,
    )


def choose_dtype(float32_s: float, bfloat16_s: float, margin: float = BF16_MARGIN) -> str:
    """``bfloat16`` only when it is at least ``margin`` times faster, else ``float32``."""
    if bfloat16_s <= 0 or float32_s <= 0:
        return "float32"
    return "bfloat16" if float32_s / bfloat16_s >= margin else "float32"


def cpu_flags() -> str:
    """The bf16-relevant CPU flags this host has (``avx512_bf16 amx_bf16 ...``), or ``none``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return "unknown"
    found: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            found.update(line.split(":", 1)[1].split())
            break
    present = [f for f in BF16_FLAGS if f in found]
    return " ".join(present) or "none"


def has_bf16_instructions(flags: str) -> bool:
    """Whether the CPU computes in bf16 natively (x86 AVX-512 BF16 / AMX, or ARM's bf16)."""
    present = set(flags.split())
    if present & {"avx512_bf16", "amx_bf16"}:
        return True
    # Not x86 (ARM, ...): not checked here, so the measurement decides.
    return platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_info(device: str) -> dict[str, str]:
    import torch

    info = {
        "cpu": cpu_name(),
        "flags": cpu_flags(),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


Timer = Callable[[ModelShapes, int, str, float | None], tuple[float, bool]]


def time_projections(
    shapes: ModelShapes,
    rows: int,
    dtype: str,
    give_up_after: float | None = None,
    device: str = "cpu",
) -> tuple[float, bool]:
    """Seconds for one forward's projections at ``rows`` rows in ``dtype`` (best of 3).

    Returns ``(seconds, complete)``: it stops, with the running total as a lower
    bound and ``complete`` false, once that total passes ``give_up_after``.
    """
    import torch
    import torch.nn.functional as F

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    measured_rows = min(rows, MAX_ROWS)
    total = 0.0
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.no_grad():
        for fan_in, fan_out, calls in shapes.projections():
            width = min(fan_out, MAX_OUT)
            x = torch.randn(measured_rows, fan_in, dtype=torch_dtype, device=device)
            w = torch.randn(width, fan_in, dtype=torch_dtype, device=device)
            started = time.perf_counter()
            F.linear(x, w)  # warm-up: packing, kernel selection
            sync()
            # Small products take microseconds: repeat each to >= MIN_BATCH_S so that a
            # scheduler hiccup on a loaded machine cannot decide the choice.
            repeat = max(
                1, min(64, math.ceil(MIN_BATCH_S / max(time.perf_counter() - started, 1e-7)))
            )
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                for _ in range(repeat):
                    F.linear(x, w)
                sync()
                best = min(best, (time.perf_counter() - started) / repeat)
            total += best * calls * (fan_out / width) * (rows / measured_rows)
            if give_up_after is not None and total > give_up_after:
                return total, False
    return total, True


def time_model_decode(model: torch.nn.Module, device: str = "cpu") -> Timer:
    """A timer of the real model's one-token forward at ``rows`` rows (the sampler's step).

    A decode step reads every weight once per step for a few rows, so what it
    costs is mostly memory traffic, which a product of one small, cached weight
    matrix does not show: the sampler is timed on the model itself (and a bf16
    copy of it), the head included.
    """
    import copy

    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    copies: dict[str, Any] = {}

    def timer(
        shapes: ModelShapes, rows: int, dtype: str, give_up_after: float | None
    ) -> tuple[float, bool]:
        if dtype not in copies:
            copies.clear()  # one extra copy alive at a time
            copies[dtype] = model if dtype == "float32" else copy.deepcopy(model).to(torch.bfloat16)
        target = copies[dtype]
        ids = torch.randint(0, shapes.vocab, (rows, 1), device=device)  # one decode step
        best = float("inf")
        with torch.no_grad():
            for attempt in range(3):  # a warm-up, then best of 2
                started = time.perf_counter()
                target(input_ids=ids, use_cache=False)
                sync()
                seconds = time.perf_counter() - started
                if attempt:
                    best = min(best, seconds)
                if give_up_after is not None and seconds > 1.5 * give_up_after:
                    copies.clear()
                    return seconds, False
        if dtype != "float32":
            copies.clear()
        return best, True

    return timer


def resolve_numerics(
    requested: str,
    shapes: ModelShapes | None,
    workload: Workload,
    *,
    device: str = "cpu",
    timer: Timer | None = None,
    host: Mapping[str, str] | None = None,
    sampler_timer: Timer | None = None,
) -> Numerics:
    """The numerics for ``model.dtype = requested``; ``auto`` measures with ``timer``
    (``sampler_timer`` for the sampler's role when given: :func:`time_model_decode`)."""
    if requested not in REQUESTS:
        raise ValueError(f"dtype must be one of {', '.join(REQUESTS)}, got {requested!r}")
    info = dict(host) if host is not None else host_info(device)
    if requested != "auto":
        return Numerics(requested, requested, requested, (), info)
    if shapes is None:
        raise ValueError("dtype auto needs the model's shapes")
    if not device.startswith("cuda") and not has_bf16_instructions(info.get("flags", "")):
        # No bf16 arithmetic: torch converts to float32 around every product, so bf16 can
        # only lose (4-28x slower products here; the whole-model decode 0.4-0.9x, measured
        # 2026-12-01), and under a loaded machine timing noise once read 1.22x.
        timings = tuple(
            RoleTiming(role, rows, 0.0, 0.0, "float32", True)
            for role, rows in (("sampler", workload.decode_rows), ("trainer", workload.train_rows))
        )
        return Numerics("auto", "float32", "float32", timings, info)
    key = (shapes, workload, device, sampler_timer is not None)
    if timer is None and key in _MEASURED:  # one measurement per process and shape
        return _MEASURED[key]
    measure: Timer = timer or (
        lambda s, rows, dtype, limit: time_projections(s, rows, dtype, limit, device)
    )
    found: list[RoleTiming] = []
    for role, rows in (("sampler", workload.decode_rows), ("trainer", workload.train_rows)):
        role_shapes = shapes if role == "sampler" else shapes.decoder_only()
        if role_shapes.flops(rows) < MIN_FLOP:  # microseconds of work: noise would decide
            found.append(RoleTiming(role, rows, 0.0, 0.0, "float32", True))
            continue
        role_measure = sampler_timer if role == "sampler" and sampler_timer else measure
        fp32, _ = role_measure(role_shapes, rows, "float32", None)
        bf16, complete = role_measure(role_shapes, rows, "bfloat16", fp32)
        chosen = choose_dtype(fp32, bf16) if complete else "float32"
        found.append(RoleTiming(role, rows, fp32, bf16, chosen, not complete))
    numerics = Numerics("auto", found[0].chosen, found[1].chosen, tuple(found), info)
    if timer is None:
        _MEASURED[key] = numerics
    return numerics


_MEASURED: dict[tuple[ModelShapes, Workload, str, bool], Numerics] = {}


def frozen_in_bfloat16(model: torch.nn.Module) -> int:
    """Hold every frozen float32 parameter of ``model`` in bf16; returns how many.

    For a LoRA trainer under a bf16 autocast: the trainable adapter weights
    stay float32 (their master copy, which AdamW updates); the frozen base,
    tied output head included, is rounded to bf16 once instead of being cast
    in every forward. Buffers (rotary frequencies) are not parameters and stay
    float32.
    """
    import torch

    count = 0
    for param in model.parameters():
        if not param.requires_grad and param.dtype == torch.float32:
            param.data = param.data.to(torch.bfloat16)
            count += 1
    return count
