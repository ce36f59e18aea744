"""The checks every config section shares: a number in range, a path with ``~``.

Each section's ``__post_init__`` checks its fields with these, so every
field says the same thing the same way: :func:`check_range` is the project's
one numeric check (:func:`retool.checks.check_number`) under the name
``section.key``, which the loader then prefixes with where the value came
from (the file, or the ``--set`` that gave it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from retool.checks import check_number

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def check_range(
    section: str,
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    *,
    integer: bool | None = None,
    low_open: bool = False,
) -> None:
    """:func:`check_number` for config field ``section.name``.

    Pass ``integer`` for an ``int`` field (``None`` only checks an int value as
    an integer, which older callers rely on).
    """
    check_number(
        f"{section}.{name}",
        value,
        low,
        high,
        integer=isinstance(value, int) if integer is None else integer,
        low_open=low_open,
    )


def positive(section: str, name: str, value: float, high: float | None = None) -> None:
    """``section.name`` in ``(0, high]``."""
    check_range(section, name, value, 0, high, low_open=True)


def at_least(section: str, name: str, value: float, low: float, high: float | None = None) -> None:
    """``section.name`` in ``[low, high]``."""
    check_range(section, name, value, low, high)


def expand_home(config: DataclassInstance, *names: str) -> None:
    """A leading ``~`` in a path setting is the home directory, the same for every command.

    ``names`` are ``str`` fields of the frozen section ``config``, already
    checked as path text; each is rewritten in place (from ``__post_init__``).
    """
    for name in names:
        value: str = getattr(config, name)
        if value.startswith("~"):
            object.__setattr__(config, name, os.path.expanduser(value))
