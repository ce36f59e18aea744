"""Cold-start SFT data: code-interlaced conversations, rendered exactly as RL samples them.

ReTool's cold start teaches the model the *shape* of a tool-using answer before
RL: a little reasoning, one code call, the interpreter's real output, a final
``\\boxed{}`` answer. What the model learns to write must be exactly what the
rollout will later ask it to produce, token for token, or SFT teaches a layout
the sampler never sees. So conversations are stored dialect-neutral and
rendered through the same calls a rollout makes (:meth:`ToolDialect.render_prompt`,
:meth:`ToolDialect.continuation`), never through one whole-conversation
``apply_chat_template`` (which re-encodes the history and may differ at the
turn boundaries).

File format (JSONL, UTF-8, one conversation per line; blank lines are ignored)::

    {"id": "demo-train-0000",
     "messages": [
       {"role": "user", "content": "What is 123 \\\\times 456? Give the exact integer."},
       {"role": "assistant", "content": "Let me compute this with Python.",
        "code": "print(123 * 456)"},
       {"role": "tool", "content": "56088\\n"},
       {"role": "assistant", "content": "The interpreter printed 56088.\\n\\\\boxed{56088}"}]}

* ``id``: a non-empty string, unique in the file.
* ``messages``: one ``user`` message (the question), then any number of
  ``assistant`` messages with ``code`` each followed by exactly one ``tool``
  message (the observation), then one final ``assistant`` message without
  ``code`` (the answer). This is the only shape a rollout produces: a turn
  without a call ends the trajectory, a turn with one is always answered.
* ``content`` is a string everywhere; ``code`` (assistant only) a non-empty
  string. ``train`` (assistant messages with ``code`` only, default ``true``):
  ``false`` keeps the call in the context but gives its tokens weight 0, for a
  call the model should see answered but not learn to write (a demonstration's
  failed first attempt). No other keys are accepted, so a typo or an
  OpenAI-style ``tool_calls`` field fails loudly instead of being ignored.
* No ``system`` message: the system prompt (rules plus, where the template
  does not show tools, the call format) comes from the dialect at render
  time, as in RL. Storing it would tie the file to one dialect.

Why ``code`` is a field and not text: the call is written at render time in
the dialect's own syntax (a fenced block for ``markdown``, ``<tool_call>`` for
``hermes_json`` / ``qwen3_xml``), so one file serves every dialect. The written
call is parsed back with the dialect's parser and must give the same code, so
a conversation that a dialect cannot express (e.g. code containing a fence
line under ``markdown``) is a :class:`DataError`, not a silently different
example.

Rendering (:func:`render_conversation`) follows the rollout step by step::

    P1 = render_prompt(initial_messages(question))
    C1 = encode(reasoning + call)             # the sampler stops at the call's end
    P2 = continuation(messages, P1, C1, tool_message(call_id, output))
       = P1 + C1 + D1                         # D1: template closing, observation, prefix
    ...
    Cn = encode(answer) + [end-of-turn]       # the sampler emits the end token

Weights are 1 on every ``Ci`` token (the end-of-turn token included: the model
must learn to stop), except a call marked ``"train": false``, and 0 on prompts,
template structure and observations.
:func:`build_sft_datum` shifts tokens and weights together, once, into a
``cross_entropy`` datum (``target_tokens`` and ``weights``).

Demonstrations (:func:`make_demonstrations`) are built from the demo dataset's
reference solutions with the *real* sandbox output as the observation (never
the known answer pasted in), with varied phrasing drawn from a seeded RNG per
problem so the model does not memorise one sentence; problems whose sandbox
output does not match the reference answer are skipped.

A share of them (``failure_share``, 1 in 4 by default) shows a failure mode
that RL policies were seen to fall into, and its repair: the first call is
the problem's plausible wrong attempt (``DemoProblem.first_try``: a missing
import, a function that does not exist, ``sum`` over characters, ``int`` of
an unquoted numeral), the observation is that attempt's real traceback, and
the second call, after one sentence naming the mistake, is the reference
solution. Without these, a cold-started policy has only ever seen calls
that succeed, and meets its own first traceback during RL with nothing to
imitate. Where the wrong attempt does not actually fail (``math.pow`` does
not overflow for a small power), the problem gets the plain demonstration.
The demonstrations come from whichever split they are given; ``retool sft
make-demos`` gives them ``demo:train`` (or ``demo:dev``), never a held-out one.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from retool.atomic import write_atomic
from retool.data.demo import DemoProblem
from retool.data.examples import refuse_surrogates
from retool.data.longints import json_loads
from retool.errors import DataError, RetoolError
from retool.protocol import TOOL_NAME, ParseKind, ToolDialect
from retool.sandbox import format_tool_content
from retool.sandbox.result import ExecResult
from retool.training.datum import DatumError, TrainingDatum
from retool.types import Datum, ModelInput, TensorData

__all__ = [
    "Conversation",
    "build_sft_datum",
    "check_conversations",
    "end_of_turn_token",
    "load_conversations",
    "make_demonstrations",
    "numbered_conversations",
    "render_conversation",
    "write_call_text",
    "write_conversations",
]

ROLES = ("user", "assistant", "tool")
_MESSAGE_KEYS = {"user": {"role", "content"}, "tool": {"role", "content"}}
_MESSAGE_KEYS["assistant"] = {"role", "content", "code", "train"}
_RECORD_KEYS = ("id", "messages")


@dataclass(frozen=True)
class Conversation:
    """One SFT example: a question, code calls with their outputs, a final answer.

    The structure is checked on construction (see the module docstring), so
    every ``Conversation`` can be rendered; a violation raises
    :class:`DataError` whose message starts with the offending field.
    """

    id: str
    messages: tuple[dict[str, Any], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise DataError(f"id: must be a non-empty string, got {self.id!r}")
        object.__setattr__(self, "messages", tuple(dict(m) for m in self.messages))
        _check_messages(self.messages)

    @property
    def question(self) -> str:
        """The user message that opens the conversation."""
        return str(self.messages[0]["content"])

    @property
    def code_calls(self) -> int:
        """Assistant turns that call the tool."""
        return sum(1 for m in self.messages if "code" in m)

    def to_record(self) -> dict[str, Any]:
        """The JSON object of one line of the file."""
        return {"id": self.id, "messages": [dict(m) for m in self.messages]}

    @classmethod
    def from_record(cls, record: Any) -> Conversation:
        """A conversation from one decoded line; :class:`DataError` names the field."""
        if not isinstance(record, dict):
            raise DataError(f"expected a JSON object, got {type(record).__name__}")
        unknown = [k for k in record if k not in _RECORD_KEYS]
        if unknown:
            raise DataError(f"{unknown[0]}: unknown field (expected only id and messages)")
        if "id" not in record:
            raise DataError("id: missing")
        if "messages" not in record:
            raise DataError("messages: missing")
        messages = record["messages"]
        if not isinstance(messages, list):
            raise DataError(f"messages: must be a list, got {type(messages).__name__}")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise DataError(f"messages[{i}]: must be an object, got {type(message).__name__}")
        return cls(id=record["id"], messages=tuple(messages))


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """Raise :class:`DataError` (``field: what``) unless ``messages`` has the rollout shape."""
    if not messages:
        raise DataError("messages: empty (expected a user message and a final answer)")
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        role = message.get("role")
        if "role" not in message:
            raise DataError(f"{field}.role: missing")
        if role == "system":
            raise DataError(
                f"{field}.role: 'system' is not stored; the system prompt comes from the "
                "tool-call dialect at render time, as in RL"
            )
        if role not in ROLES:
            raise DataError(f"{field}.role: must be one of {', '.join(ROLES)}, got {role!r}")
        unknown = sorted(set(message) - _MESSAGE_KEYS[role])
        if unknown:
            allowed = ", ".join(sorted(_MESSAGE_KEYS[role]))
            raise DataError(f"{field}.{unknown[0]}: unknown field for {role} ({allowed})")
        if "content" not in message:
            raise DataError(f"{field}.content: missing")
        if not isinstance(message["content"], str):
            kind = type(message["content"]).__name__
            raise DataError(f"{field}.content: must be a string, got {kind}")
        refuse_surrogates(message["content"], field, "content")  # no tokenizer encodes it
        if "code" in message:
            code = message["code"]
            if not isinstance(code, str):
                raise DataError(f"{field}.code: must be a string, got {type(code).__name__}")
            if not code.strip():
                raise DataError(f"{field}.code: empty")
            refuse_surrogates(code, field, "code")
        if "train" in message:
            if not isinstance(message["train"], bool):
                kind = type(message["train"]).__name__
                raise DataError(f"{field}.train: must be true or false, got {kind}")
            if "code" not in message and not message["train"]:
                raise DataError(
                    f"{field}.train: the final answer is always trained on (false is for "
                    "a call shown as context, e.g. a failed first attempt)"
                )

        if i == 0:
            if role != "user":
                raise DataError(f"{field}.role: the first message must be 'user', got {role!r}")
            if not message["content"].strip():
                raise DataError(f"{field}.content: the question is empty")
            continue
        previous = messages[i - 1]
        if role == "user":
            raise DataError(
                f"{field}.role: 'user' only opens the conversation (the question); "
                "observations use role 'tool'"
            )
        if role == "tool":
            if previous.get("role") != "assistant" or "code" not in previous:
                raise DataError(
                    f"{field}.role: a tool message must follow an assistant message with code"
                )
            continue
        # assistant
        if previous.get("role") == "assistant":
            raise DataError(
                f"{field}.role: two assistant messages in a row; an assistant message "
                "without code ends the conversation, one with code is answered by a tool message"
            )
        if "code" in message:
            following = messages[i + 1] if i + 1 < len(messages) else None
            if following is None or following.get("role") != "tool":
                raise DataError(f"{field}.code: the call is not followed by a tool message")
        elif i != len(messages) - 1:
            raise DataError(
                f"{field}.code: missing; an assistant message without code is the final "
                f"answer, but {len(messages) - 1 - i} message(s) follow it"
            )
        elif not message["content"].strip():
            raise DataError(f"{field}.content: the final answer is empty")
    last = messages[-1]
    if last.get("role") != "assistant" or "code" in last:
        raise DataError(
            f"messages: no final assistant message (the last is {last.get('role')!r}"
            + (" with code" if "code" in last else "")
            + "); end with the answer"
        )


# -- the file -------------------------------------------------------------------


def load_conversations(path: str | os.PathLike[str]) -> list[Conversation]:
    """Every conversation of a JSONL file, in file order.

    Raises :class:`DataError` naming ``path:line`` and the field for every
    defect: unreadable file or directory, a line that is not UTF-8 or not
    JSON, a conversation of the wrong shape, a duplicate id, no conversation.
    """
    return [conversation for _, conversation in numbered_conversations(path)]


def numbered_conversations(path: str | os.PathLike[str]) -> list[tuple[int, Conversation]]:
    """:func:`load_conversations` with each conversation's line number (1-based), for
    errors found later that must still name ``path:line``
    (:func:`check_conversations`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a .jsonl file") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    conversations: list[tuple[int, Conversation]] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(raw.split(b"\n"), start=1):
        where = f"{path}:{number}"
        try:
            text = line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{where}: not UTF-8 (byte 0x{line[exc.start]:02x} at column {exc.start + 1})"
            ) from None
        if not text.strip():
            continue
        try:
            record = json_loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        try:
            conversation = Conversation.from_record(record)
        except DataError as exc:
            raise DataError(f"{where}: {exc}") from None
        if conversation.id in first_line:
            raise DataError(
                f"{where}: id: duplicate {conversation.id!r} "
                f"(first on line {first_line[conversation.id]})"
            )
        first_line[conversation.id] = number
        conversations.append((number, conversation))
    if not conversations:
        raise DataError(f"{path}: no conversations (the file is empty)")
    return conversations


