"""The trajectory viewer's data: the run's rollouts, selected, parsed and token-decoded.

The page's JavaScript only *displays*; every decision is made here, in Python,
where it is tested:

* **Which steps.** A long run has thousands of trajectories per step, and a
  page must stay a page. The last :data:`RECENT_STEPS` steps with rollouts are
  embedded, plus every :data:`OLDER_EVERY`-th step before them (and the first),
  and at most :data:`MAX_QUESTIONS` questions per step. The page says what was
  left out.
* **Turns.** Each message becomes a turn: system prompt, question, assistant
  turns (split into text and code with the run's own tool-call dialect, so the
  viewer shows exactly the code that ran), and observations (user or tool
  messages after the first assistant turn, whatever the dialect), each paired
  with its sandbox record (ok, error kind, latency, truncated, shared).
* **Tokens.** Trajectory records carry their token chain as segments
  (``context`` or ``assistant`` runs, each with a ``loss`` flag). The ids are
  decoded one token at a time with the run's tokenizer, so the page can colour
  each token by whether it carries loss. A token that decodes to an incomplete
  UTF-8 character (U+FFFD) is merged with the next ones until the text is
  whole. Decoded pieces go into one shared table and identical segments (a
  group's shared prompt) are stored once, which keeps the page small; the total
  is capped at :data:`TOKEN_BUDGET` tokens (newest steps first), beyond which
  trajectories show their turns only. The turn texts of the whole page stay
  under :data:`TEXT_BUDGET` characters (measured as embedded JSON): newest
  steps first, question by question, so the newest step too is cut to the
  budget (a single step of long trajectories can exceed it many times); the
  questions and older steps that do not fit are left out, and the page says so.
  The system prompt and question, the same for every member of a group, are
  stored once per question. Without
  a tokenizer (not installed, a model directory that is gone) whole messages
  are coloured by role instead, and the page says why.
* **SFT runs** write conversations (``{id, messages}``) instead of
  trajectories: each is shown as one "question" with one member whose
  assistant messages carry the loss.
* **Damaged files.** A rollouts file that cannot be read to its end (torn,
  not gzip, a corrupted deflate block, not UTF-8, a line that is not JSON)
  leaves its step out with a note, as a damaged eval file of the run is left
  out of the table: the report of the rest is still worth having.
* **Untrusted text.** Model output can contain anything. It is only ever put
  into the page as JSON data (see :mod:`retool.report.page`) and inserted with
  ``textContent``; NUL characters are replaced with U+FFFD here, and other
  control and invisible format characters (bidi overrides, tag characters...)
  are shown escaped (:func:`retool.protocol.sanitize.escape_control`).
"""

from __future__ import annotations

import functools
import json
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from retool.protocol import get_protocol
from retool.protocol.sanitize import escape_control
from retool.report.inputs import RunInputs
from retool.training.run_dir import RunDirectory, read_rollouts

if TYPE_CHECKING:
    from retool.types import Tokenizer

RECENT_STEPS = 50  # the last this many steps with rollouts are embedded
OLDER_EVERY = 10  # and every this-many-th step before them
MAX_QUESTIONS = 16  # question groups (or SFT conversations) per step
TOKEN_BUDGET = 1_000_000  # decoded tokens embedded in the whole page
TEXT_BUDGET = 20_000_000  # characters of viewer data (turn texts) in the whole page
MAX_MESSAGE_CHARS = 40_000  # longer message texts are cut in the middle
EXCLUDED_STOPS = frozenset({"prompt_too_long", "sampler_error", "sandbox_error"})


def select_steps(steps: Sequence[int]) -> list[int]:
    """The last :data:`RECENT_STEPS` steps, every :data:`OLDER_EVERY`-th before, the first."""
    ordered = sorted(set(steps))
    recent = ordered[-RECENT_STEPS:]
    older = ordered[: -RECENT_STEPS or None] if len(ordered) > RECENT_STEPS else []
    kept = [s for i, s in enumerate(older) if i == 0 or s % OLDER_EVERY == 0]
    return kept + recent


def clean(text: Any) -> str:
    """A display string: non-strings as JSON, NUL as U+FFFD, controls and invisible
    format characters escaped, very long texts cut."""
    if not isinstance(text, str):
        text = "" if text is None else json.dumps(text, ensure_ascii=False)
    text = escape_control(text.replace("\x00", "\ufffd"))
    if len(text) > MAX_MESSAGE_CHARS:
        half = MAX_MESSAGE_CHARS // 2
        cut = len(text) - 2 * half
        text = f"{text[:half]}\n[... {cut} characters cut by the report ...]\n{text[-half:]}"
    return text


