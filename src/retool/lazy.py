"""A package's public names, imported when first used (PEP 562).

Every ``retool`` command is a fresh process, and most of them fail or finish
before they touch most of the project: a config error, ``--help``, a report. A
package ``__init__`` that imports all its modules makes each of those processes
pay for all of them (the sandbox's package alone was 0.2 s of every command's
0.5 s start). :func:`lazy_exports` keeps the package's names (``from
retool.sandbox import open_sandbox`` still works) and imports a name's module on
first access. Type checkers see the real imports in the package's
``if TYPE_CHECKING:`` block.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to
    the submodule (relative to ``package``, e.g. ``".factory"``) that defines it."""
    module_globals = importlib.import_module(package).__dict__
    for name, where in exports.items():
        # importing submodule ``.x`` sets the package's attribute ``x`` to the module,
        # which would then hide a lazy name ``x``: such a name must be imported eagerly
        if where.lstrip(".").split(".")[0] == name:
            raise ValueError(f"{package}: {name!r} is also a submodule; import it eagerly")

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where, package), name)
        module_globals[name] = value  # the next access is a plain global
        return value

    def __dir__() -> list[str]:
        return sorted({*module_globals, *exports})

    return __getattr__, __dir__
