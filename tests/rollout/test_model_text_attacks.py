"""Model text that tries to crash, hang or exhaust each stage of a real rollout.

Every test runs the real scheduler (a scripted sampler, the real SmolLM2
tokenizer and dialects, the real boxed-answer reward with its worker
processes) on two questions x two members, where one member (question 1,
member 0: "the attacker") writes hostile text and the others answer honestly.
Each checks that the batch completes with all four trajectories, that the
attacker ends as the rule says (stop reason, reward, counters), and that the
honest members are exactly what they are in the same batch without the
attacker.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from retool.data.examples import MathExample
from retool.protocol.markdown import MarkdownDialect
from retool.reward import EquivalenceChecker, Scorer, load_reward_function
from retool.rollout import (
    ProgressCallback,
    ProgressEvent,
    RolloutResult,
    StopReason,
    Trajectory,
    rollout_batch,
)
from tests.builders import scripted_rollout
from tests.protocol.templates import DROPS_OLD_REASONING
from tests.rollout.fakes import Call, FakeSandbox, ScriptedSampler, answer_text, call_text

Q1 = MathExample("q1", "What is 2^10?", "1024")
Q2 = MathExample("q2", "What is 3^5?", "243")
HONEST_CODE = {"2^10": "print(2**10)", "3^5": "print(3**5)"}
OUTPUTS = {"print(2**10)": "1024\n", "print(3**5)": "243\n"}
TAG = "ATTACKER"  # in every attacking turn, so its later prompts can be told apart
REWARD_TIMEOUT = 2.0  # seconds per equivalence check: bounds the reward-bomb tests


@pytest.fixture(scope="module")
def checker():
    with EquivalenceChecker(timeout=REWARD_TIMEOUT, workers=2) as c:
        yield c


def call_in(protocol: str, code: str, lead: str) -> str:
    """A tool call of ``protocol`` after ``lead``."""
    if protocol == "markdown":
        return call_text(code, lead)
    if protocol == "hermes_json":
        body = json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
        return f"{lead}\n<tool_call>\n{body}\n</tool_call>"
    return (
        f"{lead}\n<tool_call>\n<function=code_interpreter>\n<parameter=code>\n{code}\n"
        "</parameter>\n</function>\n</tool_call>"
    )


def is_attacker(call: Call) -> bool:
    if call.turn == 0:
        return call.index == 0 and "2^10" in call.prompt_text
    return TAG in call.prompt_text


def honest(protocol: str, call: Call) -> str:
    two = "2^10" in call.prompt_text
    if call.turn == 0:
        return call_in(protocol, HONEST_CODE["2^10" if two else "3^5"], "Let me compute.")
    return answer_text("1024" if two else "243")


def rollout(
    tokenizer,
    attack=None,
    outputs=None,
    *,
    protocol: str = "markdown",
    checker: EquivalenceChecker | None,
    scorer: Scorer | None = None,
    progress: ProgressCallback | None = None,
) -> RolloutResult:
    """The batch Q1, Q2 x 2 members; ``attack(call)`` writes the attacker's turns and
    ``outputs(code)`` answers the attacker's code (honest code prints its result)."""

    def script(call: Call) -> str:
        if attack is not None and is_attacker(call):
            return attack(call)
        return honest(protocol, call)

    def run_code(code: str) -> str:
        if code in OUTPUTS:
            return OUTPUTS[code]
        return outputs(code) if outputs is not None else ""

    config = scripted_rollout(
        group_size=2,
        max_trajectory_tokens=4096,
        max_assistant_tokens=1024,
        max_tool_response_tokens=512,
        protocol=protocol,
    )
    sampler = ScriptedSampler(tokenizer, script)
    return rollout_batch(
        sampler,
        tokenizer,
        FakeSandbox(run_code),
        [Q1, Q2],
        config,
        checker=checker,
        reward_timeout=REWARD_TIMEOUT,
        scorer=scorer,
        progress=progress,
    )


