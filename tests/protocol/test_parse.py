import pytest

from retool.errors import ConfigError
from retool.protocol import ParseKind, get_protocol

XML_CALL = (
    "<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint(2**10)\n"
    "</parameter>\n</function>\n</tool_call>"
)
HERMES_CALL = (
    '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(2**10)"}}\n</tool_call>'
)
MD_CALL = "```python\nprint(2**10)\n```\n"
CALLS = {"qwen3_xml": XML_CALL, "hermes_json": HERMES_CALL, "markdown": MD_CALL}


@pytest.mark.parametrize("name", list(CALLS))
def test_one_complete_call_is_a_tool(name):
    parsed = get_protocol(name).parse("Let me compute.\n" + CALLS[name])
    assert parsed.kind == ParseKind.TOOL
    assert parsed.code == "print(2**10)"
    assert parsed.content == "Let me compute."


@pytest.mark.parametrize("name", list(CALLS))
def test_no_call_is_an_answer(name):
    parsed = get_protocol(name).parse("It is 1024.\n\\boxed{1024}")
    assert parsed.kind == ParseKind.ANSWER and parsed.code is None


@pytest.mark.parametrize("name", list(CALLS))
def test_repeated_call_is_invalid(name):
    parsed = get_protocol(name).parse(CALLS[name] + "\n" + CALLS[name])
    assert parsed.kind == ParseKind.INVALID


@pytest.mark.parametrize("name", list(CALLS))
def test_partial_call_is_invalid(name):
    call = CALLS[name]
    parsed = get_protocol(name).parse(call[: len(call) // 2])
    assert parsed.kind == ParseKind.INVALID


@pytest.mark.parametrize("name", list(CALLS))
def test_text_after_call_is_invalid(name):
    parsed = get_protocol(name).parse(CALLS[name] + "\nSo the answer is \\boxed{1024}")
    assert parsed.kind == ParseKind.INVALID


def test_empty_code_and_wrong_names_are_invalid():
    assert get_protocol("markdown").parse("```python\n\n```").kind == ParseKind.INVALID
    bad_name = HERMES_CALL.replace("code_interpreter", "web_search")
    assert get_protocol("hermes_json").parse(bad_name).kind == ParseKind.INVALID
    bad_json = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": }\n</tool_call>'
    assert get_protocol("hermes_json").parse(bad_json).kind == ParseKind.INVALID
    bad_fn = XML_CALL.replace("function=code_interpreter", "function=shell")
    assert get_protocol("qwen3_xml").parse(bad_fn).kind == ParseKind.INVALID


def test_hermes_accepts_string_encoded_arguments():
    text = (
        '<tool_call>\n{"name": "code_interpreter", "arguments": '
        '"{\\"code\\": \\"print(1)\\"}"}\n</tool_call>'
    )
    parsed = get_protocol("hermes_json").parse(text)
    assert parsed.kind == ParseKind.TOOL and parsed.code == "print(1)"


def test_markdown_ignores_non_python_fences():
    text = "Here is a table:\n```text\na b\n```\nAnswer \\boxed{3}"
    assert get_protocol("markdown").parse(text).kind == ParseKind.ANSWER
    text = "```text\nnote\n```\nnow code:\n```python\nprint(1)\n```"
    parsed = get_protocol("markdown").parse(text)
    assert parsed.kind == ParseKind.TOOL and parsed.code == "print(1)"


def test_unknown_protocol():
    with pytest.raises(ConfigError, match="unknown protocol 'json'"):
        get_protocol("json")


def _hermes(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


DEEP = "[" * 1200  # unclosed: past the JSON reader's recursion limit before any mismatch
LONG_INT = "1" * 5000  # past Python's int conversion limit (4300 digits)
HOSTILE_JSON = {
    "nested arguments": _hermes('{"name": "code_interpreter", "arguments": ' + DEEP + "}"),
    "nested code": _hermes('{"name": "code_interpreter", "arguments": {"code": ' + DEEP + "}}"),
    "nested, closed": _hermes('{"a": ' + "[" * 5000 + "]" * 5000 + "}"),
    "long int name": _hermes('{"name": ' + LONG_INT + "}"),
    "long int code": _hermes(
        '{"name": "code_interpreter", "arguments": {"code": ' + LONG_INT + "}}"
    ),
    "double-encoded nesting": _hermes(
        '{"name": "code_interpreter", "arguments": "' + "[" * 3000 + '"}'
    ),
    "double-encoded long int": _hermes(
        '{"name": "code_interpreter", "arguments": "{\\"code\\": ' + LONG_INT + '}"}'
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_JSON))
def test_json_the_reader_cannot_hold_is_an_invalid_call(case):
    parsed = get_protocol("hermes_json").parse(HOSTILE_JSON[case])
    assert parsed.kind == ParseKind.INVALID and parsed.error


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("text", [*HOSTILE_JSON.values(), "\ud800", "\x00" * 3, "`" * 10_000])
def test_no_dialect_raises_on_any_text(name, text):
    """Whatever the dialect, hostile text is classified, never raised on."""
    for turn in (text, f"Let me compute.\n{text}", f"{text}\n{CALLS[name]}"):
        assert get_protocol(name).parse(turn).kind in set(ParseKind)