def write_conversations(path: str | os.PathLike[str], conversations: Iterable[Conversation]) -> int:
    """Write ``conversations`` as JSONL atomically (:func:`retool.atomic.write_atomic`).

    Returns how many were written. A reader sees the old file or the whole new
    one, never a prefix. Duplicate ids raise :class:`DataError` (the file would
    not load); an OS failure raises :class:`RetoolError` naming the path and
    leaves nothing behind.
    """
    path = Path(path)
    seen: set[str] = set()
    lines: list[str] = []
    for conversation in conversations:
        if conversation.id in seen:
            raise DataError(f"{path}: duplicate conversation id {conversation.id!r}")
        seen.add(conversation.id)
        lines.append(json.dumps(conversation.to_record(), ensure_ascii=False) + "\n")
    try:
        write_atomic(path, "".join(lines).encode("utf-8"))
    except OSError as exc:
        raise RetoolError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return len(lines)


# -- demonstrations -------------------------------------------------------------


class _Runs(Protocol):
    def run(self, code: str) -> ExecResult: ...


CALL_LEADS = (
    "Let me compute this with Python.",
    "I'll check this with a quick calculation.",
    "This is easiest to get exactly with a short program.",
    "Doing this by hand is error-prone, so I'll run some code.",
    "I'll let the interpreter do the arithmetic.",
    "A few lines of Python will give the exact value.",
    "Let me write a small script for this.",
    "I'll compute the exact number in Python.",
)
ANSWER_READS = (
    "The interpreter printed {x}.",
    "The code returned {x}.",
    "The output is {x}.",
    "Python gives {x}.",
    "The computation yields {x}.",
    "So the exact value is {x}.",
)
ANSWER_ENDS = (
    "The answer is \\boxed{{{x}}}",
    "Therefore the answer is \\boxed{{{x}}}",
    "Final answer: \\boxed{{{x}}}",
    "\\boxed{{{x}}}",
)


