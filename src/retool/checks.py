"""The general validators: one way to check a number, a path given as text, a device.

The ground floor beside :mod:`retool.errors`: every layer above (the value
types, the sandbox, the config sections, the CLI's options) checks its inputs
with these, so they say the same thing the same way and nothing below has to
import the config to validate a value. Each raises
:class:`~retool.errors.ConfigError` naming the field, flag or argument.
"""

from __future__ import annotations

import math
import numbers
import re
import typing
from typing import Any

from retool.errors import ConfigError

SEED_MAX = 2**32 - 1  # every seed fits numpy's and torch's generators


def check_number(
    where: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    integer: bool = False,
    low_open: bool = False,
) -> None:
    """The one numeric check: a real number (an integer if ``integer``), finite, in range.

    ``low``/``high`` are inclusive bounds (``low_open`` excludes ``low``); ``None``
    is unbounded on that side. A bool, a string or ``nan`` is refused with a
    :class:`ConfigError` that names ``where`` (``"rollout.top_p"``,
    ``"SamplingParams.max_tokens"``, ``"--questions"``) and the allowed range, so
    every config field, CLI option and value class says the same thing the
    same way. Upper bounds exist where a larger value is a typo that would
    crash or hang later (a timeout that overflows ``time_t``, a group of a
    billion samples), not to second-guess a user.
    """
    lower = f"{'>' if low_open else '>='} {format_bound(low)}" if low is not None else ""
    upper = f"<= {format_bound(high)}" if high is not None else ""
    bounds = " and ".join(b for b in (lower, upper) if b)
    kind = "an integer" if integer else "a finite number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        shown = f"the string {value!r}" if isinstance(value, str) else repr(value)
        raise ConfigError(f"{where} must be {kind} {bounds}".rstrip() + f", got {shown}")
    if (integer and not isinstance(value, numbers.Integral)) or not math.isfinite(value):
        raise ConfigError(f"{where} must be {kind} {bounds}".rstrip() + f", got {value!r}")
    value = typing.cast(float, value)  # a finite real: compares as a float does
    if low is not None and (value <= low if low_open else value < low):
        raise ConfigError(f"{where} must be {bounds}, got {value}")
    if high is not None and value > high:
        both = " and ".join(b for b in (upper, lower) if b)  # the bound that failed first
        raise ConfigError(f"{where} must be {both}, got {value}")


def format_bound(bound: float) -> str:
    """A bound as people write it: ``2**20``, ``2**32 - 1``, ``10**7``, ``1e+06``, ``0.5``."""
    if isinstance(bound, int) and bound >= 2**20:
        if bound & (bound - 1) == 0:
            return f"2**{bound.bit_length() - 1}"
        if bound & (bound + 1) == 0:
            return f"2**{bound.bit_length()} - 1"
        if str(bound).rstrip("0") == "1":
            return f"10**{len(str(bound)) - 1}"
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def check_path_text(where: str, value: Any, *, empty: bool = False) -> None:
    """A path or spec given as text: a string, not blank (unless ``empty``), no NUL byte."""
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    if not empty and not value.strip():
        raise ConfigError(f"{where} must not be empty")
    if "\0" in value:
        raise ConfigError(f"{where} must not contain a NUL character, got {value!r}")


def check_device(device: Any, where: str = "model.device") -> None:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (availability is the backend's check)."""
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda|cuda:\d{1,3}|mps", device):
        raise ConfigError(f"{where} must be auto, cpu, cuda, cuda:N or mps; got {device!r}")
