"""``[rollout]``: the budgets and sampling of one rollout.

The tool-call dialects are :mod:`retool.protocol`'s (a floor below): the
names it registers are the ones ``rollout.protocol`` accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

from retool.checks import SEED_MAX
from retool.config.fields import at_least, check_range, positive
from retool.errors import ConfigError
from retool.protocol import PROTOCOL_NAMES


@dataclass(frozen=True)
class RolloutConfig:
    """Budgets and sampling of one rollout (:mod:`retool.rollout`; docs/architecture.md)."""

    group_size: int = 8  # trajectories per question, in [1, 2**16]; advantages centred per group
    max_code_calls: int = 4  # tool calls that may enter one trajectory, in [1, 2**16]
    max_assistant_turns: int = 6  # assistant turns recorded per trajectory, in [1, 2**16]
    max_trajectory_tokens: int = 8192  # prompt + everything generated, in [1, 2**20]
    max_assistant_tokens: int = 1024  # new tokens per assistant turn
    max_tool_response_tokens: int = 512  # tokens of one observation
    temperature: float = 1.0  # sampling temperature (0 = greedy)
    top_p: float = 1.0  # nucleus mass, in (0, 1]
    seed: int = 42  # base sampling seed, in [0, 2**32 - 1]; mixed with step, question, ...
    protocol: str = "markdown"  # tool-call dialect: markdown | hermes_json | qwen3_xml
    min_observation_tokens: int = 32  # room kept free before a turn so a call can be answered
    max_in_flight_samples: int = 64  # sampled sequences requested at once (a group counts G)
    max_in_flight_tools: int = 16  # sandbox calls submitted at once
    sample_retries: int = 2  # extra attempts after a sampler failure (exception, bad reply)
    sandbox_retries: int = 2  # extra attempts after a sandbox infrastructure failure
    retry_backoff: float = 0.5  # seconds before the first retry, in [0, 3600]; doubles each
    advantage: str = "mean"  # mean: R - mean(group) | mean_std: (R - mean) / (std + 1e-6)
    share_identical_code: bool = False  # run identical code of one question group once
    # DAPO's dynamic sampling (training only): groups whose members all scored alike are
    # dropped, and the step samples further questions, one per dropped group, until it has
    # train.questions_per_batch informative groups or has drawn max_oversample extra ones.
    dynamic_sampling: bool = False
    max_oversample: int = 8  # extra questions one step may draw, in [0, 2**16]
    # SimpleTIR's filter (training only): a trajectory that ended void (a partial or
    # malformed call, an answer without a complete \\boxed{}) or cut by its token budget
    # keeps its reward, in its group's mean too, but does not train (rollout/void.py).
    drop_void: bool = False

    def __post_init__(self) -> None:
        # Upper bounds far above any real run, so a typo (an extra zero or three) is one
        # clear error here instead of a run that allocates, sleeps or loops for ever.
        for name, high in (
            ("group_size", 2**16),
            ("max_code_calls", 2**16),
            ("max_assistant_turns", 2**16),
            ("max_trajectory_tokens", 2**20),
            ("max_assistant_tokens", 2**20),
            ("max_tool_response_tokens", 2**20),
        ):
            positive("rollout", name, getattr(self, name), high)
        if self.max_assistant_tokens > self.max_trajectory_tokens:
            raise ConfigError(
                f"rollout.max_assistant_tokens ({self.max_assistant_tokens}) must be <= "
                f"rollout.max_trajectory_tokens ({self.max_trajectory_tokens})"
            )
        if self.max_tool_response_tokens > self.max_trajectory_tokens:
            raise ConfigError(
                f"rollout.max_tool_response_tokens ({self.max_tool_response_tokens}) must be <= "
                f"rollout.max_trajectory_tokens ({self.max_trajectory_tokens})"
            )
        for name in ("max_in_flight_samples", "max_in_flight_tools"):
            positive("rollout", name, getattr(self, name), 2**16)
        for name in ("sample_retries", "sandbox_retries"):
            at_least("rollout", name, getattr(self, name), 0, 1000)
        at_least("rollout", "min_observation_tokens", self.min_observation_tokens, 0)
        at_least("rollout", "retry_backoff", self.retry_backoff, 0, 3600)
        check_range("rollout", "seed", self.seed, 0, SEED_MAX, integer=True)
        if self.min_observation_tokens > self.max_tool_response_tokens:
            raise ConfigError(
                f"rollout.min_observation_tokens ({self.min_observation_tokens}) must be <= "
                f"rollout.max_tool_response_tokens ({self.max_tool_response_tokens})"
            )
        if self.advantage not in ("mean", "mean_std"):
            raise ConfigError(f"rollout.advantage must be mean or mean_std; got {self.advantage!r}")
        check_range("rollout", "max_oversample", self.max_oversample, 0, 2**16, integer=True)
        if self.dynamic_sampling and self.group_size < 2:
            raise ConfigError(
                "rollout.dynamic_sampling needs rollout.group_size >= 2: a group of one always "
                "scores alike, so every question would be dropped; raise rollout.group_size "
                "or set rollout.dynamic_sampling = false"
            )
        at_least("rollout", "temperature", self.temperature, 0, 100)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.protocol not in PROTOCOL_NAMES:
            raise ConfigError(
                f"rollout.protocol must be one of {', '.join(PROTOCOL_NAMES)}; "
                f"got {self.protocol!r}"
            )
