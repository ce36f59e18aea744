"""JSON and TOML text holding integers longer than Python converts: one clear error, or text.

CPython refuses to turn a decimal string of more than
``sys.get_int_max_str_digits()`` digits (4300 by default) into an ``int``
(a guard against quadratic-time parsing), and the refusal is a bare
``ValueError`` that escapes ``json.loads`` and ``tomllib.loads`` as a
traceback. The project's readers go through this module instead:

* :func:`json_loads` reads one JSON document; an oversized integer is a
  ``json.JSONDecodeError`` at its line and column (so every reader's existing
  "invalid JSON at file:line" handling reports it), or, with
  ``big_int_as_text=True``, the integer's digits as a ``str``. Datasets use
  the latter: an unquoted answer of thousands of digits (a big product) is
  still a usable answer, compared as text.
* :func:`toml_loads` reads a TOML document; an oversized integer is a
  :class:`~retool.errors.ConfigError` naming ``where:line``.

The limit itself is left alone: raising it process-wide would let one line of
a data file cost minutes of CPU.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from typing import Any

from retool.errors import ConfigError

DIGITS = sys.get_int_max_str_digits() or 4300  # the interpreter's limit (0 means unlimited)
_LONG_RUN = re.compile(rf"\d{{{DIGITS + 1},}}")


def _locate(text: str, start: int) -> tuple[int, int]:
    line = text.count("\n", 0, start) + 1
    return line, start - (text.rfind("\n", 0, start) + 1) + 1


def oversized_integer(text: str) -> tuple[int, int, int] | None:
    """``(line, column, digits)`` of the first run of more digits than Python converts."""
    match = _LONG_RUN.search(text)
    if match is None:
        return None
    return (*_locate(text, match.start()), match.end() - match.start())


def _too_long(digits: int, hint: str) -> str:
    return f"an integer of {digits} digits (Python reads at most {DIGITS}); {hint}"


def _int_or_text(token: str) -> int | str:
    return int(token) if len(token.lstrip("-")) <= DIGITS else token


def json_loads(text: str, *, big_int_as_text: bool = False) -> Any:
    """``json.loads(text)``, with integers longer than Python converts kept as text or refused."""
    if big_int_as_text:
        return json.loads(text, parse_int=_int_or_text)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError:
        found = oversized_integer(text)
        if found is None:
            raise
        match = _LONG_RUN.search(text)
        hint = "quote it if it is text"
        raise json.JSONDecodeError(
            _too_long(found[2], hint), text, match.start() if match else 0
        ) from None


def toml_loads(text: str, where: str, *, lines: bool = True) -> dict[str, Any]:
    """``tomllib.loads(text)``; an oversized integer is a :class:`ConfigError` at ``where:line``
    (``where`` alone when ``lines`` is false: a one-line ``--set`` value)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:
        found = oversized_integer(text)
        if found is None:
            raise
        line, column, digits = found
        at = f"{where}:{line}" if lines else where
        column_note = f" (column {column})" if lines else ""
        raise ConfigError(
            f"{at}: {_too_long(digits, 'use a smaller value')}{column_note}"
        ) from None
