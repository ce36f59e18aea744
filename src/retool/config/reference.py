"""The configuration reference, rendered from the config dataclasses themselves.

The documentation site's configuration page is this module's output, written
at build time (``docs/hooks/config_reference.py``), so there is no hand-kept
copy that could drift from the code. Each column comes from the place that
decides it:

* **key, type, default**: :func:`dataclasses.fields` of each section of
  :class:`~retool.config.RunConfig`, in declaration order;
* **description**: the section's source, read with :mod:`tokenize`: the
  ``# ...`` comment on the field's line and the comment-only lines directly
  above it (a long description sits above the field). A field without one is
  reported by :func:`missing_descriptions`, which a test keeps empty, so a key
  added later without a word of explanation fails the build's test;
* **allowed values**: asked of the section's own check. The section is built
  with a value the check must refuse (a string for a number, a word no choice
  has for a string) and the refusal's ``must be ...`` clause is the allowed
  range or choices, in the very words a user sees for a bad value; each bound
  is then tried to tell ``[`` from ``(``. Nothing here restates a range, so a
  range changed in ``__post_init__`` changes the page.

Only the standard library and the config package are imported: rendering loads
no model or backend, and takes milliseconds.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

from retool.config.run import RunConfig
from retool.errors import ConfigError

_TOML_TYPES = {"int": "integer", "float": "float", "str": "string", "bool": "boolean"}
# values a check refuses: a string where a number belongs, a word no choice list has
_NOT_A_NUMBER = "?"
_NOT_A_CHOICE = "\u2047no-such-value"


@dataclass(frozen=True)
class FieldDoc:
    """One key of the reference: ``section.key``, its TOML type, default, allowed values, text."""

    section: str
    key: str
    type: str
    default: Any
    allowed: str  # "" when the check accepts any value of the type
    description: str

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"


@dataclass(frozen=True)
class SectionDoc:
    """One ``[section]``: its dataclass, docstring and keys."""

    name: str
    cls: type
    doc: str
    fields: tuple[FieldDoc, ...]


def sections() -> tuple[SectionDoc, ...]:
    """Every section of :class:`RunConfig`, in order, with every key documented."""
    hints = typing.get_type_hints(RunConfig)
    result = []
    for section in dataclasses.fields(RunConfig):
        cls = hints[section.name]
        comments = field_comments(cls)
        field_hints = typing.get_type_hints(cls)
        docs = []
        for item in dataclasses.fields(cls):
            kind = field_hints[item.name]
            docs.append(
                FieldDoc(
                    section=section.name,
                    key=item.name,
                    type=_TOML_TYPES.get(getattr(kind, "__name__", ""), str(kind)),
                    default=_default(item),
                    allowed=allowed_values(cls, section.name, item.name, kind),
                    description=comments.get(item.name, ""),
                )
            )
        result.append(SectionDoc(section.name, cls, inspect.getdoc(cls) or "", tuple(docs)))
    return tuple(result)


def _default(item: dataclasses.Field[Any]) -> Any:
    """A field's default value, from its factory if it has one."""
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None  # required (no section has one: every key has a default)


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment in ``cls``'s source (the lines above, then the line's own).

    Fields are found with :mod:`ast` (the class body's annotated assignments, so a
    docstring line that happens to start with a field's name is not one), comments
    with :mod:`tokenize`.
    """
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    names = {f.name for f in dataclasses.fields(cls)}
    trailing: dict[int, str] = {}  # line number (1-based) -> comment after code on that line
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and lines[token.start[0] - 1][: token.start[1]].strip():
            trailing[token.start[0]] = token.string.lstrip("#").strip()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    result: dict[str, str] = {}
    for node in body.body:
        if not (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id in names
        ):
            continue
        above: list[str] = []
        previous = node.lineno - 2  # the line before the field, 0-based
        while previous >= 0 and lines[previous].strip().startswith("#"):
            above.insert(0, lines[previous].strip().lstrip("#").strip())
            previous -= 1
        end = node.end_lineno or node.lineno
        beside = [trailing[n] for n in range(node.lineno, end + 1) if n in trailing]
        result[node.target.id] = " ".join(p for p in [*above, *beside] if p)
    return result


def allowed_values(cls: type, section: str, key: str, kind: Any) -> str:
    """What the section's check allows for ``key``, from the check's own refusal.

    ``""`` when it refuses neither probe (free text, such as a path or a URL
    that another key decides whether to read).
    """
    if kind is bool:
        return "true or false"
    where = f"{section}.{key}"
    if kind in (int, float):
        clause = _refusal(cls, key, _NOT_A_NUMBER, where)
        interval = _interval(cls, key, where, clause) if clause else ""
        if interval:
            return interval
        extremes: tuple[float, ...] = (10**30, -(10**30)) if kind is int else (1e30, -1e30)
        for extreme in extremes:
            clause = _refusal(cls, key, extreme, where)
            if clause:
                return re.sub(r"^be (in )?", "", clause)
        return ""
    for word in (_NOT_A_CHOICE, ""):
        clause = _refusal(cls, key, word, where)
        if clause:
            return _choices(clause)
    return ""


def _refusal(cls: type, key: str, value: object, where: str) -> str:
    """The ``must ...`` clause of the error ``cls(key=value)`` raises about ``where``, or ``""``.

    Errors about another key (a check that spans two) and ``TypeError`` from a
    comparison that a string cannot take are not this key's range: ``""``.
    """
    try:
        cls(**{key: value})
    except ConfigError as exc:
        match = re.fullmatch(rf"{re.escape(where)} must (.*?)(?:[,;] got .*)?", str(exc), re.S)
        return match.group(1) if match else ""
    except TypeError:
        return ""
    return ""


def _interval(cls: type, key: str, where: str, clause: str) -> str:
    """``be an integer >= 1 and <= 2**16`` as ``[1, 2**16]``, each bound tried for openness.

    An integer key's open lower bound is written closed (``> 0`` is ``[1, ...``).
    """
    low = re.search(r"(>=|>) (.+?)(?: and |$)", clause)
    high = re.search(r"<= (.+?)(?: and |$)", clause)
    if not low and not high:
        return ""
    integer = typing.get_type_hints(cls)[key] is int
    left, low_text = "(", "-inf"
    if low:
        left, low_text = ("[" if low.group(1) == ">=" else "("), low.group(2)
        number = _number(low_text)
        if left == "(" and integer and number is not None and float(number).is_integer():
            left, low_text = "[", str(int(number) + 1)
    right, high_text = ")", "inf"
    if high:
        high_text = high.group(1)
        # a later check may refuse the bound itself ([0, 1) for AdamW's betas)
        right = ")" if _bound_refused(cls, key, where, high_text) else "]"
    return f"{left}{low_text}, {high_text}{right}"


def _bound_refused(cls: type, key: str, where: str, bound: str) -> bool:
    """Whether the key's own check refuses ``bound`` (written as the check prints it)."""
    number = _number(bound)
    if number is None:
        return False
    field_type = typing.get_type_hints(cls)[key]
    value = float(number) if field_type is float else int(number)
    return bool(_refusal(cls, key, value, where))


def _number(text: str) -> float | None:
    """A bound as :func:`retool.checks.format_bound` writes it (``2**16``, ``2**32 - 1``,
    ``10**7``, ``1e+06``, ``0.5``) back as a number; ``None`` for anything else."""
    power = re.fullmatch(r"(\d+)\*\*(\d+)( - 1)?", text)
    if power:
        return int(power.group(1)) ** int(power.group(2)) - (1 if power.group(3) else 0)
    try:
        return float(text)
    except ValueError:
        return None


def _choices(clause: str) -> str:
    """``be one of local, pytrio, tinker`` as ``local``, ``pytrio``, ``tinker``; else the clause."""
    text = re.sub(r"^be (one of )?", "", clause)
    words = re.split(r", | or ", text)
    if all(re.fullmatch(r"[\w:.\-]+", w) for w in words) and len(words) > 1:
        return ", ".join(f"`{w}`" for w in words)
    return "must " + clause


def toml_value(value: object) -> str:
    """A default as it is written in a TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def missing_descriptions() -> list[str]:
    """``section.key`` of every field without a comment in its source (kept empty by a test)."""
    return [f.name for s in sections() for f in s.fields if not f.description]


def defaults_toml() -> str:
    """Every key with its default, one TOML file (``load_config`` of it is ``RunConfig()``)."""
    out = []
    for section in sections():
        out.append(f"[{section.name}]")
        out.extend(f"{f.key} = {toml_value(f.default)}" for f in section.fields)
        out.append("")
    return "\n".join(out)


def _markdown_text(text: str) -> str:
    """Docstring and comment text as Markdown: ``x`` -> `x`, :role:`~a.b` -> `a.b`, and
    ``<`` / ``>`` outside code as entities (``"demo:<split>"`` is text, not an HTML tag)."""
    # a role's target may be wrapped across lines in the source: join it again
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: "`" + re.sub(r"\s+", "", m.group(1)) + "`", text)
    text = text.replace("``", "`")
    return _outside_code(text, lambda p: p.replace("<", "&lt;").replace(">", "&gt;"))


def _outside_code(text: str, change: typing.Callable[[str], str]) -> str:
    """``text`` with ``change`` applied to every part outside a `code span`."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else change(p) for p in parts)


def _cell(text: str) -> str:
    """Text for a table cell: one line, and outside code spans ``|`` and the characters
    Markdown would read as emphasis or a link (``2**16``, ``[0, 1] (x)``) escaped."""
    return _outside_code(
        _markdown_text(text).replace("\n", " "),
        lambda p: re.sub(r"([|*_\[\]\\])", r"\\\1", p),
    )


def render_reference() -> str:
    """The whole configuration reference page, as Markdown."""
    out = [
        "---",  # the site's left navigation hidden here: the five-column tables need the width
        "hide:",
        "  - navigation",
        "---",
        "",
        "# Configuration reference",
        "",
        "Every key of every section, generated from the config dataclasses in",
        "`src/retool/config/` when the site is built: the type and default are the",
        "dataclass's, the description is the comment beside the field in the source, and",
        "*allowed* is what the section's own check accepts (the same words a bad value",
        "gets in its error). Set a key in a TOML file (`[section]`, then `key = value`)",
        "or on the command line with `--set section.key=value`; a flag beats `--set`,",
        "which beats the file, which beats the default. The",
        "[configuration guide](../guide/configuration.md) explains how to use them.",
        "",
    ]
    for section in sections():
        # the summary line, the table, then the rest of the docstring: the keys come first
        summary, _, details = section.doc.partition("\n\n")
        out += [f"## [{section.name}]", ""]
        if summary:
            out += [_markdown_text(summary), ""]
        out += [
            "| key | type | default | allowed | description |",
            "| --- | --- | --- | --- | --- |",
        ]
        for f in section.fields:
            anchor = f'<a id="{f.name}"></a>'
            out.append(
                f"| {anchor}`{f.key}` | {f.type} | `{toml_value(f.default)}` "
                f"| {_cell(f.allowed)} | {_cell(f.description)} |"
            )
        out.append("")
        if details.strip():
            out += [_markdown_text(details.strip()), ""]
    out += [
        "## Every default in one file",
        "",
        "The built-in defaults, which a config file overrides key by key (a file needs",
        "only the keys it changes):",
        "",
        "```toml",
        defaults_toml().rstrip(),
        "```",
        "",
    ]
    return "\n".join(out)
