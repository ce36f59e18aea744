"""``qwen3_xml``: the Qwen3-Coder / Qwen3.5 XML call format (the reference's).

<tool_call>
<function=code_interpreter>
<parameter=code>
print(2**100)
</parameter>
</function>
</tool_call>
"""

from __future__ import annotations

import re

from retool.protocol.base import TOOL_NAME, Message, ParsedAssistant, ParseKind, ToolDialect

_CALL_RE = re.compile(
    r"<tool_call>\s*<function=(?P<name>[^>\s]+)>\s*<parameter=(?P<param>[^>\s]+)>\n?"
    r"(?P<code>.*?)\n?</parameter>\s*</function>\s*</tool_call>",
    re.DOTALL,
)


def parse_tagged_calls(
    text: str, call_re: re.Pattern[str]
) -> tuple[str, re.Match[str] | None, str | None]:
    """Shared structure check of ``<tool_call>`` dialects: (content, match, error)."""
    opens, closes = text.count("<tool_call>"), text.count("</tool_call>")
    if opens == 0 and closes == 0:
        return text.strip(), None, None
    if opens != 1 or closes != 1:
        return (
            text.strip(),
            None,
            f"expected one complete <tool_call>, found {opens} open/{closes} close tags",
        )
    match = call_re.search(text)
    if match is None:
        return text.strip(), None, "malformed <tool_call> block"
    if text[match.end() :].strip():
        return text.strip(), None, "text after the tool call"
    return text[: match.start()].strip(), match, None


class Qwen3XmlDialect(ToolDialect):
    name = "qwen3_xml"

    def format_instructions(self) -> str:
        return (
            "To run code, end your turn with exactly this block:\n"
            "<tool_call>\n<function=code_interpreter>\n<parameter=code>\n"
            "# your Python code\n</parameter>\n</function>\n</tool_call>"
        )

    def parse(self, text: str) -> ParsedAssistant:
        content, match, error = parse_tagged_calls(text, _CALL_RE)
        if error:
            return ParsedAssistant(ParseKind.INVALID, content, error=error)
        if match is None:
            return ParsedAssistant(ParseKind.ANSWER, content)
        if match.group("name") != TOOL_NAME or match.group("param") != "code":
            return ParsedAssistant(
                ParseKind.INVALID,
                content,
                error=f"unknown function or parameter in {match.group(0)[:80]!r}",
            )
        code = match.group("code")
        if not code.strip():
            return ParsedAssistant(ParseKind.INVALID, content, error="empty code")
        return ParsedAssistant(ParseKind.TOOL, content, code=code)

    def stop_strings(self) -> tuple[str, ...]:
        return ("</tool_call>",)

    def tool_message(self, call_id: str, content: str) -> Message:
        return {"role": "tool", "tool_call_id": call_id, "name": TOOL_NAME, "content": content}
