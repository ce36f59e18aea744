"""Keep tool output from forging template structure.

Model-written code controls its own stdout, so an observation could contain
``<|im_end|>``, ``<|im_start|>assistant`` or ``</tool_response>`` and, once
tokenized, close the tool turn and impersonate the assistant. We break every
such marker by inserting a zero-width space after its first character: the
text still reads the same to a person, but no longer tokenizes as a special
token or matches a tool tag.

Control characters are escaped too: C0 (other than newline and tab), DEL and C1
become visible ``\\x1b``-style text, so printed output can neither move a
terminal's cursor (``\\r``, ESC sequences) when shown by ``retool sandbox exec``
nor hide text from a person reading a rollout. So are the invisible format
characters that reorder or hide text without being control codes (Unicode's
``Cf``, ``Zl`` and ``Zp``: bidi overrides, embeddings, isolates and marks,
the word joiner and the BOM, tag characters that spell ASCII invisibly,
interlinear annotations, line and paragraph separators; also the blank
Hangul fillers and the supplementary variation selectors, which carry data
invisibly after any letter). They become ``\\u202e`` / ``\\U000e0041``-style
text. Lone surrogates (U+D800 to U+DFFF outside a pair: a decoder's
``surrogateescape`` byte, a ``\\ud800`` JSON escape) are shown the same way:
they are not characters, and no tokenizer or UTF-8 writer accepts them.
Three are kept: the zero-width joiner and non-joiner (U+200C, U+200D),
which shape Persian and Indic words and emoji, and the zero-width space
(U+200B), which is our own defuser (so sanitizing twice changes nothing);
none of them can reorder or hide other text. The ranges are spelled out
below rather than computed from ``unicodedata`` at import (a pass over 1.1 M
code points); a test checks them against the running Python's Unicode tables.

Every place that shows sandbox or model output uses :func:`escape_control`:
observations (:func:`sanitize_observation`, for both sandboxes and the
dialects), ``retool sandbox`` output, and the report viewer's texts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

ZWSP = "\u200b"

# Tags of the dialects we speak and of common chat templates.
TOOL_TAGS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<think>",
    "</think>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "<start_of_turn>",
    "<end_of_turn>",
)
_SPECIAL_RE = re.compile(r"<\|[^<>|\s]{0,64}\|>|<｜[^<>｜]{0,64}｜>")


# C0 except \t and \n, DEL, and C1.
_CONTROL = "\x00-\x08\x0b-\x1f\x7f-\x9f"
# Format (Cf), line (Zl) and paragraph (Zp) separators of Unicode 15.1 but ZWSP/ZWNJ/ZWJ,
# plus the Hangul fillers and variation selectors 17-256 (see the module docstring).
_INVISIBLE = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f\u1160\u180e"
    "\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0"
    "\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f\U000e0100-\U000e01ef"
)
_SURROGATE = "\ud800-\udfff"  # a str holds them only unpaired
_CONTROL_RE = re.compile(f"[{_CONTROL}{_INVISIBLE}{_SURROGATE}]")


def _shown(match: re.Match[str]) -> str:
    point = ord(match.group(0))
    if point <= 0xFF:
        return f"\\x{point:02x}"
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


def escape_control(text: str) -> str:
    """``text`` with every control character but newline and tab shown as ``\\xNN``, and
    every invisible format character and lone surrogate as ``\\uNNNN`` / ``\\UNNNNNNNN``."""
    return _CONTROL_RE.sub(_shown, text)


def _break(marker: str) -> str:
    return marker[0] + ZWSP + marker[1:]


def sanitize_observation(text: str, special_tokens: Iterable[str] = ()) -> str:
    """``text`` with control characters escaped and every special-token string and
    tool tag defused."""
    text = escape_control(text)
    text = _SPECIAL_RE.sub(lambda m: _break(m.group(0)), text)
    markers = sorted(
        {*TOOL_TAGS, *(t for t in special_tokens if len(t) > 1)}, key=len, reverse=True
    )
    for marker in markers:
        if marker in text:
            text = text.replace(marker, _break(marker))
    return text


def tokenizer_special_strings(tokenizer: object) -> list[str]:
    """Every special or added token string a tokenizer would match as one token."""
    found: set[str] = set(getattr(tokenizer, "all_special_tokens", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for token in added.values():
        content = getattr(token, "content", None)
        if content:
            found.add(content)
    return sorted(found)
