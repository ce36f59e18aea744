"""Token budgets: how much a turn may sample, and fitting an observation exactly.

Two budgets bound an observation: its content may not exceed
``max_tool_response_tokens`` and the next prompt ``P + C + delta`` must leave
at least one token of ``max_trajectory_tokens`` to sample. Both are measured
on the real token ids the next prompt will hold, not estimated from
characters.

When the content does not fit, :func:`fit_observation` keeps its head and its
tail around a visible marker (``[... N tokens cut ...]``): results usually sit
at the end of the output and tracebacks end with the error, while the head
shows what the code started printing. The number of kept tokens is found by
binary search over the token count, so it always terminates (the reference
shrank by characters and could loop forever at lengths 65/66), and only a
candidate that was measured to fit is ever returned.

The content is sanitized first (:func:`~retool.protocol.sanitize_observation`,
which the dialect applies anyway and which changes nothing when applied
twice), so the tokens counted and cut are those the model will read, and
printed output the tokenizer refuses (a lone surrogate) is escaped text
before it reaches the tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from retool.protocol import Message, ToolDialect, sanitize_observation
from retool.protocol.sanitize import tokenizer_special_strings

HEAD_SHARE = 1 / 3  # of the kept tokens, this share comes from the head


@dataclass(frozen=True)
class TurnPlan:
    """The generation budget of one assistant turn."""

    max_tokens: int  # new tokens the sampler may produce
    can_call: bool  # room was reserved so a tool call of this turn can be answered


@dataclass(frozen=True)
class FittedObservation:
    """An observation that fits, and the next prompt that carries it."""

    content: str  # what the model will read (possibly cut)
    next_prompt: list[int]  # P + C + delta
    content_tokens: int  # tokens of ``content`` encoded alone
    template_tokens: int  # the rest of delta: closing, wrapper, generation prefix
    truncated: bool  # the content was cut


def plan_turn(
    prompt_len: int,
    *,
    max_trajectory_tokens: int,
    max_assistant_tokens: int,
    call_possible: bool,
    reserve: int,
) -> TurnPlan | None:
    """How many tokens the next turn may sample; ``None`` when there is no room.

    ``reserve`` (tool wrapper plus a minimum observation) is held back when a
    tool call of this turn could be executed, so that the call can still be
    answered. When only the reserve is left the turn is sampled without it: it
    may still answer, but a tool call it makes will not run.
    """
    remaining = max_trajectory_tokens - prompt_len
    if remaining <= 0:
        return None
    if call_possible and remaining - reserve >= 1:
        return TurnPlan(min(max_assistant_tokens, remaining - reserve), can_call=True)
    return TurnPlan(min(max_assistant_tokens, remaining), can_call=False)


def wrapper_tokens(dialect: ToolDialect, tokenizer: Any, messages: Sequence[Message]) -> int:
    """Template tokens around an empty observation (no closing overlap assumed)."""
    message = dialect.tool_message("code-0-0-0", "")
    return len(dialect.continuation_delta(tokenizer, messages, [], message))


def cut_middle(tokenizer: Any, tokens: Sequence[int], keep: int) -> str:
    """The text of ``tokens`` with all but ``keep`` of them replaced by a marker."""
    if keep >= len(tokens):
        return tokenizer.decode(list(tokens))
    head = int(keep * HEAD_SHARE)
    tail = keep - head
    cut = len(tokens) - keep
    head_text = tokenizer.decode(list(tokens[:head])) if head else ""
    tail_text = tokenizer.decode(list(tokens[len(tokens) - tail :])) if tail else ""
    return f"{head_text}\n[... {cut} tokens cut ...]\n{tail_text}"


def fit_observation(
    dialect: ToolDialect,
    tokenizer: Any,
    messages_before_assistant: Sequence[Message],
    prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    call_id: str,
    content: str,
    *,
    max_content_tokens: int,
    max_prompt_tokens: int,
) -> FittedObservation | None:
    """``content`` (cut if needed) inside the next prompt, or ``None`` if nothing fits.

    The result satisfies ``content_tokens <= max_content_tokens`` and
    ``len(next_prompt) <= max_prompt_tokens``, both measured.
    """
    content = sanitize_observation(content, tokenizer_special_strings(tokenizer))
    base = len(prompt_tokens) + len(completion_tokens)
    content_ids = list(tokenizer.encode(content, add_special_tokens=False))

    def attempt(text: str) -> FittedObservation | None:
        n = len(tokenizer.encode(text, add_special_tokens=False))
        if n > max_content_tokens:
            return None
        delta = dialect.continuation_delta(
            tokenizer,
            messages_before_assistant,
            completion_tokens,
            dialect.tool_message(call_id, text),
        )
        if base + len(delta) > max_prompt_tokens:
            return None
        return FittedObservation(
            content=text,
            next_prompt=[*prompt_tokens, *completion_tokens, *delta],
            content_tokens=n,
            template_tokens=max(0, len(delta) - n),
            truncated=text != content,
        )

    whole = attempt(content)
    if whole is not None:
        return whole
    # Largest k whose cut fits; only measured fits are kept, so any answer is valid.
    best: FittedObservation | None = None
    low, high = 0, len(content_ids) - 1
    while low <= high:
        keep = (low + high) // 2
        fitted = attempt(cut_middle(tokenizer, content_ids, keep))
        if fitted is None:
            high = keep - 1
        else:
            best, low = fitted, keep + 1
    return best
