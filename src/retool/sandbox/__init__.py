"""Executes model-written Python: isolated, limited, stateless, fast.

``LocalSandbox`` runs each snippet in a child of a pre-imported fork server,
inside fresh namespaces with a read-only root, no network, an empty
environment and per-call limits; ``format_tool_content`` turns the result into
the observation the model reads. See ``server.py`` for the process tree.
``FusionSandbox`` (``fusion.py`` and its ``fusion_*`` parts) gives the same
interface and results over a SandboxFusion service's HTTP ``run_code`` API
(``client.py`` holds what the two share). Both refuse code over
``MAX_CODE_BYTES`` or not UTF-8 text unrun (``limits.py``). ``open_sandbox``
(``factory.py``) picks one of the two from the ``[sandbox]`` settings.
"""

from typing import TYPE_CHECKING

from retool.lazy import lazy_exports

if TYPE_CHECKING:
    from retool.sandbox.environment import sandbox_env
    from retool.sandbox.factory import open_sandbox
    from retool.sandbox.fusion import FusionSandbox
    from retool.sandbox.limits import MAX_CODE_BYTES
    from retool.sandbox.local import DEFAULT_PRELOAD, IsolationLevel, LocalSandbox
    from retool.sandbox.result import ErrorKind, ExecResult, format_tool_content
    from retool.sandbox.stats import SandboxStats

# imported on first use (retool/lazy.py): loading the settings imports this package
# for fusion_endpoint's check, and should not start the whole sandbox's imports
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "sandbox_env": ".environment",
        "open_sandbox": ".factory",
        "FusionSandbox": ".fusion",
        "MAX_CODE_BYTES": ".limits",
        "DEFAULT_PRELOAD": ".local",
        "IsolationLevel": ".local",
        "LocalSandbox": ".local",
        "ErrorKind": ".result",
        "ExecResult": ".result",
        "format_tool_content": ".result",
        "SandboxStats": ".stats",
    },
)

__all__ = [
    "DEFAULT_PRELOAD",
    "MAX_CODE_BYTES",
    "ErrorKind",
    "ExecResult",
    "FusionSandbox",
    "IsolationLevel",
    "LocalSandbox",
    "SandboxStats",
    "format_tool_content",
    "open_sandbox",
    "sandbox_env",
]