@functools.lru_cache(maxsize=4)
def cached_tokenizer(name: str) -> Tokenizer:
    """The run's tokenizer, loaded once per process (loading takes seconds)."""
    # here, not at the top: retool.backends.local imports torch (seconds to load)
    from retool.backends.local import load_tokenizer

    return load_tokenizer(name)


class TokenTable:
    """Decodes segments token by token into shared piece and segment tables."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pieces: list[str] = []
        self.segments: list[list[int]] = []
        self.tokens = 0  # tokens stored (unique segments only)
        self._piece_index: dict[str, int] = {}
        self._segment_index: dict[tuple[int, ...], int] = {}
        self._single: dict[int, str] = {}

    def _decode(self, ids: Sequence[int]) -> str:
        if len(ids) == 1:
            text = self._single.get(ids[0])
            if text is None:
                text = self._single[ids[0]] = self.tokenizer.decode(
                    [ids[0]], skip_special_tokens=False, clean_up_tokenization_spaces=False
                )
            return text
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def _piece(self, text: str) -> int:
        text = escape_control(text.replace("\x00", "\ufffd"))
        index = self._piece_index.get(text)
        if index is None:
            index = self._piece_index[text] = len(self.pieces)
            self.pieces.append(text)
        return index

    def split(self, ids: Sequence[int]) -> list[str]:
        """Token texts; up to 4 tokens of one multi-byte character are merged."""
        out: list[str] = []
        pending: list[int] = []
        for token in ids:
            pending.append(int(token))
            text = self._decode(pending)
            if text.endswith("\ufffd") and len(pending) < 4:
                continue
            out.append(text)
            pending = []
        if pending:
            out.append(self._decode(pending))
        return out

    def segment(self, ids: Sequence[int]) -> int:
        key = tuple(int(i) for i in ids)
        index = self._segment_index.get(key)
        if index is None:
            index = self._segment_index[key] = len(self.segments)
            self.segments.append([self._piece(text) for text in self.split(key)])
            self.tokens += len(key)
        return index


@dataclass
class ViewerData:
    """What the page embeds for the viewer (serialised by :meth:`to_json`)."""

    kind: str  # rl | sft | none
    steps: list[dict[str, Any]] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    segments: list[list[int]] = field(default_factory=list)
    token_colouring: bool = False
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "steps": self.steps,
            "pieces": self.pieces,
            "segments": self.segments,
            "tokenColouring": self.token_colouring,
            "notes": self.notes,
        }


def _split_assistant(message: dict[str, Any], parse: Callable[[str], Any] | None) -> dict[str, Any]:
    content = message.get("content")
    turn: dict[str, Any] = {"kind": "assistant", "text": clean(content)}
    if isinstance(message.get("code"), str):  # an SFT conversation stores its call apart
        turn["code"] = clean(message["code"])
        return turn
    if parse is not None and isinstance(content, str):
        try:
            parsed = parse(content)
        except Exception:  # a dialect bug must not cost the report
            return turn
        if parsed.code is not None:
            turn["text"], turn["code"] = clean(parsed.content), clean(parsed.code)
        if parsed.error:
            turn["parseError"] = clean(parsed.error)
    return turn


def build_turns(
    record: dict[str, Any], parse: Callable[[str], Any] | None = None
) -> list[dict[str, Any]]:
    """The record's messages as turns (system, question, assistant, observation)."""
    messages = record.get("messages")
    if not isinstance(messages, list):
        return []
    observations = [
        o for o in record.get("observations") or [] if isinstance(o, dict) and o.get("appended", 1)
    ]
    parse_kinds = record.get("parse")
    parses: list[Any] = parse_kinds if isinstance(parse_kinds, list) else []
    turns: list[dict[str, Any]] = []
    answered = 0  # assistant turns so far
    seen = 0  # observations so far
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", ""))
        if role == "assistant":
            turn = _split_assistant(message, parse)
            if answered < len(parses):
                turn["parse"] = clean(parses[answered])
            answered += 1
        elif role == "system":
            turn = {"kind": "system", "text": clean(message.get("content"))}
        elif answered == 0 and role == "user":
            turn = {"kind": "question", "text": clean(message.get("content"))}
        else:  # a user or tool message after an assistant turn: the interpreter's output
            turn = {"kind": "observation", "role": role, "text": clean(message.get("content"))}
            if seen < len(observations):
                sandbox = observations[seen]
                turn["sandbox"] = {
                    key: sandbox.get(key)
                    for key in ("ok", "error_kind", "latency_s", "truncated", "shared")
                    if key in sandbox
                }
            seen += 1
        turns.append(turn)
    return turns


