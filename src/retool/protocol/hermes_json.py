"""``hermes_json``: the Hermes JSON call format (Qwen2.5 / Qwen3).

<tool_call>
{"name": "code_interpreter", "arguments": {"code": "print(2**100)"}}
</tool_call>

The body is model text, so reading it as JSON must not raise: besides
malformed JSON, ``json.loads`` raises ``RecursionError`` on deep nesting (a
thousand ``[``) and ``ValueError`` on an integer longer than Python converts
(``sys.get_int_max_str_digits``); both make the call ``INVALID``.
"""

from __future__ import annotations

import json
import re

from retool.protocol.base import TOOL_NAME, Message, ParsedAssistant, ParseKind, ToolDialect
from retool.protocol.qwen3_xml import parse_tagged_calls

_CALL_RE = re.compile(r"<tool_call>\s*(?P<body>\{.*\})\s*</tool_call>", re.DOTALL)


def _read_json(text: str) -> tuple[object, str | None]:
    """``(value, None)``, or ``(None, why)`` for any text JSON cannot read."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc.msg}"
    except RecursionError:
        return None, "invalid JSON: nested too deeply"
    except ValueError as exc:  # an integer longer than Python converts
        return None, f"invalid JSON: {str(exc)[:80]}"


class HermesJsonDialect(ToolDialect):
    name = "hermes_json"

    def format_instructions(self) -> str:
        return (
            "To run code, end your turn with exactly this block (the code as a JSON string):\n"
            '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1 + 1)"}}\n'
            "</tool_call>"
        )

    def parse(self, text: str) -> ParsedAssistant:
        content, match, error = parse_tagged_calls(text, _CALL_RE)
        if error:
            return ParsedAssistant(ParseKind.INVALID, content, error=error)
        if match is None:
            return ParsedAssistant(ParseKind.ANSWER, content)
        call, error = _read_json(match.group("body"))
        if error is not None:
            return ParsedAssistant(ParseKind.INVALID, content, error=error)
        if not isinstance(call, dict) or call.get("name") != TOOL_NAME:
            return ParsedAssistant(ParseKind.INVALID, content, error="unknown tool name")
        arguments = call.get("arguments")
        if isinstance(arguments, str):  # some models double-encode the arguments
            arguments, _ = _read_json(arguments)
        code = arguments.get("code") if isinstance(arguments, dict) else None
        if not isinstance(code, str) or not code.strip():
            return ParsedAssistant(ParseKind.INVALID, content, error="missing or empty 'code'")
        return ParsedAssistant(ParseKind.TOOL, content, code=code)

    def stop_strings(self) -> tuple[str, ...]:
        return ("</tool_call>",)

    def tool_message(self, call_id: str, content: str) -> Message:
        return {"role": "tool", "tool_call_id": call_id, "name": TOOL_NAME, "content": content}
