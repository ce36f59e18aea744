"""Checks of the reward API's arguments, each error naming the argument.

A reference answer may be a number: ``load_examples`` turns ``"answer": 42``
into ``"42"``, and a caller holding ``42`` (or ``0.75``, ``Fraction(3, 4)``)
means the same thing, so numbers are written as the text math-verify reads
(integers exactly, other values in plain decimal notation, fractions as
``p/q``). Anything else that is not text (``None``, bytes, a list) is a bug
in the caller and raises :class:`~retool.errors.ConfigError` at once, instead
of a bare ``TypeError`` from deep inside the regex or the worker protocol.
"""

from __future__ import annotations

import numbers
from decimal import Decimal
from fractions import Fraction

from retool.checks import check_number
from retool.errors import ConfigError
from retool.limits import REWARD_MAX_TIMEOUT_S as MAX_TIMEOUT_S  # as reward.timeout
from retool.limits import REWARD_MAX_WORKERS as MAX_WORKERS  # as reward.workers


def check_text(where: str, value: object, what: str) -> str:
    """``value`` if it is a ``str``; else a :class:`ConfigError` naming ``where``."""
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a str ({what}), got {type(value).__name__}")
    return value


def reference_text(where: str, value: object) -> str:
    """A reference answer as text: a ``str`` as it is, a finite number written out."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real | Decimal):
        raise ConfigError(
            f"{where} must be a str or a number (the reference answer), got {type(value).__name__}"
        )
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, Fraction):
        return f"{value.numerator}/{value.denominator}" if value.denominator != 1 else str(value)
    number = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
    if not number.is_finite():
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if number == number.to_integral_value():
        return str(int(number))
    return format(number, "f")


def check_timeout(where: str, value: object) -> float:
    check_number(where, value, 0, MAX_TIMEOUT_S, low_open=True)
    return float(value)  # type: ignore[arg-type]  # checked: a real number


def check_workers(where: str, value: object) -> int:
    check_number(where, value, 1, MAX_WORKERS, integer=True)
    return int(value)  # type: ignore[call-overload]  # checked: an integer
