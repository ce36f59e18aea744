"""The values a rollout produces: turns, observations, trajectories, results.

A :class:`Trajectory` is the only mutable object: the scheduler grows it turn
by turn. Everything it records is what training and the viewer need later:

* ``turns`` hold the training facts of each sampled action (the real prompt
  ``P_i``, the sampler's own completion tokens ``C_i`` and their logprobs),
  recorded *before* the text is parsed, so invalid actions are kept too.
* ``observations`` hold what the sandbox said for each executed call, with the
  latency, error kind and token counts (content versus template wrapper).
* ``stop_reason`` says why it ended; every ended trajectory has one.

Trajectories ended by an infrastructure failure (``sampler_error``,
``sandbox_error``) or never started (``prompt_too_long``) are *excluded*: they
carry reward and advantage 0, take no part in their question's group and are
never trained on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from retool.data.examples import MathExample
from retool.protocol import Message


class StopReason(StrEnum):
    """Why a trajectory ended (its ``stop_reason``; also ``stop/<value>`` in metrics)."""

    ANSWER = "answer"
    """The last turn had no tool call: it is the final answer (right or wrong)."""
    INVALID = "invalid"
    """The last turn was a malformed, partial or repeated tool call."""
    MAX_TURNS = "max_turns"
    """A tool call on the last allowed assistant turn: not executed."""
    MAX_CODE_CALLS = "max_code_calls"
    """A tool call after the code-call budget was spent (or with tools disabled)."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """No token budget left to sample, or the completion was cut by the trajectory budget."""
    OBSERVATION_TOO_LONG = "observation_too_long"
    """The tool ran, but not even a truncated observation fits the remaining budget."""
    PROMPT_TOO_LONG = "prompt_too_long"
    """The question's first prompt alone exceeds the budget: never sampled, excluded."""
    SAMPLER_ERROR = "sampler_error"
    """The sampler kept failing after every retry: excluded from groups and training."""
    SANDBOX_ERROR = "sandbox_error"
    """The sandbox infrastructure kept failing after every retry: excluded."""
    SANDBOX_UNREPORTED = "sandbox_unreported"
    """Every attempt failed after the code was delivered (it may have run and caused
    the failure): the trajectory's own failure, scored and trained, never excluded."""
    TEXT_ERROR = "text_error"
    """Handling the trajectory's own text raised: parsing a turn, rendering the next
    prompt through the chat template, or formatting or fitting an observation its code
    printed. The model's text caused it, so it is the trajectory's own failure: reward
    -1 without scoring (whatever the text boxed), trained, never excluded; ``error``
    says what raised."""


EXCLUDED_STOPS = frozenset(
    {StopReason.PROMPT_TOO_LONG, StopReason.SAMPLER_ERROR, StopReason.SANDBOX_ERROR}
)


@dataclass
class AssistantTurn:
    """One sampled action: the PPO facts first, then what was made of them."""

    prompt_tokens: list[int]  # P_i: the whole model input of this turn
    completion_tokens: list[int]  # C_i: the sampler's own ids, never re-encoded
    logprobs: list[float]  # L_i: sampling policy's logprob of each C_i token
    text: str  # decoded from C_i (the tokens win if the sampler's text disagrees)
    parse_kind: str = ""  # answer | tool | invalid (ParseKind value)
    parse_error: str | None = None  # why it is invalid
    sampler_stop: str = ""  # the sampler's stop reason: stop | length
    max_tokens: int = 0  # the generation budget this turn was given
    seed: int | None = None  # the sampling seed of the request
    sample_seconds: float = 0.0  # from request to response, including queueing

    def __post_init__(self) -> None:
        if len(self.completion_tokens) != len(self.logprobs):
            raise ValueError(
                f"an assistant turn has {len(self.completion_tokens)} completion tokens but "
                f"{len(self.logprobs)} logprobs"
            )


@dataclass
class Observation:
    """What one executed tool call returned, and how it entered the prompt."""

    call_id: str  # code-{question}-{group}-{call}
    code: str  # the code that ran
    content: str  # the observation text shown to the model (after truncation)
    ok: bool  # the code exited 0 within its limits
    error_kind: str | None  # ErrorKind value when it did not (error, timeout, ...)
    latency_s: float  # sandbox wall time of the call, seconds
    content_tokens: int = 0  # tokens of ``content`` encoded alone
    template_tokens: int = 0  # the rest of the continuation delta (closing, wrapper, prefix)
    truncated: bool = False  # the content was cut to fit a budget
    appended: bool = True  # entered the prompt (False: did not fit, trajectory ended)
    shared: bool = False  # result reused from identical code of the same group
    attempts: int = 1  # sandbox calls made (retries after infrastructure failures)


