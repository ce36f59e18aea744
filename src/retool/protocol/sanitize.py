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
nor hide text from a person reading a rollout.
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
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_control(text: str) -> str:
    """``text`` with every control character but newline and tab shown as ``\\xNN``."""
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


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
