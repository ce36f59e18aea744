"""``sampler.engine = "auto"``: vLLM where it is installed and measured faster here, else ours.

Timing both engines at start would cost more than it saves on the hosts this
project runs on (a vLLM engine takes ~17 s to start on 2 cores, ours loads the
model again: a measurement of both is most of a short evaluation), so ``auto``
decides by a rule whose every branch rests on a measurement in
docs/measurements.md ("Facts the code cites"):

* vLLM samples beside the local backend only (a service samples itself);
* ``sampler.urls`` given: vLLM (the user started those servers for this);
* not installed, or a model vLLM's CPU kernels refuse (heads under 32 wide,
  ``tiny-random``): ours;
* a CUDA GPU: vLLM (its kernels and scheduler are built for it; ours decodes
  with HF's forward), under torchrun too (the engine's core runs in a process
  of its own beside rank 0 there);
* under torchrun (``WORLD_SIZE`` > 1) on a CPU: ours. The engine's processes
  would share the cores the ranks train on, which has not been measured;
* a CPU with AMX-BF16: vLLM. 2026-12-01, a 2-core AMX-BF16 host, SmolLM2 on
  the rollout-shaped workload: vLLM 180 tok/s in float32 and 349 in bfloat16
  against our 151 in float32 (1.2x and 2.3x), and RL steps 1.7x faster
  (2026-12-04) — faster for either ``sampler.dtype``;
* any other CPU (AVX2, AVX-512 BF16 without AMX, ARM): ours. vLLM has not been
  measured faster there, and its bf16 fast path needs AMX (bf16 matmuls ran
  4-28x slower on AVX2, about equal on AVX-512 BF16 without AMX).

The choice is one :class:`EngineChoice`: printed as one line (:meth:`line`)
and recorded where the run's numerics are (its :meth:`to_dict`). The inputs
(installed, GPU, CPU flags) are injectable, so each branch is tested without
the hardware.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from retool.backends.vllm.model_sampler import MIN_CPU_HEAD_DIM, head_dim, source_config

if TYPE_CHECKING:  # config sits a floor above the backends: annotations only
    from retool.config import RunConfig

ENGINES = ("local", "vllm", "auto")


@dataclass(frozen=True)
class EngineChoice:
    """Which engine samples, what was asked, and why."""

    engine: str  # local | vllm
    requested: str  # local | vllm | auto
    reason: str

    def line(self) -> str:
        return f"sampler engine: {self.engine} (sampler.engine = {self.requested!r}: {self.reason})"

    def to_dict(self) -> dict[str, str]:
        return {"engine": self.engine, "requested": self.requested, "reason": self.reason}


def on_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def cpu_flags() -> str:
    from retool.backends.local.dtype import cpu_flags as flags

    return flags()


def choose_engine(
    requested: str,
    *,
    backend: str,
    model_path: str,
    dtype: str,
    installed: bool | None = None,
    gpu: bool | None = None,
    flags: str | None = None,
    config: dict[str, Any] | None = None,
    urls: bool = False,
) -> EngineChoice:
    """The engine for ``requested`` (``auto`` by the rule in the module docstring).

    ``installed``, ``gpu``, ``flags`` and ``config`` (the model's HF config)
    default to this host's and ``model_path``'s.
    """
    if requested != "auto":
        return EngineChoice(requested, requested, "as configured")

    def pick(engine: str, reason: str) -> EngineChoice:
        return EngineChoice(engine, "auto", reason)

    if backend != "local":
        return pick("local", f"model.backend = {backend!r} samples with its own service")
    if urls:
        return pick("vllm", "sampler.urls names vllm serve endpoints")
    if installed is None:
        installed = importlib.util.find_spec("vllm") is not None
    if not installed:
        return pick("local", "vllm is not installed")
    if gpu is None:
        gpu = on_gpu()
    if not gpu:
        width = head_dim(config if config is not None else source_config(model_path) or {})
        if width is not None and width < MIN_CPU_HEAD_DIM:
            return pick("local", f"vLLM on CPU refuses {width}-wide attention heads")
    if gpu:
        return pick("vllm", f"a CUDA GPU, {dtype}")
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return pick("local", "torchrun on a CPU: vLLM beside the ranks not measured faster")
    present = set((flags if flags is not None else cpu_flags()).split())
    if "amx_bf16" in present:
        return pick(
            "vllm",
            f"AMX-BF16 CPU, {dtype}: vLLM measured 1.2x (float32) to 2.3x (bfloat16) our "
            "tok/s on such a host (docs/measurements.md)",
        )
    return pick(
        "local",
        f"CPU without AMX-BF16, {dtype}: vLLM not measured faster here (docs/measurements.md)",
    )


def resolve_engine(config: RunConfig) -> tuple[RunConfig, EngineChoice]:
    """A training run's config with ``sampler.engine = "auto"`` replaced by the choice.

    The run directory then records the engine that sampled (``config.toml``),
    and every later check (the vLLM settings, the sampler's numerics) sees it.
    """
    sampler = config.sampler
    choice = choose_engine(
        sampler.engine,
        backend=config.model.backend,
        model_path=config.model.base_model,
        dtype=sampler.dtype,
        urls=bool(sampler.url_list),
    )
    if choice.engine == sampler.engine:
        return config, choice
    chosen = dataclasses.replace(sampler, engine=choice.engine)
    return dataclasses.replace(config, sampler=chosen), choice