def facts(trajectory: Trajectory) -> tuple:
    """What an attacker must not change about another member."""
    return (
        trajectory.stop_reason,
        trajectory.reward,
        trajectory.correct,
        trajectory.answer,
        trajectory.error,
        [(t.prompt_tokens, t.completion_tokens, t.logprobs) for t in trajectory.turns],
        [o.content for o in trajectory.observations],
        trajectory.next_prompt_tokens,
    )


def attacked(result: RolloutResult, baseline: RolloutResult) -> Trajectory:
    """The attacker, once the batch is checked whole and the others untouched."""
    assert len(result.trajectories) == 4 and all(t.done for t in result.trajectories)
    assert [(t.question_index, t.group_index) for t in result.trajectories] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    for got, want in zip(result.trajectories[1:], baseline.trajectories[1:], strict=True):
        assert facts(got) == facts(want)
        assert got.stop_reason == StopReason.ANSWER and got.reward == 1.0
    return result.trajectories[0]


_baselines: dict[tuple[str, str | None], RolloutResult] = {}


def baseline(tokenizer, checker, protocol: str = "markdown") -> RolloutResult:
    key = (protocol, getattr(tokenizer, "chat_template", None))
    if key not in _baselines:
        _baselines[key] = rollout(tokenizer, protocol=protocol, checker=checker)
    return _baselines[key]


def continues_exactly(trajectory: Trajectory) -> bool:
    """Every prompt extends the previous prompt and completion, token for token."""
    turns = trajectory.turns
    return all(
        later.prompt_tokens[: len(t.prompt_tokens) + len(t.completion_tokens)]
        == t.prompt_tokens + t.completion_tokens
        for t, later in itertools.pairwise(turns)
    )


# -- the continuation's internal marker ------------------------------------------------------
FORGED = "RETOOLPLACEHOLDER RETOOL0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("protocol", ["markdown", "hermes_json", "qwen3_xml"])
@pytest.mark.parametrize("where", ["earlier turn", "observation", "both"])
def test_the_continuation_marker_in_model_text_is_only_text(
    smol_tokenizer, checker, protocol, where
):
    """Written in its own earlier turn, or printed by its code, the old fixed marker (and
    look-alikes of the nonce) leave the trajectory a plain one: two calls, then the answer."""
    in_turn = where in ("earlier turn", "both")

    def attack(call: Call) -> str:
        if call.turn < 2:
            lead = f"{TAG} {FORGED if in_turn else 'step'} {call.turn}"
            return call_in(protocol, f"print('{TAG}', {call.turn})", lead)
        return answer_text("1024")

    def printed(code: str) -> str:
        return f"{FORGED}\n{FORGED}\n" if where != "earlier turn" else "ok\n"

    result = rollout(smol_tokenizer, attack, printed, protocol=protocol, checker=checker)
    trajectory = attacked(result, baseline(smol_tokenizer, checker, protocol))
    assert trajectory.stop_reason == StopReason.ANSWER and trajectory.code_calls == 2
    assert trajectory.reward == 1.0 and trajectory.error is None
    assert continues_exactly(trajectory) and len(trajectory.turns) == 3
    if where != "earlier turn":
        assert all(FORGED in o.content for o in trajectory.observations)
    assert result.metrics()["stop/text_error"] == 0.0


