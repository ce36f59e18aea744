"""``make_tracker``: start one named tracker, or fail before training starts.

Failures are sorted so the one line the CLI prints says what to do:

* an unknown name is a :class:`~retool.errors.ConfigError` listing the names;
* the backend's package missing is a :class:`~retool.errors.DependencyError`
  naming the ``track`` extra (only when the package itself is absent: a broken
  install, e.g. a missing dependency *of* the package, is a start failure and
  says so, rather than advising an install that is already there);
* anything else raised while starting is a :class:`~retool.errors.RetoolError`
  ``tracker 'wandb' failed to start: <Type>: <message>`` with the original
  exception chained for ``--debug`` tracebacks.

After a successful start the tracker never raises (see :mod:`retool.tracking.base`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from retool.errors import ConfigError, DependencyError, RetoolError
from retool.tracking import backends
from retool.tracking.base import BaseTracker, one_line

TRACKERS = ("swanlab", "wandb", "tensorboard")

# tracker name -> the package its backend imports
PACKAGES = {"swanlab": "swanlab", "wandb": "wandb", "tensorboard": "tensorboard"}


def _backend(kind: str) -> Callable[[Path, str, Mapping[str, Any]], BaseTracker]:
    return {
        "swanlab": backends.SwanLabTracker,
        "wandb": backends.WandbTracker,
        "tensorboard": backends.TensorBoardTracker,
    }[kind]


def require_backend(kind: str) -> ModuleType:
    """Import the package of tracker ``kind``; :class:`DependencyError` if it is not installed."""
    module = PACKAGES[kind]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise  # the package is there but broken: a start failure, not a missing extra
        raise DependencyError(
            f"tracker {kind!r} needs the {module!r} package, which is not installed; "
            "install it with: pip install 'retool-rl[track]'"
        ) from exc


def make_tracker(kind: str, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> BaseTracker:
    """Start tracker ``kind`` in its offline mode, writing under ``run_dir``.

    ``run_name`` names the run in the dashboard; ``config`` (the run's full
    configuration, nested mappings allowed) is recorded with it.
    """
    name = str(kind).strip().lower()
    if name not in TRACKERS:
        raise ConfigError(f"unknown tracker {kind!r}; choose one of: {', '.join(TRACKERS)}")
    try:
        require_backend(name)
        return _backend(name)(Path(run_dir), str(run_name), config)
    except RetoolError:
        raise
    except Exception as exc:
        raise RetoolError(f"tracker {name!r} failed to start: {one_line(exc)}") from exc
