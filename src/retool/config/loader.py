"""Reading a :class:`RunConfig`: the TOML file, ``--set`` overrides, where each value came from.

Every key is checked against its section's field type (a string where an
integer belongs is refused, with how to write the number in TOML) and unknown
sections and keys are refused, listing the allowed ones; then each section
validates itself on construction. An error about ``section.key`` is prefixed
with where that value came from (the file, or the ``--set`` that gave it), so
a bad value is found where it was written.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from retool.config.run import RunConfig
from retool.data.files import read_text
from retool.data.longints import toml_loads
from retool.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


def _as_toml(value: object) -> str:
    """A hint for a string that Python reads as a number but TOML does not (``.001``, ``1.``,
    ``1_0.``, ``+.5``): how to write it."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    written = str(int(number)) if number.is_integer() and "." not in value else repr(number)
    return f" (a string, not a TOML number: write {written})"


def _coerce(where: str, annotation: object, value: object) -> object:
    """Check ``value`` against a field's annotation (int, float, str, bool, tuple)."""
    hint = annotation
    if isinstance(hint, str):
        hint = {"int": int, "float": float, "str": str, "bool": bool}.get(hint, hint)
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(where, options[0], value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}{_as_toml(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}{_as_toml(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def build_section(cls: type[C], values: dict[str, Any], section: str) -> C:
    """Instantiate a section dataclass from a mapping, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}; "
            f"allowed in [{section}]: {', '.join(sorted(known))}"
        )
    kwargs = {k: _coerce(f"{section}.{k}", hints[k], v) for k, v in values.items()}
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"section.key=value"`` -> (section, key, value); the value is read as TOML."""
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    dotted, raw = text.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    try:
        parsed = toml_loads(f"v = {raw.strip()}", f"--set {dotted.strip()}", lines=False)
    except tomllib.TOMLDecodeError:
        return parts[0], parts[1], raw.strip()  # a bare word such as markdown
    if set(parsed) != {"v"}:  # a line break in the value set further keys: never ignore them
        raise ConfigError(
            f"--set {dotted.strip()}: the value must be one value on one line, got {raw!r}"
        )
    return parts[0], parts[1], parsed["v"]


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: typing.Sequence[str] = ()
) -> RunConfig:
    """Read a TOML config (or the defaults), apply ``--set`` overrides, validate."""
    return load_config_given(path, overrides)[0]


def load_config_given(
    path: str | os.PathLike[str] | None = None, overrides: typing.Sequence[str] = ()
) -> tuple[RunConfig, frozenset[str]]:
    """:func:`load_config`, and the ``section.key`` names the file or an override gave.

    For a command whose own default differs from the config's (``retool eval``
    samples with top_p 0.7): it applies its default only where nothing was given.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        text = read_text(path, what="config file", error=ConfigError)
        try:
            raw = toml_loads(text, str(path))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    sections = {f.name: f for f in dataclasses.fields(RunConfig)}
    for name, value in raw.items():
        if name not in sections:
            raise ConfigError(f"{path}: unknown section [{name}]; allowed: {', '.join(sections)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
    origin = {f"{s}.{k}": str(path) for s, table in raw.items() for k in table}
    for text in overrides:
        section, key, value = parse_override(text)
        if section not in sections:
            raise ConfigError(
                f"--set {text}: unknown section {section!r}; allowed: {', '.join(sections)}"
            )
        raw.setdefault(section, {})[key] = value
        origin[f"{section}.{key}"] = f"--set {text}"
    hints = typing.get_type_hints(RunConfig)
    try:
        built = {name: build_section(hints[name], raw.get(name, {}), name) for name in sections}
        return RunConfig(**built), frozenset(origin)
    except ConfigError as exc:
        raise ConfigError(_with_origin(str(exc), origin)) from None


def _with_origin(message: str, origin: dict[str, str]) -> str:
    """Prefix an error about ``section.key`` with where that value came from (file or --set)."""
    named = [key for key in origin if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message)]
    if not named:
        return message
    first = min(named, key=message.index)
    return f"{origin[first]}: {message}"