def _number(value: Any) -> float | None:
    """A finite number, or None (the page's JSON has no NaN)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _integer(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _trains(record: dict[str, Any]) -> bool:
    segments = record.get("segments")
    if isinstance(segments, list) and segments:
        return any(isinstance(s, dict) and s.get("loss") for s in segments)
    advantage = _number(record.get("advantage"))
    return record.get("stop_reason") not in EXCLUDED_STOPS and bool(advantage)


def _member(
    record: dict[str, Any], parse: Callable[[str], Any] | None, position: int
) -> dict[str, Any]:
    counts = record.get("tokens")
    tokens: dict[str, Any] = counts if isinstance(counts, dict) else {}
    group = _integer(record.get("group_index"))
    member: dict[str, Any] = {
        "g": position if group is None else group,
        "reward": _number(record.get("reward")),
        "advantage": _number(record.get("advantage")),
        "correct": _flag(record.get("correct")),
        "format": _flag(record.get("valid_format")),
        "stop": clean(record.get("stop_reason")),
        "turnsCount": _integer(record.get("turns")),
        "codeCalls": _integer(record.get("code_calls")),
        "answer": clean(record.get("answer")) if record.get("answer") is not None else None,
        "tokens": {k: _number(v) for k, v in tokens.items() if _number(v) is not None},
        "error": clean(record.get("error")) if record.get("error") else None,
        "trains": _trains(record),
        "turns": build_turns(record, parse),
        "segs": None,
    }
    return member


def _segs(record: dict[str, Any], table: TokenTable) -> list[list[Any]] | None:
    """The record's token segments as ``[role, loss, segment index]`` (decoded into ``table``)."""
    segments = record.get("segments")
    if not isinstance(segments, list):
        return None
    segs = []
    for segment in segments:
        if not isinstance(segment, dict) or not isinstance(segment.get("tokens"), list):
            continue
        role = "assistant" if segment.get("role") == "assistant" else "context"
        segs.append([role, bool(segment.get("loss")), table.segment(segment["tokens"])])
    return segs


def _sft_question(record: dict[str, Any], index: int) -> dict[str, Any]:
    turns = build_turns(record)
    question = next((t["text"] for t in turns if t["kind"] == "question"), "")
    member = {"g": 0, "sft": True, "trains": True, "turns": turns, "segs": None}
    return {
        "slot": index,
        "id": clean(record.get("id", f"#{index}")),
        "question": question,
        "reference": None,
        "members": [member],
    }


def _load_dialect_parser(name: str | None) -> Callable[[str], Any] | None:
    try:
        return get_protocol(name or "markdown").parse
    except Exception:
        return None


@dataclass
class _Tokens:
    """The page's token table, loaded on the first RL step (or the reason it is not)."""

    requested: Tokenizer  # write_report's tokenizer argument
    table: TokenTable | None = None
    why_not: str = ""
    loaded: bool = False
    over_budget: int = 0  # trajectories shown without tokens (budget spent)

    def for_next_group(self, run: RunInputs, size: int) -> TokenTable | None:
        if not self.loaded:
            self.table, self.why_not = _token_table(run, self.requested)
            self.loaded = True
        if self.table is not None and self.table.tokens >= TOKEN_BUDGET:
            self.over_budget += size
            return None
        return self.table


def _hoist(question: dict[str, Any]) -> dict[str, Any]:
    """Move the system prompt and question turns shared by every member up to the question."""
    members = question["members"]
    context: list[dict[str, Any]] = []
    while members and all(m["turns"] for m in members):
        head = members[0]["turns"][0]
        if head["kind"] not in ("system", "question"):
            break
        if any(m["turns"][0] != head for m in members[1:]):
            break
        context.append(head)
        for m in members:
            m["turns"] = m["turns"][1:]
    question["context"] = context
    return question


def _size(value: Any) -> int:
    """Characters of ``value`` as the page embeds it (JSON)."""
    return len(json.dumps(value))