REPAIR_LEADS = (
    "That raised an error.",
    "The code failed.",
    "That did not work.",
    "The interpreter reports an error.",
)
FAILURE_SHARE = 0.25  # demonstrations that show a failed first call and its repair
TRAIN_FAILED_CALLS = True  # whether SFT learns to write the failed call, or only sees it


def _final_answer(rng: random.Random, answer: str) -> str:
    """One of the phrasings, always ending in ``\\boxed{answer}``."""
    read, end = rng.choice(ANSWER_READS), rng.choice(ANSWER_ENDS)
    return f"{read}\n{end}".format(x=answer)


def make_demonstrations(
    problems: Sequence[DemoProblem],
    sandbox: _Runs,
    seed: int = 0,
    failure_share: float = FAILURE_SHARE,
    train_failed_calls: bool = TRAIN_FAILED_CALLS,
) -> list[Conversation]:
    """One conversation per problem whose reference solution really prints its answer.

    The observation is the sandbox's real output (``format_tool_content``),
    the final answer boxes that output. Phrasing, and whether the
    conversation opens with the problem's failing first try (with
    probability ``failure_share``, see the module docstring), come from an
    RNG seeded by ``seed`` and the problem id, so a problem gets the same
    text whatever subset it is generated in. Problems whose execution fails
    or prints something other than the answer are skipped (``len(problems) -
    len(result)`` of them; their ids are the ones missing from the result).
    Executions run concurrently, up to ``sandbox.max_workers``. With
    ``train_failed_calls=False`` the failed first call is marked ``"train":
    false``: the model sees it answered by its traceback and learns to write
    only the repair and the answer (the text is the same either way).
    """
    if not 0.0 <= failure_share <= 1.0:
        raise DataError(f"failure_share must be in [0, 1], got {failure_share!r}")
    plans = []
    for problem in problems:
        rng = random.Random(f"retool-sft:{seed}:{problem.id}")
        fails = rng.random() < failure_share
        plans.append((problem, rng, fails))
    codes = [p.solution for p in problems]
    codes += [p.first_try for p, _, fails in plans if fails]
    workers = max(1, min(int(getattr(sandbox, "max_workers", 1)), len(codes) or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="demos") as pool:
        results = list(pool.map(sandbox.run, codes))
    tried = iter(results[len(problems) :])
    conversations: list[Conversation] = []
    for (problem, rng, fails), result in zip(plans, results[: len(problems)], strict=True):
        first = next(tried) if fails else None
        output = format_tool_content(result)
        answer = output.strip()
        if not result.ok or answer != str(problem.answer).strip():
            continue
        lead = rng.choice(CALL_LEADS)
        messages: list[dict[str, Any]] = [{"role": "user", "content": problem.question}]
        if first is not None and not first.ok:
            repair = f"{rng.choice(REPAIR_LEADS)} {problem.repair}"
            messages += [
                {"role": "assistant", "content": lead, "code": problem.first_try}
                | ({} if train_failed_calls else {"train": False}),
                {"role": "tool", "content": format_tool_content(first)},
                {"role": "assistant", "content": repair, "code": problem.solution},
            ]
        else:
            messages.append({"role": "assistant", "content": lead, "code": problem.solution})
        messages += [
            {"role": "tool", "content": output},
            {"role": "assistant", "content": _final_answer(rng, answer)},
        ]
        conversations.append(Conversation(id=problem.id, messages=tuple(messages)))
    return conversations


# -- rendering ------------------------------------------------------------------


def write_call_text(dialect: ToolDialect, content: str, code: str) -> str:
    """The assistant text ``content`` followed by a call of ``code`` in ``dialect``.

    Ends where the sampler stops: after the markdown closing fence and its
    newline (the stop string), after ``</tool_call>`` for the tagged dialects.
    """
    code = code.rstrip("\n")
    lead = f"{content.strip()}\n" if content.strip() else ""
    if dialect.name == "markdown":
        return f"{lead}```python\n{code}\n```\n"
    if dialect.name == "hermes_json":
        payload = json.dumps({"name": TOOL_NAME, "arguments": {"code": code}})
        return f"{lead}<tool_call>\n{payload}\n</tool_call>"
    if dialect.name == "qwen3_xml":
        return (
            f"{lead}<tool_call>\n<function={TOOL_NAME}>\n<parameter=code>\n{code}\n"
            "</parameter>\n</function>\n</tool_call>"
        )
    raise DataError(f"no SFT call writer for tool-call dialect {dialect.name!r}")


def end_of_turn_token(dialect: ToolDialect, tokenizer: Any) -> int:
    """The token the sampler emits to end an answer.

    The chat template's assistant closing (``<|im_end|>`` for ChatML) when it
    is one of the sampler's stop tokens, else ``tokenizer.eos_token_id``.
    """
    stop_ids = [s for s in dialect.stop_sequences(tokenizer) if isinstance(s, int)]
    marker = "RETOOLENDPROBE"
    try:
        text = dialect.render_text(
            tokenizer,
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}],
            add_generation_prompt=False,
        )
        closing = tokenizer.encode(text.partition(marker)[2], add_special_tokens=False)
    except Exception:  # a template that cannot render this probe: fall back to EOS
        closing = []
    if closing and closing[0] in stop_ids:
        return int(closing[0])
    eos = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(eos, int):
        raise DataError("the tokenizer has no end-of-turn token to end an answer with")
    return eos