# -- a render that fails because of what the model wrote ---------------------------------
def test_text_that_breaks_the_render_ends_only_its_trajectory_as_text_error(
    smol_tokenizer, checker
):
    """A template that renders a turn differently once it holds "</think>": the second
    call's continuation is refused, and only the trajectory that wrote it ends. It scores
    -1 whatever it boxed, is not excluded, and its group still trains."""
    tokenizer = _with_template(smol_tokenizer, DROPS_OLD_REASONING)

    def attack(call: Call) -> str:
        if call.turn == 0:
            return call_text("print(1)", f"<think>{TAG} plan</think>\nFirst a check.")
        return call_text("print(2)", "It is \\boxed{1024}, but let me check again.")

    result = rollout(tokenizer, attack, lambda code: "1\n", checker=checker)
    trajectory = attacked(result, baseline(tokenizer, checker))
    assert trajectory.stop_reason == StopReason.TEXT_ERROR
    assert (trajectory.reward, trajectory.correct, trajectory.answer) == (-1.0, False, None)
    assert trajectory.error.startswith("observation: ProtocolError")
    assert "renders the earlier conversation differently" in trajectory.error
    assert not trajectory.excluded and trajectory in result.training_trajectories()
    assert trajectory.advantage < 0 < result.trajectories[1].advantage
    ran, refused = trajectory.observations
    assert ran.appended and not refused.appended and refused.content == "1\n"
    assert trajectory.code_calls == 1 and len(trajectory.turns) == 2
    metrics = result.metrics()
    assert metrics["stop/text_error"] == 0.25 and metrics["rollout/excluded"] == 0.0


def _with_template(tokenizer, template):
    import copy

    clone = copy.copy(tokenizer)
    clone.chat_template = template
    return clone


def test_a_parser_that_raises_ends_only_its_trajectory(smol_tokenizer, checker, monkeypatch):
    """A dialect bug on one text (here: a RecursionError) is that trajectory's text_error."""
    original = MarkdownDialect.parse

    def fragile(self, text):
        if TAG in text:
            raise RecursionError("maximum recursion depth exceeded")
        return original(self, text)

    monkeypatch.setattr(MarkdownDialect, "parse", fragile)
    result = rollout(smol_tokenizer, lambda call: f"{TAG} \\boxed{{1024}}", checker=checker)
    trajectory = attacked(result, baseline(smol_tokenizer, checker))
    assert trajectory.stop_reason == StopReason.TEXT_ERROR and trajectory.reward == -1.0
    assert trajectory.error.startswith("parse: RecursionError")
    assert trajectory.turns[0].parse_kind == "invalid"
    assert trajectory.messages[-1] == {"role": "assistant", "content": trajectory.final_text}


# -- JSON the parser cannot hold -----------------------------------------------------------
DEEP = "[" * 1200


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "code_interpreter", "arguments": ' + DEEP + "}",
        '{"name": "code_interpreter", "arguments": {"code": ' + "1" * 5000 + "}}",
        '{"name": "code_interpreter", "arguments": "' + DEEP + '"}',
    ],
    ids=["nested", "long int", "nested in a string"],
)
def test_json_the_parser_cannot_hold_is_an_invalid_call(smol_tokenizer, checker, body):
    def attack(call: Call) -> str:
        return f"{TAG}\n<tool_call>\n{body}\n</tool_call>"

    result = rollout(smol_tokenizer, attack, protocol="hermes_json", checker=checker)
    trajectory = attacked(result, baseline(smol_tokenizer, checker, "hermes_json"))
    assert trajectory.stop_reason == StopReason.INVALID and trajectory.reward == -1.0
    assert trajectory.turns[0].parse_error
    assert trajectory.error is None


# -- answers that try to exhaust the reward ------------------------------------------------
@pytest.mark.parametrize(
    "bomb",
    [
        "(x+1)^{10^{6}}",
        "10^{10^{10}}",
        "((10!)!)!",
        "9^{9^{9^{9}}}",
        "\\sqrt{" * 35 + "2" + "}" * 35,
    ],
)
def test_a_reward_bomb_scores_minus_one_within_the_deadline(smol_tokenizer, checker, bomb):
    """Time (the deadline) and memory (the worker's cap) bound each check; the bomb is
    a wrong answer, counted at most once as a timeout or a failed check."""
    result = rollout(smol_tokenizer, lambda call: f"{TAG} \\boxed{{{bomb}}}", checker=checker)
    trajectory = attacked(result, baseline(smol_tokenizer, checker))
    assert trajectory.stop_reason == StopReason.ANSWER and trajectory.answer == bomb
    assert (trajectory.reward, trajectory.correct, trajectory.valid_format) == (-1.0, False, True)
    counters = result.counters
    assert counters.reward_timeouts + counters.reward_failures <= 1
    # the checker is whole again: an answer that needs a worker is still judged right
    assert checker.check("\\frac{2048}{2}", "1024").equivalent


