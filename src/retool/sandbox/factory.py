"""``open_sandbox``: the one place that turns ``[sandbox]`` settings into a sandbox.

Commands and the training loop never branch on ``sandbox.backend`` themselves:
both backends give the same ``run`` / ``arun`` / ``close`` / ``stats`` and the
same ``ExecResult``s, so choosing one is all that differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retool.sandbox.fusion import FusionSandbox
from retool.sandbox.local import LocalSandbox

if TYPE_CHECKING:
    from retool.config import SandboxConfig


def open_sandbox(config: SandboxConfig) -> LocalSandbox | FusionSandbox:
    """The sandbox a ``SandboxConfig`` asks for: local, or a SandboxFusion service.

    A SandboxFusion service is checked with one test snippet here, so a wrong
    ``sandbox.url`` fails before anything else starts.
    """
    if config.backend == "sandboxfusion":
        return FusionSandbox(
            config.url,
            timeout=config.timeout,
            memory_mb=config.memory_mb,
            max_workers=config.max_workers,
            max_output_bytes=config.max_output_bytes,
            request_slack=config.request_slack,
            request_retries=config.request_retries,
            request_backoff=config.request_backoff,
        )
    return LocalSandbox(
        timeout=config.timeout,
        memory_mb=config.memory_mb,
        max_workers=config.max_workers,
        isolation=config.isolation,
        max_output_bytes=config.max_output_bytes,
    )
