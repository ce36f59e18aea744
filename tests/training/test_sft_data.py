"""Cold-start SFT data: the file format, demonstrations, and the RL-exact rendering."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pytest

from retool.config import RolloutConfig
from retool.data.demo import demo_problems
from retool.data.examples import MathExample
from retool.errors import DataError, RetoolError
from retool.protocol import get_protocol
from retool.reward import RewardResult
from retool.rollout import rollout_batch
from retool.rollout.types import StopReason
from retool.sandbox import LocalSandbox
from retool.sandbox.result import ErrorKind, ExecResult
from retool.training.datum import DatumError, build_datum
from retool.training.sft_data import (
    CALL_LEADS,
    REPAIR_LEADS,
    Conversation,
    build_sft_datum,
    check_conversations,
    end_of_turn_token,
    load_conversations,
    make_demonstrations,
    numbered_conversations,
    render_conversation,
    write_conversations,
)
from retool.types import SampledSequence, SampleResponse, SamplerStop
from tests.data.test_demo import _templates, _writers
from tests.rollout.fakes import FakeSandbox

DIALECTS = ("markdown", "hermes_json", "qwen3_xml")

USER = {"role": "user", "content": "What is 2^10?"}
CALL = {"role": "assistant", "content": "Let me compute.", "code": "print(2**10)"}
TOOL = {"role": "tool", "content": "1024\n"}
ANSWER = {"role": "assistant", "content": "The answer is \\boxed{1024}"}
GOOD = {"id": "a", "messages": [USER, CALL, TOOL, ANSWER]}

# Two calls, the second after an error, then the answer: a three-turn trajectory.
THREE_TURNS = Conversation(
    id="three",
    messages=(
        {"role": "user", "content": "What is the sum of the digits of 2^100?"},
        {"role": "assistant", "content": "First the power.", "code": "print(2**100"},
        {"role": "tool", "content": "SyntaxError: '(' was never closed"},
        {
            "role": "assistant",
            "content": "I missed a parenthesis; again, with the digit sum.",
            "code": "n = 2**100\nprint(sum(int(d) for d in str(n)))\n",
        },
        {"role": "tool", "content": "115\n"},
        {"role": "assistant", "content": "The digit sum is 115.\n\\boxed{115}"},
    ),
)


def _line(record) -> str:
    return json.dumps(record)


def _messages(*messages) -> str:
    return _line({"id": "x", "messages": list(messages)})


# -- loading: every defect names path:line and the field -------------------------------

DEFECTS = [
    ("not json", '{"id": "x", "messages": [', 1, "not valid JSON"),
    ("not an object", "[1, 2]", 1, "expected a JSON object"),
    ("missing messages", _line({"id": "x"}), 1, "messages: missing"),
    ("missing id", _line({"messages": [USER, ANSWER]}), 1, "id: missing"),
    ("empty id", _line({"id": " ", "messages": [USER, ANSWER]}), 1, "id: must be"),
    ("id not a string", _line({"id": 7, "messages": [USER, ANSWER]}), 1, "id: must be"),
    ("unknown top field", _line({**GOOD, "meta": {}}), 1, "meta: unknown field"),
    ("messages not a list", _line({"id": "x", "messages": "hi"}), 1, "messages: must be a list"),
    ("empty messages", _line({"id": "x", "messages": []}), 1, "messages: empty"),
    ("message not object", _messages(USER, "hi"), 1, "messages[1]: must be an object"),
    ("bad role", _messages(USER, {"role": "robot", "content": "x"}), 1, "messages[1].role"),
    ("missing role", _messages(USER, {"content": "x"}), 1, "messages[1].role: missing"),
    (
        "system message",
        _messages({"role": "system", "content": "s"}, USER, ANSWER),
        1,
        "messages[0].role: 'system'",
    ),
    ("first not user", _messages(ANSWER), 1, "messages[0].role: the first message"),
    ("second user", _messages(USER, USER, ANSWER), 1, "messages[1].role: 'user'"),
    ("no final assistant", _messages(USER, CALL, TOOL), 1, "messages: no final assistant"),
    ("only the question", _messages(USER), 1, "messages: no final assistant"),
    ("call not answered", _messages(USER, CALL, ANSWER), 1, "messages[1].code: the call is not"),
    ("call at the end", _messages(USER, CALL), 1, "messages[1].code: the call is not"),
    ("tool without call", _messages(USER, TOOL, ANSWER), 1, "messages[1].role: a tool message"),
    (
        "tool after an answer",
        _messages(USER, ANSWER, TOOL, ANSWER),
        1,
        "messages[1].code: missing",
    ),
    ("two tools", _messages(USER, CALL, TOOL, TOOL, ANSWER), 1, "messages[3].role: a tool"),
    ("content not a string", _messages(USER, {**ANSWER, "content": 5}), 1, "messages[1].content"),
    ("content missing", _messages(USER, {"role": "assistant"}), 1, "messages[1].content: missing"),
    (
        "code not a string",
        _messages(USER, {**CALL, "code": 1}, TOOL, ANSWER),
        1,
        "messages[1].code",
    ),
    ("empty code", _messages(USER, {**CALL, "code": "  "}, TOOL, ANSWER), 1, "messages[1].code"),
    ("code on a tool", _messages(USER, CALL, {**TOOL, "code": "x"}, ANSWER), 1, "messages[2].code"),
    (
        "openai tool_calls",
        _messages(USER, {**CALL, "tool_calls": []}, TOOL, ANSWER),
        1,
        "messages[1].tool_calls: unknown field",
    ),
    ("empty answer", _messages(USER, {**ANSWER, "content": " "}), 1, "messages[1].content"),
    (
        "train not a bool",
        _messages(USER, {**CALL, "train": "no"}, TOOL, ANSWER),
        1,
        "messages[1].train: must be true or false, got str",
    ),
    (
        "untrained answer",
        _messages(USER, CALL, TOOL, {**ANSWER, "train": False}),
        1,
        "messages[3].train: the final answer is always trained on",
    ),
    (
        "train on a tool",
        _messages(USER, CALL, {**TOOL, "train": False}, ANSWER),
        1,
        "messages[2].train",
    ),
    ("empty question", _messages({**USER, "content": ""}, ANSWER), 1, "messages[0].content"),
    ("later line", _line(GOOD) + "\n\n" + _messages(USER, CALL), 3, "messages[1].code"),
    (
        "duplicate id",
        _line(GOOD) + "\n" + _line(GOOD),
        2,
        "id: duplicate 'a' (first on line 1)",
    ),
]


@pytest.mark.parametrize(
    "text, line, expected", [d[1:] for d in DEFECTS], ids=[d[0] for d in DEFECTS]
)
def test_each_defect_names_path_line_and_field(tmp_path, text, line, expected):
    path = tmp_path / "data.jsonl"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(DataError) as caught:
        load_conversations(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert expected in message
    assert "\n" not in message


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(_line(GOOD).encode() + b'\n{"id": "\xff"}\n')
    with pytest.raises(DataError, match=r"data\.jsonl:2: not UTF-8 \(byte 0xff"):
        load_conversations(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "data.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=r"data\.jsonl: no conversations"):
        load_conversations(path)


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        load_conversations(tmp_path)
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        load_conversations(tmp_path / "nope.jsonl")


def test_utf8_bom_and_blank_lines_are_accepted(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _line(GOOD).encode() + b"\n\n\r\n")
    (conversation,) = load_conversations(path)
    assert conversation.id == "a" and conversation.question == USER["content"]
    assert conversation.code_calls == 1


# -- writing ---------------------------------------------------------------------------


def test_round_trip(tmp_path):
    unicode = Conversation(
        id="ü-1",
        messages=(
            {"role": "user", "content": "Combien font 3 × 4 ? «exact»"},
            {"role": "assistant", "content": "", "code": "print('π', 3 * 4)"},
            {"role": "tool", "content": "π 12\n"},
            {"role": "assistant", "content": "\\boxed{12}"},
        ),
    )
    conversations = [Conversation.from_record(GOOD), THREE_TURNS, unicode]
    path = tmp_path / "out.jsonl"
    assert write_conversations(path, conversations) == 3
    assert load_conversations(path) == conversations
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temporary left
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3
    # Overwriting replaces the whole file.
    write_conversations(path, conversations[:1])
    assert load_conversations(path) == conversations[:1]


def test_write_failures(tmp_path):
    target = tmp_path / "adir"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(RetoolError, match="adir: cannot write"):
        write_conversations(target, [THREE_TURNS])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]
    with pytest.raises(RetoolError, match="missing/out.jsonl: cannot write"):
        write_conversations(tmp_path / "missing" / "out.jsonl", [THREE_TURNS])
    with pytest.raises(DataError, match="duplicate conversation id 'three'"):
        write_conversations(tmp_path / "dup.jsonl", [THREE_TURNS, THREE_TURNS])
    assert not (tmp_path / "dup.jsonl").exists()


def test_constructing_an_invalid_conversation_raises():
    with pytest.raises(DataError, match=r"messages\[1\]\.code: the call is not followed"):
        Conversation(id="x", messages=(USER, CALL))
    with pytest.raises(DataError, match="id: must be a non-empty string"):
        Conversation(id="", messages=(USER, ANSWER))


# -- demonstrations --------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(timeout=5.0, memory_mb=512, max_workers=2) as sb:
        yield sb


def test_demonstrations_from_real_sandbox_output(sandbox):
    problems = demo_problems("train")[:6]
    conversations = make_demonstrations(problems, sandbox, seed=0, failure_share=0.0)
    assert [c.id for c in conversations] == [p.id for p in problems]
    for problem, conversation in zip(problems, conversations, strict=True):
        user, call, tool, answer = conversation.messages
        assert user == {"role": "user", "content": problem.question}  # no system message
        assert call["role"] == "assistant" and call["code"] == problem.solution
        assert call["content"] in CALL_LEADS
        assert tool["role"] == "tool" and tool["content"].strip() == str(problem.answer)
        assert answer["role"] == "assistant" and "code" not in answer
        assert answer["content"].endswith(f"\\boxed{{{problem.answer}}}")
    # Varied phrasing across problems, reproducible for a seed, different for another.
    assert len({c.messages[1]["content"] for c in conversations}) >= 3
    answers = {
        c.messages[3]["content"].replace(c.messages[2]["content"].strip(), "X")
        for c in conversations
    }
    assert len(answers) >= 4
    again = make_demonstrations(problems, sandbox, seed=0, failure_share=0.0)
    assert again == conversations
    assert make_demonstrations(problems, sandbox, seed=1, failure_share=0.0) != conversations
    # A problem gets the same text whatever subset it is generated in.
    subset = make_demonstrations(problems[3:4], sandbox, seed=0, failure_share=0.0)
    assert subset == conversations[3:4]


def test_failure_demonstrations_show_a_real_traceback_then_the_fix(sandbox, smol_tokenizer):
    problems = demo_problems("train")[:7]  # one per family
    conversations = make_demonstrations(problems, sandbox, seed=0, failure_share=1.0)
    assert [c.id for c in conversations] == [p.id for p in problems]
    repaired = 0
    dialect = get_protocol("markdown")
    for problem, conversation in zip(problems, conversations, strict=True):
        *_, tool, answer = conversation.messages
        assert tool["content"].strip() == str(problem.answer)
        assert answer["content"].endswith(f"\\boxed{{{problem.answer}}}")
        if conversation.code_calls == 1:  # the wrong attempt happened to work
            assert problem.variant == "modpow"
            continue
        repaired += 1
        _, first, error, second, _, _ = conversation.messages
        assert first["code"] == problem.first_try and first["content"] in CALL_LEADS
        assert error["content"].startswith("Traceback") and "Error" in error["content"]
        assert second["code"] == problem.solution
        assert second["content"].split(" ", 3)[-1].endswith(problem.repair)
        assert second["content"].startswith(REPAIR_LEADS)
        # it fits the demo's rollout budgets: 160 tokens a turn, 1024 in all
        tokens, weights = render_conversation(conversation, dialect, smol_tokenizer)
        assert len(tokens) <= 1024
        runs, run = [], 0
        for w in weights:
            run = run + 1 if w else 0
            runs.append(run)
        assert max(runs) <= 160
    assert repaired >= 6


def test_the_default_share_of_demonstrations_shows_a_failure_and_no_held_out_phrasing():
    problems = demo_problems("train")
    answers = {p.solution: f"{p.answer}\n" for p in problems}

    class Runs:
        max_workers = 2

        def run(self, code: str) -> ExecResult:
            if code in answers:
                return ExecResult(True, answers[code], "", 0, False, 0.0, False)
            error = "Traceback (most recent call last):\nNameError: name 'math' is not defined"
            return ExecResult(False, "", error, 1, False, 0.0, False, ErrorKind.ERROR)

    conversations = make_demonstrations(problems, Runs(), seed=0)
    assert len(conversations) == len(problems)
    failures = sum(1 for c in conversations if c.code_calls == 2)
    assert 0.15 * len(problems) < failures < 0.35 * len(problems)
    held_out = _templates(held_out=True)
    for conversation in conversations:
        for message in conversation.messages:
            assert _writers(message["content"], held_out) == [], message["content"]


def test_demonstrations_skip_mismatched_and_failed_runs():
    problems = demo_problems("train")[:4]
    wrong, failing = problems[1].solution, problems[2].solution

    class Runs:
        max_workers = 3

        def run(self, code: str) -> ExecResult:
            if code == failing:
                return ExecResult(False, "", "Boom", 1, False, 0.0, False, ErrorKind.ERROR)
            problem = next(p for p in problems if p.solution == code)
            out = "41\n" if code == wrong else f"{problem.answer}\n"
            return ExecResult(True, out, "", 0, False, 0.0, False)

    conversations = make_demonstrations(problems, Runs())
    assert [c.id for c in conversations] == [problems[0].id, problems[3].id]


# -- rendering: exactly the rollout's prefix chain ----------------------------------------


@dataclass
class ReplaySampler:
    """Answers each request with the next weight-1 run of a rendered conversation."""

    tokenizer: object
    tokens: list[int]
    weights: list[float]
    prompts: list[list[int]] = field(default_factory=list)
    max_context_tokens: int | None = None  # no limit of its own

    async def sample_async(self, prompt, num_samples, params):
        ids = prompt.to_ints()
        self.prompts.append(ids)
        assert ids == self.tokens[: len(ids)], "the rollout's prompt left the rendered chain"
        end = len(ids)
        while end < len(self.tokens) and self.weights[end] == 1.0:
            end += 1
        completion = self.tokens[len(ids) : end]
        text = self.tokenizer.decode(completion, skip_special_tokens=True)
        sequence = SampledSequence(
            tuple(completion), tuple(-0.25 for _ in completion), text, SamplerStop.STOP
        )
        return SampleResponse((sequence,) * num_samples)


def _rollout(conversation: Conversation, dialect_name: str, tokenizer, tokens, weights):
    outputs = iter(m["content"] for m in conversation.messages if m["role"] == "tool")
    sandbox = FakeSandbox(outputs=lambda code: next(outputs))
    sampler = ReplaySampler(tokenizer, tokens, weights)
    config = RolloutConfig(group_size=1, protocol=dialect_name, max_code_calls=4)
    example = MathExample(id=conversation.id, question=conversation.question, answer="0")
    result = rollout_batch(
        sampler,
        tokenizer,
        sandbox,
        [example],
        config,
        scorer=lambda text, ref: RewardResult(-1.0, False, True, None),
    )
    (trajectory,) = result.trajectories
    return trajectory, sampler, sandbox


@pytest.mark.parametrize("dialect_name", DIALECTS)
@pytest.mark.parametrize(
    "conversation", [Conversation.from_record(GOOD), THREE_TURNS], ids=["two", "three"]
)
def test_rendering_is_the_rollout_prefix_chain(smol_tokenizer, dialect_name, conversation):
    dialect = get_protocol(dialect_name)
    tokens, weights = render_conversation(conversation, dialect, smol_tokenizer)
    assert len(tokens) == len(weights) and set(weights) == {0.0, 1.0}

    trajectory, _, sandbox = _rollout(conversation, dialect_name, smol_tokenizer, tokens, weights)
    assert trajectory.stop_reason == StopReason.ANSWER, trajectory.error
    calls = [m["code"] for m in conversation.messages if "code" in m]
    assert [o.code.rstrip("\n") for o in trajectory.observations] == [c.rstrip("\n") for c in calls]
    assert len(sandbox.calls) == len(calls)
    assert len(trajectory.turns) == len(calls) + 1
    # P_{i+1} == P_i + C_i + D_i, and the SFT tokens are the last prompt plus the answer.
    for turn, following in zip(trajectory.turns, trajectory.turns[1:], strict=False):
        assert following.prompt_tokens[: len(turn.prompt_tokens)] == turn.prompt_tokens
        start = len(turn.prompt_tokens)
        assert following.prompt_tokens[start : start + len(turn.completion_tokens)] == (
            turn.completion_tokens
        )
    last = trajectory.turns[-1]
    assert last.prompt_tokens + last.completion_tokens == tokens
    # Weights are 1 exactly on the sampled completion tokens.
    expected = [0.0] * len(tokens)
    for turn in trajectory.turns:
        start = len(turn.prompt_tokens)
        expected[start : start + len(turn.completion_tokens)] = [1.0] * len(turn.completion_tokens)
    assert weights == expected
    # The RL datum of that trajectory has the same inputs and the same loss positions.
    trajectory.advantage = 1.0
    rl = build_datum(trajectory, max_context_tokens=100_000)
    sft = build_sft_datum(conversation, dialect, smol_tokenizer, max_context_tokens=100_000)
    assert sft.datum.model_input.to_ints() == rl.datum.model_input.to_ints()
    target = sft.datum.loss_fn_inputs["target_tokens"].to_numpy().tolist()
    assert target == rl.datum.loss_fn_inputs["target_tokens"].to_numpy().tolist()
    sft_weights = sft.datum.loss_fn_inputs["weights"].to_numpy().tolist()
    assert sft_weights == rl.datum.loss_fn_inputs["advantages"].to_numpy().tolist()
    assert sft.loss_tokens == rl.loss_tokens == sum(weights[1:])


@pytest.mark.parametrize("dialect_name", DIALECTS)
def test_weighted_tokens_spell_the_calls_and_the_answer(smol_tokenizer, dialect_name):
    dialect = get_protocol(dialect_name)
    tokens, weights = render_conversation(THREE_TURNS, dialect, smol_tokenizer)
    runs: list[list[int]] = []
    for i, (token, weight) in enumerate(zip(tokens, weights, strict=True)):
        if weight:
            if i == 0 or not weights[i - 1]:
                runs.append([])
            runs[-1].append(token)
    assert len(runs) == 3
    texts = [smol_tokenizer.decode(run) for run in runs]
    for text, message in zip(texts[:2], THREE_TURNS.messages[1:5:2], strict=True):
        parsed = dialect.parse(text)
        assert parsed.kind == "tool" and parsed.code.rstrip("\n") == message["code"].rstrip("\n")
        assert parsed.content == message["content"]
        assert "<|im_end|>" not in text  # the sampler stops at the call's end
    assert texts[2] == THREE_TURNS.messages[-1]["content"] + "<|im_end|>"
    assert runs[2][-1] == smol_tokenizer.eos_token_id == end_of_turn_token(dialect, smol_tokenizer)
    # Observations are context: present, never weighted.
    unweighted = smol_tokenizer.decode([t for t, w in zip(tokens, weights, strict=True) if not w])
    assert "never closed" in unweighted and "115" in unweighted
    assert "What is the sum of the digits" in unweighted


@pytest.mark.parametrize("dialect_name", DIALECTS)
def test_an_untrained_call_stays_in_the_context_with_weight_zero(smol_tokenizer, dialect_name):
    dialect = get_protocol(dialect_name)
    first = dict(THREE_TURNS.messages[1])
    shown = Conversation(
        id="shown",
        messages=(THREE_TURNS.messages[0], {**first, "train": False}, *THREE_TURNS.messages[2:]),
    )
    tokens, weights = render_conversation(THREE_TURNS, dialect, smol_tokenizer)
    shown_tokens, shown_weights = render_conversation(shown, dialect, smol_tokenizer)
    assert shown_tokens == tokens  # the same context, token for token
    changed = [i for i, (a, b) in enumerate(zip(weights, shown_weights, strict=True)) if a != b]
    assert changed and all(weights[i] == 1.0 and shown_weights[i] == 0.0 for i in changed)
    # exactly the first call's completion lost its weight: it decodes to that call
    assert changed == list(range(changed[0], changed[-1] + 1))
    parsed = dialect.parse(smol_tokenizer.decode([tokens[i] for i in changed]))
    assert parsed.code.rstrip("\n") == first["code"].rstrip("\n")
    assert sum(shown_weights) == sum(weights) - len(changed)
    again = Conversation.from_record(json.loads(json.dumps(shown.to_record())))
    assert again.messages[1]["train"] is False  # survives the file


def test_demonstrations_can_show_the_failed_call_without_training_on_it(sandbox):
    problems = demo_problems("train")[:7]
    shown = make_demonstrations(
        problems, sandbox, seed=0, failure_share=1.0, train_failed_calls=False
    )
    trained = make_demonstrations(problems, sandbox, seed=0, failure_share=1.0)
    repaired = 0
    for a, b in zip(shown, trained, strict=True):
        flags = [m.get("train") for m in a.messages if m["role"] == "assistant"]
        if a.code_calls == 2:
            repaired += 1
            assert flags == [False, None, None]  # only the failed first call
        else:
            assert flags == [None, None]
        assert all("train" not in m for m in b.messages)
        stripped = tuple({k: v for k, v in m.items() if k != "train"} for m in a.messages)
        assert stripped == b.messages  # the same text either way
    assert repaired >= 6


def test_build_sft_datum_is_shifted_once(smol_tokenizer):
    dialect = get_protocol("markdown")
    conversation = Conversation.from_record(GOOD)
    tokens, weights = render_conversation(conversation, dialect, smol_tokenizer)
    item = build_sft_datum(conversation, dialect, smol_tokenizer, len(tokens) - 1, index=4)
    assert item.datum.model_input.to_ints() == tokens[:-1]
    assert item.datum.loss_fn_inputs["target_tokens"].to_numpy().tolist() == tokens[1:]
    assert item.datum.loss_fn_inputs["weights"].to_numpy().tolist() == weights[1:]
    assert set(item.datum.loss_fn_inputs) == {"target_tokens", "weights"}
    assert item.num_tokens == len(tokens) - 1
    assert item.loss_tokens == sum(weights[1:]) and weights[0] == 0.0
    assert item.trajectory_index == 4 and "'a'" in item.id
    with pytest.raises(DatumError, match=r"conversation 4 \('a'\).*max_context_tokens="):
        build_sft_datum(conversation, dialect, smol_tokenizer, len(tokens) - 2, index=4)


def test_conversations_a_dialect_cannot_express(smol_tokenizer):
    fenced = Conversation(
        id="fence",
        messages=(USER, {**CALL, "code": "s = '''\n```\n'''\nprint(s)"}, TOOL, ANSWER),
    )
    with pytest.raises(DataError, match=r"'fence', messages\[1\]\.code: cannot be written"):
        render_conversation(fenced, get_protocol("markdown"), smol_tokenizer)
    render_conversation(fenced, get_protocol("qwen3_xml"), smol_tokenizer)  # fine there
    calling = Conversation(
        id="calls", messages=(USER, {**ANSWER, "content": "<tool_call>\n{}\n</tool_call>"})
    )
    with pytest.raises(DataError, match=r"'calls', messages\[1\]: the answer would be read"):
        render_conversation(calling, get_protocol("hermes_json"), smol_tokenizer)


# -- the whole file checked before step 1 (a careless user's file) ----------------------


def _lines(path, records, blank_after=()):
    """``records`` as JSONL, a blank line after each index in ``blank_after``."""
    text = []
    for i, record in enumerate(records):
        text.append(json.dumps(record))
        if i in blank_after:
            text.append("   ")
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def _good(i):
    return {**GOOD, "id": f"c{i}"}


def test_numbered_conversations_count_blank_lines(tmp_path):
    path = _lines(tmp_path / "d.jsonl", [_good(0), _good(1), _good(2)], blank_after=(0,))
    assert [(n, c.id) for n, c in numbered_conversations(path)] == [(1, "c0"), (3, "c1"), (4, "c2")]
    assert [c.id for c in load_conversations(path)] == ["c0", "c1", "c2"]


def test_a_conversation_too_long_deep_in_the_file_is_named_by_line(tmp_path, smol_tokenizer):
    dialect = get_protocol("markdown")
    fits = len(render_conversation(Conversation.from_record(GOOD), dialect, smol_tokenizer)[0]) - 1
    # one pasted essay among short conversations, the limit just what the short ones need
    long = {
        **GOOD,
        "id": "essay",
        "messages": [USER, CALL, TOOL, {**ANSWER, "content": ("so " * 400 + "\\boxed{1024}")}],
    }
    records = [_good(i) for i in range(6)] + [long] + [_good(9)]
    path = _lines(tmp_path / "d.jsonl", records, blank_after=(2,))
    with pytest.raises(DataError) as info:
        check_conversations(path, numbered_conversations(path), dialect, smol_tokenizer, fits)
    message = str(info.value)
    assert message.startswith(f"{path}:8: conversation 'essay' renders to ")
    assert f"more than train.max_train_tokens = {fits};" in message and "\n" not in message
    # the boundary: the training input is the rendering shifted by one
    one = numbered_conversations(_lines(tmp_path / "one.jsonl", [GOOD]))
    check_conversations(path, one, dialect, smol_tokenizer, fits)
    with pytest.raises(DataError, match=rf":1: conversation 'a' renders to {fits} training"):
        check_conversations(path, one, dialect, smol_tokenizer, fits - 1)


def test_a_conversation_the_dialect_cannot_write_is_named_by_line(tmp_path, smol_tokenizer):
    fenced = {
        **GOOD,
        "id": "fence",
        "messages": [USER, {**CALL, "code": "print(1)\n```\nprint(2)"}, TOOL, ANSWER],
    }
    path = _lines(tmp_path / "d.jsonl", [_good(0), _good(1), fenced])
    numbered = numbered_conversations(path)  # the shape is fine: it loads
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(path))}:3: conversation 'fence', messages\[1\]\.code"
    ):
        check_conversations(path, numbered, get_protocol("markdown"), smol_tokenizer, 4096)
    # the same file is fine where the dialect can write it
    check_conversations(path, numbered, get_protocol("qwen3_xml"), smol_tokenizer, 4096)
