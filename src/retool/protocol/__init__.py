"""Tool-call dialects: how a model writes a call and reads the observation.

``get_protocol(name)`` returns one of:

* ``qwen3_xml``   - ``<tool_call><function=code_interpreter><parameter=code>``
* ``hermes_json`` - ``<tool_call>{"name": ..., "arguments": {"code": ...}}</tool_call>``
* ``markdown``    - a fenced python block; works with any chat template
"""

from __future__ import annotations

from retool.errors import ConfigError
from retool.protocol.base import (
    TOOL_NAME,
    Message,
    ParsedAssistant,
    ParseKind,
    ToolDialect,
    tool_schema,
)
from retool.protocol.hermes_json import HermesJsonDialect
from retool.protocol.markdown import MarkdownDialect
from retool.protocol.qwen3_xml import Qwen3XmlDialect
from retool.protocol.sanitize import sanitize_observation

_DIALECTS: dict[str, type[ToolDialect]] = {
    "qwen3_xml": Qwen3XmlDialect,
    "hermes_json": HermesJsonDialect,
    "markdown": MarkdownDialect,
}
PROTOCOL_NAMES = tuple(_DIALECTS)


def get_protocol(name: str) -> ToolDialect:
    """The dialect called ``name``; raises :class:`ConfigError` for an unknown name."""
    try:
        return _DIALECTS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown protocol {name!r}; choose one of {', '.join(PROTOCOL_NAMES)}"
        ) from None


__all__ = [
    "PROTOCOL_NAMES",
    "TOOL_NAME",
    "Message",
    "ParseKind",
    "ParsedAssistant",
    "ToolDialect",
    "get_protocol",
    "sanitize_observation",
    "tool_schema",
]