@dataclass
class Trajectory:
    """One code-interlaced trajectory: the state the rollout grows in place."""

    example: MathExample  # the question and its reference answer
    group_index: int  # branch number within the question's group, 0..G-1
    messages: list[Message]  # readable system/user/assistant/tool history
    question_index: int = 0  # the question's slot in this batch (the advantage group)
    turns: list[AssistantTurn] = field(default_factory=list)  # every sampled action
    observations: list[Observation] = field(default_factory=list)  # every executed call
    next_prompt_tokens: list[int] | None = None  # P_{i+1} = P_i + C_i + D_i, once known
    code_calls: int = 0  # observations that entered the history
    final_text: str = ""  # text scored by the reward (the last assistant text)
    reward: float = 0.0  # +1 / -1 outcome reward; 0 for excluded trajectories
    correct: bool = False  # the boxed answer matched the reference
    valid_format: bool = False  # a complete \\boxed{} was found
    answer: str | None = None  # content of that box
    # the reward reached no verdict (its check timed out, its worker died, a custom scorer
    # raised): scored -1 like a wrong answer, and counted so a summary can say how many
    unscored: bool = False
    advantage: float = 0.0  # group-centred reward; 0 for excluded trajectories
    stop_reason: StopReason | None = None  # why it ended; set on every ended trajectory
    error: str | None = None  # the last infrastructure, text or reward error
    policy_version: int = 0  # training steps taken by the policy that sampled it
    sample_retries: int = 0  # sampler calls retried for this trajectory
    sandbox_retries: int = 0  # sandbox calls retried for this trajectory
    started_s: float = 0.0  # seconds after the batch started when it was forked
    ended_s: float = 0.0  # seconds after the batch started when it ended

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def excluded(self) -> bool:
        """Ended by an infrastructure failure or never sampled: no reward, no training."""
        return self.stop_reason in EXCLUDED_STOPS

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the first prompt (0 when it was never rendered)."""
        return len(self.turns[0].prompt_tokens) if self.turns else 0

    @property
    def sampled_tokens(self) -> int:
        return sum(len(t.completion_tokens) for t in self.turns)

    @property
    def observation_tokens(self) -> int:
        return sum(o.content_tokens for o in self.observations if o.appended)

    @property
    def template_tokens(self) -> int:
        return sum(o.template_tokens for o in self.observations if o.appended)

    @property
    def total_tokens(self) -> int:
        """Length of the whole token sequence ``P1 + C1 + D1 + C2 + ...``."""
        if not self.turns:
            return 0
        last = self.turns[-1]
        return len(last.prompt_tokens) + len(last.completion_tokens)

    def to_json(self) -> dict[str, Any]:
        """Everything, token ids included: :meth:`from_json` restores an equal trajectory."""
        data = asdict(self)
        data["stop_reason"] = str(self.stop_reason) if self.stop_reason else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        fields = dict(data)
        fields["example"] = MathExample(**fields["example"])
        fields["turns"] = [AssistantTurn(**t) for t in fields["turns"]]
        fields["observations"] = [Observation(**o) for o in fields["observations"]]
        reason = fields.get("stop_reason")
        fields["stop_reason"] = StopReason(reason) if reason else None
        return cls(**fields)

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready summary (no token ids) for logs, journals and viewers."""
        return {
            "question_index": self.question_index,
            "group_index": self.group_index,
            "example_id": self.example.id,
            "question": self.example.question,
            "reference": self.example.answer,
            "messages": self.messages,
            "stop_reason": str(self.stop_reason) if self.stop_reason else None,
            "turns": len(self.turns),
            "code_calls": self.code_calls,
            "final_text": self.final_text,
            "answer": self.answer,
            "reward": self.reward,
            "correct": self.correct,
            "valid_format": self.valid_format,
            "unscored": self.unscored,
            "advantage": self.advantage,
            "tokens": {
                "prompt": self.prompt_tokens,
                "sampled": self.sampled_tokens,
                "observation": self.observation_tokens,
                "template": self.template_tokens,
                "total": self.total_tokens,
            },
            "observations": [
                {
                    "call_id": o.call_id,
                    "ok": o.ok,
                    "error_kind": o.error_kind,
                    "latency_s": o.latency_s,
                    "truncated": o.truncated,
                    "appended": o.appended,
                    "shared": o.shared,
                }
                for o in self.observations
            ],
            "parse": [t.parse_kind for t in self.turns],
            "error": self.error,
            "policy_version": self.policy_version,
            "segments": self.segments(),
        }

    def segments(self) -> list[dict[str, Any]]:
        """The token chain ``P1, C1, D1, C2, ...`` as runs of ids, each marked with its role.

        ``context`` runs (prompt, template, observation) never carry loss;
        ``assistant`` runs (sampled tokens) carry it when the trajectory trains
        (``loss``), which is what a viewer colours.
        """
        trains = not self.excluded and self.advantage != 0
        out: list[dict[str, Any]] = []
        known = 0
        for turn in self.turns:
            context = turn.prompt_tokens[known:]
            if context:
                out.append({"role": "context", "tokens": list(context), "loss": False})
            out.append(
                {"role": "assistant", "tokens": list(turn.completion_tokens), "loss": trains}
            )
            known = len(turn.prompt_tokens) + len(turn.completion_tokens)
        if self.next_prompt_tokens is not None and len(self.next_prompt_tokens) > known:
            out.append(
                {"role": "context", "tokens": self.next_prompt_tokens[known:], "loss": False}
            )
        return out


@dataclass(frozen=True)
class ProgressEvent:
    """Sent to ``progress`` once per ended trajectory (or per skipped question)."""

    finished: int  # trajectories ended so far, this one included
    total: int  # trajectories in the batch (questions x group size)
    count: int  # trajectories this event accounts for (G for a skipped question)
    trajectory: Trajectory | None  # the one that ended; None for a skipped question
    stop_reason: StopReason  # why it (or the skipped group) ended
    reused: bool = False  # it ended before a resume and was passed in through ``reuse``


ProgressCallback = Callable[[ProgressEvent], None]
