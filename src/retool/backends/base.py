"""The backend contract, re-exported: see :mod:`retool.types`."""

from retool.types import SamplingClient, ServiceClient, TrainingClient

__all__ = ["SamplingClient", "ServiceClient", "TrainingClient"]