def render_conversation(
    conversation: Conversation, dialect: ToolDialect, tokenizer: Any
) -> tuple[list[int], list[float]]:
    """Tokens and per-token weights of ``conversation``, built as a rollout builds them.

    The tokens are the rollout's prefix chain ``P1 + C1 + D1 + C2 + ...``:
    after every call turn they equal the next prompt the rollout would sample
    from. Weight 1 on completion tokens ``Ci`` (the final end-of-turn token
    included), 0 elsewhere. Raises :class:`DataError` naming the conversation
    when a call or the answer does not parse back as intended in ``dialect``.
    """
    label = f"conversation {conversation.id!r}"
    messages = dialect.initial_messages(conversation.question, tokenizer)
    prompt = dialect.render_prompt(tokenizer, messages)
    tokens = list(prompt)
    weights = [0.0] * len(prompt)
    calls = 0
    body = conversation.messages
    for i, message in enumerate(body):
        if message["role"] != "assistant":
            continue
        field = f"{label}, messages[{i}]"
        if "code" not in message:  # the final answer: ends with the end-of-turn token
            parsed = dialect.parse(message["content"])
            if parsed.kind != ParseKind.ANSWER:
                raise DataError(
                    f"{field}: the answer would be read as a {parsed.kind} turn in the "
                    f"{dialect.name} dialect ({parsed.error or 'it contains a call'})"
                )
            completion = tokenizer.encode(message["content"], add_special_tokens=False)
            completion = [*completion, end_of_turn_token(dialect, tokenizer)]
            tokens.extend(completion)
            weights.extend([1.0] * len(completion))
            break
        text = write_call_text(dialect, message["content"], message["code"])
        parsed = dialect.parse(text)
        if (
            parsed.kind != ParseKind.TOOL
            or parsed.code is None
            or parsed.code.rstrip("\n") != message["code"].rstrip("\n")
        ):
            why = parsed.error or f"it parses as {parsed.kind} with other code"
            raise DataError(f"{field}.code: cannot be written as one {dialect.name} call ({why})")
        completion = list(tokenizer.encode(text, add_special_tokens=False))
        weight = 1.0 if message.get("train", True) else 0.0
        calls += 1
        tool = dialect.tool_message(f"code-0-0-{calls}", body[i + 1]["content"])
        next_prompt = dialect.continuation(tokenizer, messages, prompt, completion, tool)
        delta = next_prompt[len(prompt) + len(completion) :]
        tokens.extend(completion)
        weights.extend([weight] * len(completion))
        tokens.extend(delta)
        weights.extend([0.0] * len(delta))
        # As the rollout: the assistant message holds the decoded sampled text.
        said = tokenizer.decode(completion, skip_special_tokens=True)
        messages = [*messages, {"role": "assistant", "content": said}, tool]
        prompt = next_prompt
    return tokens, weights


