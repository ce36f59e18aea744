"""Keep tool output from forging template structure.

Model-written code controls its own stdout, so an observation could contain
``<|im_end|>``, ``<|im_start|>assistant`` or ``</tool_response>`` and, once
tokenized, close the tool turn and impersonate the assistant. We break every
such marker by inserting a zero-width space after its first character: the
text still reads the same to a person, but no longer tokenizes as a special
token or matches a tool tag.
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


def _break(marker: str) -> str:
    return marker[0] + ZWSP + marker[1:]


def sanitize_observation(text: str, special_tokens: Iterable[str] = ()) -> str:
    """``text`` with every special-token string and tool tag defused."""
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
