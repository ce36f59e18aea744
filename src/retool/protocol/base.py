"""What every tool-call dialect provides, and the token-exact continuation.

A dialect decides how the model writes a ``code_interpreter`` call and how the
observation comes back. The continuation is shared: after a tool call, the next
prompt is ``P + C + delta`` where ``P`` and ``C`` are the real prompt and the
sampler's real completion tokens, and ``delta`` is only what the chat template
adds around them (the assistant closing the sampler did not produce, the tool
wrapper with the observation, the next generation prefix).

``delta`` is found by rendering the conversation with a placeholder as the
assistant's content: everything after the placeholder is template structure.
Rendering the placeholder instead of the real text means the history is never
re-encoded, so the old logprobs stay attached to the tokens that were sampled.
If the template renders the earlier history differently once the tool message
is added (some templates rewrite or drop past turns), we raise instead of
training on tokens the sampler never saw.

The placeholder is a fresh random nonce per call (128 bits), drawn after the
messages exist and checked absent from every one of them: the history holds
model text (earlier assistant turns, observations its code printed), and a
fixed marker there would make the render look rewritten. The nonce never
reaches a prompt, so its randomness changes no token.

:meth:`ToolDialect.parse` classifies text, it never raises on it: anything a
model can write is an answer, a call or an invalid turn.
"""

from __future__ import annotations

import abc
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from retool.errors import ProtocolError
from retool.protocol.prompts import SYSTEM_RULES, TEXT_RULES, TOOL_DESCRIPTION
from retool.protocol.sanitize import sanitize_observation, tokenizer_special_strings

if TYPE_CHECKING:
    from retool.types import Tokenizer

Message = dict[str, Any]
TOOL_NAME = "code_interpreter"
# Turn terminators that many chat templates use; kept as stop tokens when present.
_TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


class ParseKind(StrEnum):
    """What one assistant turn turned out to be."""

    ANSWER = "answer"
    """No tool call: the turn is the final answer and ends the trajectory."""
    TOOL = "tool"
    """Exactly one complete tool call with non-empty code, and nothing after it."""
    INVALID = "invalid"
    """A partial, repeated or malformed call, or text after the call."""


@dataclass(frozen=True)
class ParsedAssistant:
    """One assistant turn, parsed."""

    kind: ParseKind  # answer | tool | invalid
    content: str  # the text before the call (whole text for an answer)
    code: str | None = None  # the code to run, for kind == tool
    error: str | None = None  # why it is invalid, for kind == invalid