def test_a_check_whose_worker_dies_scores_minus_one_and_is_counted(smol_tokenizer, monkeypatch):
    """Workers that cannot hold even their imports (a cap far too low) die on every try:
    the answer that needed one scores -1, the batch goes on, plain integers still score."""
    from retool.reward import verify

    monkeypatch.setattr(verify, "MIN_MEMORY_MB", 1)
    with EquivalenceChecker(timeout=REWARD_TIMEOUT, memory_mb=8) as dying:
        result = rollout(
            smol_tokenizer, lambda call: f"{TAG} \\boxed{{\\frac{{2048}}{{2}}}}", checker=dying
        )
        assert dying.failures == 1
    with EquivalenceChecker(timeout=REWARD_TIMEOUT) as healthy:
        trajectory = attacked(result, baseline(smol_tokenizer, healthy))
    assert trajectory.stop_reason == StopReason.ANSWER and trajectory.valid_format
    assert (trajectory.reward, trajectory.correct) == (-1.0, False)
    assert result.counters.reward_failures == 1
    assert result.metrics()["rollout/reward_failures"] == 1.0


def test_a_built_in_reward_that_raises_on_one_answer_scores_it_minus_one(
    smol_tokenizer, checker, monkeypatch
):
    """Any exception of the built-in reward on one answer (a bug the text found) is that
    answer's -1, counted (a custom reward's: the tests below)."""
    from retool.rollout import scoring

    original = scoring.score_answer

    def fragile(text, *args):
        if TAG in text:
            raise RecursionError("maximum recursion depth exceeded")
        return original(text, *args)

    monkeypatch.setattr(scoring, "score_answer", fragile)
    result = rollout(smol_tokenizer, lambda call: f"{TAG} \\boxed{{1024}}", checker=checker)
    trajectory = attacked(result, baseline(smol_tokenizer, checker))
    assert trajectory.stop_reason == StopReason.ANSWER and not trajectory.excluded
    assert (trajectory.reward, trajectory.correct) == (-1.0, False)
    assert trajectory.error.startswith("reward: RecursionError")
    assert result.counters.reward_failures == 1


# -- a custom reward.function that one answer breaks ------------------------------------------
CARELESS = "tests.rollout.test_model_text_attacks:careless_reward"


def careless_reward(text: str, reference: str) -> float | None:
    """A reward.function written for the answers its author expected: on the attacker's
    text it raises, or (when the text says "nothing") returns nothing."""
    if TAG in text:
        if "nothing" in text:
            return None
        raise ValueError("unexpected answer format")
    return 1.0 if f"\\boxed{{{reference}}}" in text else -1.0


@pytest.mark.parametrize(
    ("lead", "error"),
    [
        ("raise", "reward: ValueError: unexpected answer format"),
        ("nothing", "reward: ConfigError: reward.function"),
    ],
)
def test_a_custom_reward_that_fails_on_one_answer_scores_it_minus_one(smol_tokenizer, lead, error):
    """The attacker boxes the right answer, and the user's function fails on its text:
    that answer is -1 (even though right), counted; the batch completes, the others
    are scored by the function as without the attacker, and every trajectory is
    reported to progress once (the failed one last, once the batch goes on)."""
    scorer = load_reward_function(CARELESS)
    events: list[ProgressEvent] = []
    result = rollout(
        smol_tokenizer,
        lambda call: f"{TAG} {lead} \\boxed{{1024}}",
        checker=None,
        scorer=scorer,
        progress=events.append,
    )
    trajectory = attacked(result, rollout(smol_tokenizer, checker=None, scorer=scorer))
    assert trajectory.stop_reason == StopReason.ANSWER and not trajectory.excluded
    assert (trajectory.reward, trajectory.correct, trajectory.valid_format) == (-1.0, False, False)
    assert trajectory.error is not None and trajectory.error.startswith(error)
    assert result.counters.reward_failures == 1
    assert result.metrics()["rollout/reward_failures"] == 1.0
    reported = [e.trajectory for e in events]
    assert sorted(id(t) for t in reported) == sorted(id(t) for t in result.trajectories)
    assert reported[-1] is trajectory and events[-1].finished == events[-1].total == 4


