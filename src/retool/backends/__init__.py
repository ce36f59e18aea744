"""Model backends. Each implements the contract in :mod:`retool.types`.

:func:`service_client` is the one place that turns ``model.backend`` into a
service client, and :func:`tunes_numerics` and :func:`correction_in_loss` say
what a backend can do, so commands never branch on the backend themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from retool.errors import ConfigError
from retool.types import SamplingClient, ServiceClient

if TYPE_CHECKING:  # config sits a floor above the backends: annotations only
    from retool.config import ModelConfig


def tunes_numerics(model: ModelConfig) -> bool:
    """Whether the backend picks its dtypes on this host (``model.dtype = "auto"``
    measures the run's workload) and records them in ``numerics.json``: the local
    backend; a service computes in its own numerics."""
    return model.backend == "local"


def correction_in_loss(model: ModelConfig) -> bool:
    """Whether the backend's loss applies the rollout correction and measures the
    sampler/trainer mismatch itself (its ``loss_config`` takes the correction and its
    datums the sampler's logprobs): the local backend. A service's loss cannot be
    changed, so the correction goes through the advantages instead."""
    return model.backend == "local"


def service_client(
    model: ModelConfig,
    checkpoint_root: str | Path = "runs/checkpoints",
    **local_options: Any,
) -> ServiceClient:
    """A service client for ``model.backend``: local, or a PyTRIO / Tinker adapter.

    The remote adapters check their credential here, before any request, and
    keep pointer directories for their checkpoints under ``checkpoint_root``
    (see :mod:`retool.backends.remote`). ``local_options`` (``workload``,
    ``numerics``: :mod:`retool.backends.local.dtype`) go to the local backend only.
    """
    if model.backend == "local":
        # here, not at the top: retool.backends.local imports torch (seconds to load)
        from retool.backends.local import LocalServiceClient

        return LocalServiceClient(
            device=model.device,
            dtype=model.dtype,
            compile=model.compile,
            checkpoint_root=checkpoint_root,
            **local_options,
        )
    # the adapters import numpy and their SDKs' shapes: only for the backend in use
    if model.backend == "pytrio":
        from retool.backends.pytrio import PytrioServiceClient

        return PytrioServiceClient(model, checkpoint_root=checkpoint_root)
    if model.backend == "tinker":
        from retool.backends.tinker import TinkerServiceClient

        return TinkerServiceClient(model, checkpoint_root=checkpoint_root)
    raise ConfigError(f"model.backend must be local, pytrio or tinker; got {model.backend!r}")


def open_sampling_client(service: ServiceClient, model: str) -> SamplingClient:
    """A sampling client for ``model``: saved sampler weights, or a base model name."""
    if (Path(model) / "retool_sampler.json").is_file():
        return service.create_sampling_client(model_path=model)
    return service.create_sampling_client(base_model=model)
