"""``[sandbox]``: where and with which limits model code runs.

The ranges are :mod:`retool.limits`'s, the same the sandbox clients check at
construction; ``sandbox.url`` is read by the SandboxFusion client's own
parser (:func:`retool.sandbox.fusion_endpoint.parse_endpoint`, a floor
below), so the config refuses exactly the URLs the client would.
"""

from __future__ import annotations

from dataclasses import dataclass

from retool.config.fields import at_least, check_range, positive
from retool.errors import ConfigError
from retool.limits import (
    SANDBOX_MAX_OUTPUT_BYTES,
    SANDBOX_MAX_REQUEST_RETRIES,
    SANDBOX_MAX_TIMEOUT_S,
    SANDBOX_MAX_WORKERS,
    SANDBOX_MEMORY_MB_RANGE,
)
from retool.sandbox.fusion_endpoint import parse_endpoint


@dataclass(frozen=True)
class SandboxConfig:
    """Where and with which limits model code runs.

    ``backend = "local"`` runs it in :class:`~retool.sandbox.LocalSandbox` on
    this machine; ``"sandboxfusion"`` sends it to a SandboxFusion service at
    ``url`` (:class:`~retool.sandbox.fusion.FusionSandbox`), with the same
    results, limits and auto-print. ``isolation`` is the local sandbox's
    setting (the service isolates as it is deployed, so only ``auto`` is
    accepted there); ``url`` and the ``request_*`` settings are read by the
    service client only and ignored by the local sandbox.
    """

    timeout: float = 10.0  # wall-clock seconds per call, in (0, 86400]
    # MiB of headroom per call above the preloaded interpreter (not a total cap), in
    # [16, 2**20]; sent as memory_limit_MB to the service, which applies it as deployed
    memory_mb: int = 1024
    max_workers: int = 8  # calls running at once (HTTP requests in flight), in [1, 256]
    max_output_bytes: int = 16384  # kept of stdout and of stderr (the tail), in [1, 2**23]
    isolation: str = "auto"  # local: auto | strict | none
    backend: str = "local"  # local | sandboxfusion
    url: str = ""  # sandboxfusion: the service's http(s) base URL or its /run_code endpoint
    request_slack: float = 60.0  # sandboxfusion: seconds a reply may take beyond timeout
    request_retries: int = 3  # sandboxfusion: extra attempts after a transport failure
    request_backoff: float = 0.5  # sandboxfusion: seconds before the first retry; doubles

    def __post_init__(self) -> None:
        positive("sandbox", "timeout", self.timeout, SANDBOX_MAX_TIMEOUT_S)
        check_range("sandbox", "memory_mb", self.memory_mb, *SANDBOX_MEMORY_MB_RANGE, integer=True)
        # (0, n] is [1, n] for an integer, said as "> 0" like the other counts
        check_range(
            "sandbox",
            "max_workers",
            self.max_workers,
            0,
            SANDBOX_MAX_WORKERS,
            integer=True,
            low_open=True,
        )
        check_range(
            "sandbox",
            "max_output_bytes",
            self.max_output_bytes,
            0,
            SANDBOX_MAX_OUTPUT_BYTES,
            integer=True,
            low_open=True,
        )
        if self.isolation not in {"auto", "strict", "none"}:
            raise ConfigError(
                f"sandbox.isolation must be auto, strict or none; got {self.isolation!r}"
            )
        if self.backend not in {"local", "sandboxfusion"}:
            raise ConfigError(
                f"sandbox.backend must be local or sandboxfusion; got {self.backend!r}"
            )
        positive("sandbox", "request_slack", self.request_slack, SANDBOX_MAX_TIMEOUT_S)
        check_range(
            "sandbox",
            "request_retries",
            self.request_retries,
            0,
            SANDBOX_MAX_REQUEST_RETRIES,
            integer=True,
        )
        at_least("sandbox", "request_backoff", self.request_backoff, 0, SANDBOX_MAX_TIMEOUT_S)
        if self.backend == "sandboxfusion":
            parse_endpoint(self.url, "sandbox.url")
            if self.isolation != "auto":
                raise ConfigError(
                    f"sandbox.isolation = {self.isolation!r} applies to the local sandbox only; "
                    'with sandbox.backend = "sandboxfusion" the service isolates calls as it is '
                    'deployed: leave sandbox.isolation = "auto"'
                )