def check_conversations(
    path: str | os.PathLike[str],
    numbered: Sequence[tuple[int, Conversation]],
    dialect: ToolDialect,
    tokenizer: Any,
    max_context_tokens: int,
    limit_name: str = "train.max_train_tokens",
) -> None:
    """Render every conversation of ``path`` once, before the first step trains.

    The file's shape is checked when it loads, but whether a conversation
    *renders* in the run's dialect and *fits* ``max_context_tokens`` depends
    on the tokenizer, which only the trainer brings. Checked per step, a bad
    line stopped the run at the step that drew it, after earlier steps were
    committed, and the repaired file then no longer matched the run's record
    (``--resume`` refused it): a dead end. So every conversation is rendered
    here, first (a few ms each), and the first one that fails is one
    :class:`DataError` naming ``path:line`` and the conversation (``limit_name``
    is the setting the limit came from).
    """
    for line, conversation in numbered:
        where = f"{path}:{line}"
        try:
            tokens, _ = render_conversation(conversation, dialect, tokenizer)
        except RetoolError as exc:
            raise DataError(f"{where}: {exc}") from None
        num_tokens = len(tokens) - 1  # the training input: tokens shifted by one
        if num_tokens > max_context_tokens:
            raise DataError(
                f"{where}: conversation {conversation.id!r} renders to {num_tokens} training "
                f"tokens, more than {limit_name} = {max_context_tokens}; shorten or remove it, "
                f"or raise {limit_name}"
            )