def tool_schema() -> dict[str, Any]:
    """The OpenAI-style function schema of ``code_interpreter``."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {
                        "type": "string",
                        "description": "Python code to run; print the results.",
                    }
                },
                "required": ["code"],
            },
        },
    }


class ToolDialect(abc.ABC):
    """A way of writing tool calls and observations into a chat template."""

    name: str
    uses_template_tools: bool = True  # pass ``tools=`` to the template

    # -- what the model is told ------------------------------------------------
    @abc.abstractmethod
    def format_instructions(self) -> str:
        """How to write a call in this dialect, for templates that ignore ``tools=``."""

    def system_prompt(self, tokenizer: Tokenizer = None) -> str:
        """The rules, plus the call format when the template would not show it."""
        if (
            tokenizer is not None
            and self.uses_template_tools
            and self.template_shows_tools(tokenizer)
        ):
            return SYSTEM_RULES
        return f"{SYSTEM_RULES}\n\n{self.format_instructions()}"

    def tool_schema(self) -> dict[str, Any]:
        return tool_schema()

    def initial_messages(
        self, question: str, tokenizer: Tokenizer = None, tools: bool = True
    ) -> list[Message]:
        """System rules and the question; ``tools=False`` is the text-only baseline's prompt."""
        system = self.system_prompt(tokenizer) if tools else TEXT_RULES
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    # -- rendering -------------------------------------------------------------
    def _tools(self) -> list[dict[str, Any]] | None:
        return [self.tool_schema()] if self.uses_template_tools else None

    def render_text(
        self, tokenizer: Tokenizer, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> str:
        try:
            text = tokenizer.apply_chat_template(
                list(messages),
                tools=self._tools(),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception as exc:  # jinja raises TemplateError and friends
            raise ProtocolError(f"chat template failed to render ({self.name}): {exc}") from exc
        if not isinstance(text, str):
            raise ProtocolError("chat template did not return text")
        return text

    def render_prompt(self, tokenizer: Tokenizer, messages: Sequence[Message]) -> list[int]:
        """Token ids of ``messages`` followed by the assistant generation prefix."""
        return list(
            tokenizer.encode(self.render_text(tokenizer, messages), add_special_tokens=False)
        )

    def template_shows_tools(self, tokenizer: Tokenizer) -> bool:
        """Whether the chat template renders ``tools=`` at all (SmolLM2's does not)."""
        probe = [{"role": "user", "content": "x"}]
        try:
            with_tools = tokenizer.apply_chat_template(
                probe, tools=[self.tool_schema()], tokenize=False
            )
            without = tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception:
            return False
        return with_tools != without

    # -- parsing ---------------------------------------------------------------
    @abc.abstractmethod
    def parse(self, text: str) -> ParsedAssistant:
        """Classify one assistant turn as answer, tool call or invalid; never raises on
        any text (a call this dialect cannot read is ``INVALID``)."""

    @abc.abstractmethod
    def stop_strings(self) -> tuple[str, ...]:
        """Strings that end a tool call in this dialect."""

    def stop_sequences(self, tokenizer: Tokenizer) -> tuple[str | int, ...]:
        """EOS and turn-end token ids, plus the strings that end a tool call."""
        ids: list[int] = []
        eos = getattr(tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.append(eos)
        vocab = tokenizer.get_vocab()
        specials = set(tokenizer_special_strings(tokenizer))
        for token in _TURN_END_TOKENS:
            if token in specials and token in vocab and vocab[token] not in ids:
                ids.append(vocab[token])
        return (*ids, *self.stop_strings())

    # -- observations ----------------------------------------------------------
    @abc.abstractmethod
    def tool_message(self, call_id: str, content: str) -> Message:
        """The message that carries an observation back to the model."""

    def continuation(
        self,
        tokenizer: Tokenizer,
        messages_before_assistant: Sequence[Message],
        prompt_tokens: Sequence[int],
        completion_tokens: Sequence[int],
        tool_message: Mapping[str, Any],
    ) -> list[int]:
        """The next prompt: ``prompt_tokens + completion_tokens + delta``.

        ``delta`` holds the template's assistant closing (minus any closing tokens
        the sampler already produced), the tool wrapper with the sanitized
        observation, and the next generation prefix. Raises
        :class:`ProtocolError` if the template renders the history differently
        once the tool message is added.
        """
        delta = self.continuation_delta(
            tokenizer, messages_before_assistant, completion_tokens, tool_message
        )
        return [*prompt_tokens, *completion_tokens, *delta]

    def continuation_delta(
        self,
        tokenizer: Tokenizer,
        messages_before_assistant: Sequence[Message],
        completion_tokens: Sequence[int],
        tool_message: Mapping[str, Any],
    ) -> list[int]:
        """Only the template tokens that :meth:`continuation` appends."""
        specials = tokenizer_special_strings(tokenizer)
        message = dict(tool_message)
        message["content"] = sanitize_observation(str(message.get("content", "")), specials)
        before = list(messages_before_assistant)
        placeholder = _placeholder([*before, message])
        prompt_text = self.render_text(tokenizer, before, add_generation_prompt=True)
        full = self.render_text(
            tokenizer,
            [*before, {"role": "assistant", "content": placeholder}, message],
            add_generation_prompt=True,
        )
        if full.count(placeholder) != 1:
            raise ProtocolError(
                f"chat template ({self.name}) rewrites the conversation history: "
                "the assistant's content is not rendered verbatim once a tool "
                "message follows, so the sampled tokens cannot be continued"
            )
        head, _, tail = full.partition(placeholder)
        if head != prompt_text:
            raise ProtocolError(
                f"chat template ({self.name}) renders the earlier conversation differently "
                "once a tool message follows (the template rewrites past turns, or their "
                "text changes how it renders); the next prompt would not extend the "
                "sampled tokens"
            )
        delta = list(tokenizer.encode(tail, add_special_tokens=False))
        return delta[_closing_overlap(tokenizer, completion_tokens, delta) :]


def _placeholder(messages: Sequence[Mapping[str, Any]]) -> str:
    """A marker that no message holds: random, and checked against every field's text.

    ``repr`` keeps every run of letters and digits of every string as it is, so a
    message that contains the marker has a ``repr`` that contains it.
    """
    seen = repr(list(messages))
    while True:
        marker = f"RETOOL{secrets.token_hex(16)}"
        if marker not in seen:
            return marker


def _closing_overlap(tokenizer: Tokenizer, completion: Sequence[int], delta: Sequence[int]) -> int:
    """How many leading ``delta`` tokens the sampler already produced.

    Only special tokens count (``<|im_end|>`` emitted as the stop token): a
    completion that merely ends in a newline must not swallow the template's.
    """
    if not completion or not delta:
        return 0
    special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    special_ids.update(tokenizer.convert_tokens_to_ids(tokenizer_special_strings(tokenizer)))
    if completion[-1] not in special_ids:
        return 0
    for k in range(min(len(completion), len(delta)), 0, -1):
        if list(completion[-k:]) == list(delta[:k]):
            return k
    return 0
