"""vLLM as the rollout sampler (``[sampler] engine = "vllm"``; the ``vllm`` extra).

* :mod:`~retool.backends.vllm.convert`: our sampling contract as vLLM's
  request fields, its outputs as our :class:`~retool.types.SampledSequence`
  (no ``vllm`` import; shared with the ``vllm serve`` client);
* :mod:`~retool.backends.vllm.engine`: one in-process engine per run, driven
  by one thread, and the per-step :class:`VllmSamplingClient` the rollout uses;
* :mod:`~retool.backends.vllm.sync`: the trainer's weights in the form the
  engine loads (``lora`` adapters or ``merged`` weights);
* :mod:`~retool.backends.vllm.policy_sync`: when a sampler syncs (once per
  optimizer step, timed), shared by the engine and the servers;
* ``vllm serve`` endpoints (``sampler.urls``):
  :mod:`~retool.backends.vllm.endpoints` (one URL and its connections),
  :mod:`~retool.backends.vllm.servers` (requests routed across them, adapters
  published to all), :mod:`~retool.backends.vllm.server_sampler` (the step's
  sampling client) and :mod:`~retool.backends.vllm.server_policy` (the run's
  adapter published each step).

``vllm`` itself is imported only when an engine starts, so the rest of the
project imports and tests without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from retool.lazy import lazy_exports

if TYPE_CHECKING:  # annotations only: config sits a floor above, the local trainer loads torch
    from retool.backends.local.training import LocalTrainingClient
    from retool.backends.vllm.engine import (
        EngineOptions,
        VllmEngine,
        VllmPolicySampler,
        VllmSamplingClient,
        check_installed,
        policy_version,
    )
    from retool.backends.vllm.server_policy import ServerPolicySampler
    from retool.config import RunConfig
    from retool.types import TrainingClient

# the engine's and the servers' modules on first use (retool/lazy.py): every command that
# can sample imports this package, most of them never start vLLM
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "EngineOptions": ".engine",
        "VllmEngine": ".engine",
        "VllmPolicySampler": ".engine",
        "VllmSamplingClient": ".engine",
        "check_installed": ".engine",
        "policy_version": ".engine",
    },
)

__all__ = [
    "EngineOptions",
    "VllmEngine",
    "VllmPolicySampler",
    "VllmSamplingClient",
    "check_installed",
    "engine_options",
    "open_policy_sampler",
    "policy_version",
]


def engine_options(config: RunConfig) -> EngineOptions:
    """A :class:`~retool.config.RunConfig`'s ``[sampler]`` settings as engine options."""
    from retool.backends.local.distributed import world  # here: the local backend loads torch
    from retool.backends.vllm.engine import EngineOptions

    sampler = config.sampler
    return EngineOptions(
        dtype=sampler.dtype,
        max_model_len=sampler.max_model_len or config.train.max_train_tokens,
        enforce_eager=sampler.enforce_eager,
        kv_cache_gb=sampler.kv_cache_gb,
        gpu_memory_utilization=sampler.gpu_memory_utilization,
        threads_bind=sampler.threads_bind,
        max_num_seqs=config.rollout.max_in_flight_samples,
        seed=config.rollout.seed,
        # under torchrun rank 0's torch.distributed holds the trainer's group: vLLM's
        # worker must not see it (engine.py's module docstring)
        own_process=world().distributed,
    )


def open_policy_sampler(
    config: RunConfig, trainer: TrainingClient, work_dir: str | Path
) -> VllmPolicySampler | ServerPolicySampler | None:
    """The run's vLLM sampler for ``sampler.engine = "vllm"``; ``None`` for the local one.

    Its ``snapshot()`` is the step's sampling client (weights synced first),
    its ``close()`` ends the engine.
    """
    from retool.backends.vllm.engine import VllmPolicySampler
    from retool.backends.vllm.server_policy import open_server_sampler

    sampler = config.sampler
    if sampler.engine != "vllm":
        return None
    if sampler.url_list:  # vllm serve endpoints: the adapter published to each
        return open_server_sampler(config, trainer)
    # the in-process engine's trainer is the local one: RunConfig refuses any other backend
    local = cast("LocalTrainingClient", trainer)
    keep = config.train.max_off_policy_steps + 1  # overlapped steps' older policies stay loaded
    options, root = engine_options(config), Path(work_dir) / "vllm"
    return VllmPolicySampler(local, sampler.sync, options, root, keep=keep)