def build_sft_datum(
    conversation: Conversation,
    dialect: ToolDialect,
    tokenizer: Any,
    max_context_tokens: int,
    index: int = 0,
) -> TrainingDatum:
    """The shifted ``cross_entropy`` datum of ``conversation``.

    ``model_input = tokens[:-1]``, ``target_tokens = tokens[1:]``,
    ``weights = weights[1:]``. Raises :class:`DatumError` naming the
    conversation when the input exceeds ``max_context_tokens``.
    """
    label = f"conversation {index} ({conversation.id!r})"
    if max_context_tokens < 1:
        raise DatumError(f"{label}: max_context_tokens must be >= 1, got {max_context_tokens}")
    tokens, weights = render_conversation(conversation, dialect, tokenizer)
    num_tokens = len(tokens) - 1
    if num_tokens > max_context_tokens:
        raise DatumError(
            f"{label}: its training input has {num_tokens} tokens (after the shift), more "
            f"than max_context_tokens={max_context_tokens}; shorten it or raise the limit"
        )
    shifted = weights[1:]
    datum = Datum(
        ModelInput.from_ints(tokens[:-1]),
        {
            "target_tokens": TensorData.from_list(tokens[1:], "int64"),
            "weights": TensorData.from_list(shifted, "float32"),
        },
    )
    return TrainingDatum(
        datum=datum,
        num_tokens=num_tokens,
        loss_tokens=sum(1 for w in shifted if w != 0.0),
        trajectory_index=index,
        label=label,
    )