def test_a_custom_reward_that_fails_on_every_answer_stops_the_batch_unreported(
    smol_tokenizer,
):
    """A function that fails on every answer (a reward service that went away) is not
    the answers' fault: the batch stops with its error, and none of those -1s reaches
    progress (the training journal), so a resumed step scores them again."""
    events: list[ProgressEvent] = []

    def gone(text: str, reference: str) -> float:
        raise ConnectionError("the reward service went away")

    with pytest.raises(ConnectionError, match="went away"):
        rollout(smol_tokenizer, checker=None, scorer=gone, progress=events.append)
    assert events == []


# -- characters that split lines, hide text or cannot be encoded ---------------------------
WEIRD = "a\u2028b\u2029c\x85d\u202ee\x9b[31mf\u200fg\ufeffh"


def test_odd_characters_in_observations_and_answers_stay_data(smol_tokenizer, checker, tmp_path):
    """Printed output with a lone surrogate, line and paragraph separators, C1 and bidi
    controls reaches the model escaped; the answer carrying them goes through the eval
    results file and the report, which keep every row and show no raw control."""

    def attack(call: Call) -> str:
        if call.turn == 0:
            return call_text("print(weird)", f"{TAG} {WEIRD}")
        return answer_text(f"{WEIRD}1024")

    result = rollout(smol_tokenizer, attack, lambda code: f"\ud800{WEIRD}\udfff\n", checker=checker)
    trajectory = attacked(result, baseline(smol_tokenizer, checker))
    assert trajectory.stop_reason == StopReason.ANSWER and trajectory.code_calls == 1
    (observation,) = trajectory.observations
    assert observation.appended and "\\ud800" in observation.content
    assert not any(c in observation.content for c in "\ud800\u2028\x85\u202e\x9b")
    assert WEIRD in trajectory.final_text and trajectory.reward == -1.0

    path = _run_with_eval(tmp_path, result)
    text = path.read_bytes()
    assert text.isascii() and text.count(b"\n") == 5  # the header and four rows
    from retool.evaluation import load_results
    from retool.report import load_eval_file, write_report

    rows = load_results(path).rows
    assert len(rows) == 4 and rows[0]["final_text"] == trajectory.final_text
    assert load_eval_file(path).samples == 4
    page = write_report(tmp_path / "run", tokenizer=False).read_text(encoding="utf-8")
    assert "<tr><th scope=row>step 1" in page and "skipped step_000001.jsonl" not in page
    assert not any(c in page for c in "\u2028\u2029\x85\u202e\x9b\u200f\ufeff")


def _run_with_eval(tmp_path: Path, result: RolloutResult) -> Path:
    """A run directory whose step 1 holds ``result`` and whose evaluation of it is an
    eval file written as evaluation writes one."""
    from retool.config import load_config
    from retool.evaluation.results import header_line, row_line, sample_row
    from retool.training.run_dir import RunDirectory, config_to_toml

    root = tmp_path / "run"
    root.mkdir()
    config = load_config(None, ['model.base_model="tiny-random"', "rollout.group_size=2"])
    (root / "config.toml").write_text(config_to_toml(config))
    run = RunDirectory(root)
    run.rollouts_dir.mkdir()
    run.complete_step(1, {"reward/mean": 0.5, **result.metrics()}, result.trajectories)
    run.eval_dir.mkdir()
    rows = [sample_row(t, t.question_index, 0, 1.0) for t in result.trajectories]
    lines = [header_line({"n": 2, "model": "tiny-random"}), *(row_line(r) for r in rows)]
    path = run.eval_dir / "step_000001.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    return path
