"""Errors a user can cause, each with a message that says what to do.

Every error the user can trigger (a bad file, a bad config value, a missing
dependency) is a :class:`RetoolError`. The CLI prints it as one line and exits
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class RetoolError(Exception):
    """Base class of all user-facing errors."""


class ConfigError(RetoolError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class DataError(RetoolError, ValueError):
    """An input data file is malformed; the message names ``path:line``."""


class ProtocolError(RetoolError):
    """A chat template or tool-call dialect cannot be used as asked."""


class SandboxError(RetoolError):
    """The sandbox cannot run code at the requested isolation level."""


class BackendError(RetoolError):
    """A model backend rejected a request (bad model name, too long input...)."""


class StalePolicyError(BackendError):
    """A sample came from other weights than the step's policy (a weight sync did not apply)."""


class SamplerDeadError(StalePolicyError):
    """The sampler failed for good (its engine stopped; the model does not run on it).

    No retry can succeed, so none is made: a :class:`StalePolicyError`, the class the
    rollout never retries (neither sampler can give the step's policy's samples again).
    """


class ServiceError(RetoolError):
    """A service the run depends on (sampler, sandbox) kept failing after every retry."""


class DependencyError(RetoolError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


def require(module: str, extra: str):
    """Import ``module`` or raise :class:`DependencyError` naming the pip extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DependencyError(
            f"{module!r} is not installed; install it with: pip install 'retool-rl[{extra}]'"
        ) from exc
