"""``markdown``: a fenced Python block is the call; works with any chat template.

The model ends its turn with::

    ```python
    print(2**100)
    ```

and the observation comes back in a user turn as a fenced ``output`` block.
Nothing depends on the template understanding tools, so this is the dialect
for models such as SmolLM2 whose template ignores ``tools=``. Sampling stops
at the closing fence (the stop string "```" followed by a newline, which the
opening fence "```python" never contains) or at EOS.
"""

from __future__ import annotations

import re

from retool.protocol.base import Message, ParsedAssistant, ParseKind, ToolDialect

_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*(?P<lang>[A-Za-z0-9_+-]*)[ \t]*$", re.MULTILINE)
_BACKTICKS_RE = re.compile(r"`+")
_PYTHON = {"python", "py", "python3"}


class MarkdownDialect(ToolDialect):
    name = "markdown"
    uses_template_tools = False

    def format_instructions(self) -> str:
        return (
            "To run code, end your turn with one fenced Python block and nothing after it:\n"
            "```python\n# your Python code\n```\n"
            "The output comes back in the next message as an ```output block."
        )

    def system_prompt(self, tokenizer: object = None) -> str:
        return super().system_prompt(None)

    def parse(self, text: str) -> ParsedAssistant:
        fences = list(_FENCE_RE.finditer(text))
        # Pair fences in order: opening (with or without a language), closing (bare).
        blocks: list[tuple[re.Match[str], re.Match[str] | None]] = []
        i = 0
        while i < len(fences):
            opening = fences[i]
            closing = fences[i + 1] if i + 1 < len(fences) else None
            if closing is not None and closing.group("lang"):
                closing = None  # a fence with a language cannot close a block
                i += 1
            else:
                i += 2
            blocks.append((opening, closing))
        python = [
            (o, c)
            for o, c in blocks
            if o.group("lang").lower() in _PYTHON or (not o.group("lang") and c is None)
        ]
        if not python:
            return ParsedAssistant(ParseKind.ANSWER, text.strip())
        opening, closing = python[-1]
        content = text[: python[0][0].start()].strip()
        if len(python) > 1:
            return ParsedAssistant(
                ParseKind.INVALID, text.strip(), error=f"{len(python)} python blocks in one turn"
            )
        if closing is None:
            return ParsedAssistant(ParseKind.INVALID, text.strip(), error="unclosed python block")
        if text[closing.end() :].strip():
            return ParsedAssistant(
                ParseKind.INVALID, text.strip(), error="text after the python block"
            )
        code = text[opening.end() + 1 : closing.start()]
        if not code.strip():
            return ParsedAssistant(ParseKind.INVALID, text.strip(), error="empty code")
        return ParsedAssistant(ParseKind.TOOL, content, code=code.rstrip("\n"))

    def stop_strings(self) -> tuple[str, ...]:
        return ("```\n",)

    def tool_message(self, call_id: str, content: str) -> Message:
        """The observation in a fence that printed text cannot close.

        CommonMark closes a fence only with a run of backticks at least as long
        as the opening one, so the fence is one backtick longer than the longest
        run in the content (three at least).
        """
        del call_id  # a plain user turn has nowhere to carry it
        body = content.rstrip()
        longest = max((len(run) for run in _BACKTICKS_RE.findall(body)), default=0)
        fence = "`" * max(3, longest + 1)
        return {"role": "user", "content": f"{fence}output\n{body}\n{fence}"}