def _rl_step(
    step: int,
    records: list[dict[str, Any]],
    run: RunInputs,
    parse: Callable[[str], Any] | None,
    tokens: _Tokens,
    budget: int,
) -> tuple[dict[str, Any], int, int]:
    """The step's viewer data, its size and how many questions did not fit ``budget``."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        slot = _integer(record.get("question_index"))
        groups.setdefault(-1 if slot is None else slot, []).append(record)
    questions = []
    used = 0
    slots = sorted(groups)[:MAX_QUESTIONS]
    for slot in slots:
        members = sorted(groups[slot], key=lambda r: _integer(r.get("group_index")) or 0)
        first = members[0]
        shown_members = [_member(r, parse, i) for i, r in enumerate(members)]
        question = {
            "slot": slot,
            "id": clean(first.get("example_id")),
            "question": clean(first.get("question")),
            "reference": clean(first.get("reference")),
            "members": shown_members,
        }
        size = _size(_hoist(question))
        if used + size > budget:
            break
        table = tokens.for_next_group(run, len(members))
        if table is not None:  # decoded only for a question that is shown
            for member, record in zip(shown_members, members, strict=True):
                member["segs"] = _segs(record, table)
        questions.append(question)
        used += size
    shown = {"step": step, "questions": questions, "omitted": max(len(groups) - MAX_QUESTIONS, 0)}
    return shown, used, len(slots) - len(questions)


def _sft_step(
    step: int, records: list[dict[str, Any]], budget: int
) -> tuple[dict[str, Any], int, int]:
    questions = []
    used = 0
    kept = records[:MAX_QUESTIONS]
    for index, record in enumerate(kept):
        question = _hoist(_sft_question(record, index))
        size = _size(question)
        if used + size > budget:
            break
        questions.append(question)
        used += size
    shown = {"step": step, "questions": questions, "omitted": max(len(records) - MAX_QUESTIONS, 0)}
    return shown, used, len(kept) - len(questions)


def build_viewer(run: RunInputs, tokenizer: Tokenizer = None) -> ViewerData:
    """Select, parse and decode the rollouts of ``run`` (see the module docstring).

    ``tokenizer`` overrides loading the run's own (``model.base_model``); pass
    ``False`` to colour by role without trying.
    """
    data = ViewerData(kind="none")
    if not run.rollout_steps:
        data.notes.append("this run has no rollouts/step_*.jsonl.gz files yet")
        return data
    chosen = select_steps(run.rollout_steps)
    if len(chosen) < len(run.rollout_steps):
        data.notes.append(
            f"{len(chosen)} of {len(run.rollout_steps)} steps are embedded: the last "
            f"{RECENT_STEPS}, and the first and every {OLDER_EVERY}th step before them"
        )
    directory = RunDirectory(run.path)
    parse = _load_dialect_parser(run.protocol)
    tokens = _Tokens(tokenizer)
    by_step: dict[int, dict[str, Any]] = {}
    text_size = 0
    budget_mb = f"{TEXT_BUDGET / 1_000_000:g} MB"
    for step in reversed(chosen):  # newest first: they get the token and text budgets
        try:
            records = [
                r for r in read_rollouts(directory.rollouts_path(step)) if isinstance(r, dict)
            ]
        except (OSError, EOFError, ValueError, RecursionError, zlib.error) as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            data.notes.append(f"step {step}: rollouts file damaged ({why}); left out")
            continue
        rl = [r for r in records if "group_index" in r or "segments" in r]
        budget = TEXT_BUDGET - text_size
        if rl:
            data.kind = "rl"
            shown, size, cut = _rl_step(step, rl, run, parse, tokens, budget)
        else:  # an SFT step: conversations
            data.kind = "sft" if data.kind == "none" else data.kind
            shown, size, cut = _sft_step(step, records, budget)
        if cut and not shown["questions"] and by_step:  # nothing of it fits: stop here
            older = [s for s in chosen if s <= step]
            data.notes.append(
                f"{len(older)} older steps (up to step {step}) are left out to keep the page "
                f"under about {budget_mb} of trajectory text"
            )
            break
        if cut:
            data.notes.append(
                f"step {step}: {cut} questions are left out to keep the page under about "
                f"{budget_mb} of trajectory text"
            )
        by_step[step] = shown
        text_size += size
    data.steps = [by_step[s] for s in sorted(by_step)]
    if any(s["omitted"] for s in data.steps):
        data.notes.append(f"at most {MAX_QUESTIONS} questions per step are embedded")
    if data.kind == "sft":
        data.notes.append(
            "SFT run: conversations as trained; every assistant message carries the loss, "
            "prompts and observations do not (coloured by role)"
        )
    elif tokens.table is not None:
        data.pieces, data.segments = tokens.table.pieces, tokens.table.segments
        data.token_colouring = True
        if tokens.over_budget:
            data.notes.append(
                f"token colouring stops after {TOKEN_BUDGET:,} tokens: {tokens.over_budget} "
                "trajectories of older steps show their turns only"
            )
    elif tokens.why_not:
        data.notes.append(
            f"token colouring unavailable: {tokens.why_not}; whole messages are "
            "coloured by role instead (assistant messages of trajectories "
            "that train carry the loss)"
        )
    return data


def _token_table(run: RunInputs, tokenizer: Tokenizer) -> tuple[TokenTable | None, str]:
    if tokenizer is False:
        return None, "the tokenizer was not loaded (turned off)"
    if tokenizer is None:
        name = run.base_model
        if name is None:
            return None, "config.toml names no model.base_model"
        try:
            tokenizer = cached_tokenizer(name)
        except Exception as exc:  # missing extra, gone directory, no network: all the same here
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return None, f"the tokenizer of {name!r} could not be loaded ({first})"
    return TokenTable(tokenizer), ""
