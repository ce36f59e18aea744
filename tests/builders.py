"""The small configs several test files share, built in one place.

* :data:`TINY_RUN` / :data:`TINY_RL`: a run on ``tiny-random`` (LoRA rank 4,
  1024-token budgets), as TOML sections; ``TINY_RL`` adds what a two-step RL
  run needs to be fast and repeatable (8-token turns, one sample request and
  one sandbox worker at a time, the mixed-reward function of the training
  tests). :func:`run_toml` / :func:`write_run_toml` write one with a test's
  own keys on top, section by section.
* :func:`scripted_rollout`: a :class:`RolloutConfig` for scripted samplers and
  fake sandboxes: no backoff between retries, so a failure test takes no time.
* :func:`policy_datum`: a policy-loss datum over ``tokens`` (every position a loss
  token with one advantage and sampled logprob -10), for the trainers' numerics tests.

A test that pins a number says so with its own key, even where the base has
the same value, so the builder can change without changing what it tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from retool.config import RolloutConfig
from retool.types import Datum, ModelInput, TensorData

Sections = dict[str, dict[str, Any]]

TINY_RUN: Sections = {
    "model": {"base_model": "tiny-random", "lora_rank": 4},
    "rollout": {"max_trajectory_tokens": 1024},
    "train": {"max_train_tokens": 1024},
}

TINY_RL: Sections = {
    "model": TINY_RUN["model"],
    "rollout": {
        "max_assistant_tokens": 8,
        **TINY_RUN["rollout"],
        # One request at a time: batch composition, hence token counts, is fixed.
        "max_in_flight_samples": 1,
    },
    "sandbox": {"max_workers": 1},
    "reward": {"function": "tests.training.rewards:even_length"},  # mixed rewards per group
    "train": {"steps": 2, "questions_per_batch": 2, "learning_rate": 0.001, **TINY_RUN["train"]},
}


def merged(base: Sections, **sections: dict[str, Any]) -> Sections:
    """``base`` with each keyword's keys set in that section (a new section if need be)."""
    out = {name: dict(keys) for name, keys in base.items()}
    for name, keys in sections.items():
        out.setdefault(name, {}).update(keys)
    return out


def run_toml(base: Sections = TINY_RL, **sections: dict[str, Any]) -> str:
    """The TOML text of :func:`merged` ``(base, **sections)``."""
    lines = []
    for name, keys in merged(base, **sections).items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in keys.items()]
        lines.append("")
    return "\n".join(lines)


def write_run_toml(path: Path, base: Sections = TINY_RL, **sections: dict[str, Any]) -> Path:
    path.write_text(run_toml(base, **sections), encoding="utf-8")
    return path


def scripted_rollout(**fields: Any) -> RolloutConfig:
    """A rollout config for scripted samplers: retries without backoff, ``fields`` on top."""
    return RolloutConfig(**{"retry_backoff": 0.0, **fields})


def policy_datum(tokens: list[int], advantage: float) -> Datum:
    """``tokens`` as input and shifted targets, each target a loss token with ``advantage``."""
    n = len(tokens) - 1
    return Datum(
        ModelInput.from_ints(tokens[:-1]),
        {
            "target_tokens": TensorData.from_list(tokens[1:], "int64"),
            "logprobs": TensorData.from_list([-10.0] * n),
            "advantages": TensorData.from_list([advantage] * n),
        },
    )
