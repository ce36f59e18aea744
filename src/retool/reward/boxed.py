"""Find the final ``\\boxed{...}`` answer in a model's text.

Only the last ``TAIL_CHARS`` characters are searched, as in the reference: a box
early in the reasoning is a draft, not the answer. Inside that window the last
box whose braces balance wins; nested braces (``\\boxed{\\frac{1}{2}}``), a space
before the brace (``\\boxed {x}``) and ``\\fbox`` are all accepted.
"""

from __future__ import annotations

import re

from retool.checks import check_number
from retool.reward.arguments import check_text

TAIL_CHARS = 300
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _balanced(text: str, open_brace: int) -> str | None:
    depth = 0
    for i in range(open_brace, len(text)):
        char = text[i]
        if char == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            continue  # an escaped brace \{ or \} does not nest
        if char == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif char == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : i]
    return None


def extract_boxed(text: str, tail_chars: int = TAIL_CHARS) -> str | None:
    """The content of the last complete box in the last ``tail_chars`` characters
    (``0``: the whole text)."""
    check_text("extract_boxed text", text, "the model's final text")
    check_number("extract_boxed tail_chars", tail_chars, 0, integer=True)
    window = text[-tail_chars:] if tail_chars > 0 else text
    for match in reversed(list(_BOX_RE.finditer(window))):
        content = _balanced(window, match.end() - 1)
        if content is not None:
            return content.strip()
    return None
