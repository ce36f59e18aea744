"""One config system: frozen dataclasses, validated on construction, read from TOML.

A run is described by :class:`RunConfig`, one TOML table per section::

    [rollout]
    group_size = 8
    protocol = "markdown"

    [sandbox]
    timeout = 10.0

Any value can be overridden on the command line with ``--set
section.key=value`` (the value is parsed as TOML, falling back to a plain
string). Every check raises :class:`~retool.errors.ConfigError` naming the field
and the allowed range, so a bad value fails before any model is loaded instead
of hanging a worker pool or crashing at datum-build time, as the reference did.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from retool.errors import ConfigError

C = TypeVar("C")


def _finite(section: str, name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{section}.{name} must be a finite number, got {value}")


def _positive(section: str, name: str, value: float) -> None:
    _finite(section, name, value)
    if value <= 0:
        raise ConfigError(f"{section}.{name} must be > 0, got {value}")


def _at_least(section: str, name: str, value: float, low: float) -> None:
    _finite(section, name, value)
    if value < low:
        raise ConfigError(f"{section}.{name} must be >= {low}, got {value}")


@dataclass(frozen=True)
class ModelConfig:
    """Which model and backend to train."""

    base_model: str = "smollm2-135m-instruct"  # alias, .gguf file or HF directory
    backend: str = "local"  # local | pytrio | tinker
    lora_rank: int = 32  # LoRA rank; 0 trains all weights
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16

    def __post_init__(self) -> None:
        if self.backend not in {"local", "pytrio", "tinker"}:
            raise ConfigError(
                f"model.backend must be one of local, pytrio, tinker; got {self.backend!r}"
            )
        _at_least("model", "lora_rank", self.lora_rank, 0)
        if self.dtype not in {"auto", "float32", "bfloat16", "float16"}:
            raise ConfigError(
                f"model.dtype must be auto, float32, bfloat16 or float16; got {self.dtype!r}"
            )


@dataclass(frozen=True)
class DataConfig:
    """Where training and evaluation questions come from."""

    train: str = "demo:train"  # "demo:<split>" or a .jsonl/.parquet path
    dev: str = "demo:dev"  # held-out questions for evaluation
    seed: int = 42  # batch order


@dataclass(frozen=True)
class RolloutConfig:
    """Budgets and sampling of one rollout (see ARCHITECTURE.md)."""

    group_size: int = 8  # trajectories per question; advantages are centred per group
    max_code_calls: int = 4  # tool calls that may enter one trajectory
    max_assistant_turns: int = 6  # assistant turns recorded per trajectory
    max_trajectory_tokens: int = 8192  # prompt + everything generated, per trajectory
    max_assistant_tokens: int = 1024  # new tokens per assistant turn
    max_tool_response_tokens: int = 512  # tokens of one observation
    temperature: float = 1.0  # sampling temperature (0 = greedy)
    top_p: float = 1.0  # nucleus mass, in (0, 1]
    seed: int = 42  # base sampling seed; mixed with step, question, group and turn
    protocol: str = "markdown"  # tool-call dialect: markdown | hermes_json | qwen3_xml
    min_observation_tokens: int = 32  # room kept free before a turn so a call can be answered
    max_in_flight_samples: int = 64  # sampled sequences requested at once (a group counts G)
    max_in_flight_tools: int = 16  # sandbox calls submitted at once
    sample_retries: int = 2  # extra attempts after a sampler failure (exception, bad reply)
    sandbox_retries: int = 2  # extra attempts after a sandbox infrastructure failure
    retry_backoff: float = 0.5  # seconds before the first retry; doubles each attempt
    advantage: str = "mean"  # mean: R - mean(group) | mean_std: (R - mean) / (std + 1e-6)
    share_identical_code: bool = False  # run identical code of one question group once

    def __post_init__(self) -> None:
        for name in (
            "group_size",
            "max_code_calls",
            "max_assistant_turns",
            "max_trajectory_tokens",
            "max_assistant_tokens",
            "max_tool_response_tokens",
        ):
            _positive("rollout", name, getattr(self, name))
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
            _positive("rollout", name, getattr(self, name))
        for name in ("sample_retries", "sandbox_retries", "min_observation_tokens"):
            _at_least("rollout", name, getattr(self, name), 0)
        _at_least("rollout", "retry_backoff", self.retry_backoff, 0)
        if self.min_observation_tokens > self.max_tool_response_tokens:
            raise ConfigError(
                f"rollout.min_observation_tokens ({self.min_observation_tokens}) must be <= "
                f"rollout.max_tool_response_tokens ({self.max_tool_response_tokens})"
            )
        if self.advantage not in ("mean", "mean_std"):
            raise ConfigError(f"rollout.advantage must be mean or mean_std; got {self.advantage!r}")
        _at_least("rollout", "temperature", self.temperature, 0)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        from retool.protocol import PROTOCOL_NAMES

        if self.protocol not in PROTOCOL_NAMES:
            raise ConfigError(
                f"rollout.protocol must be one of {', '.join(PROTOCOL_NAMES)}; "
                f"got {self.protocol!r}"
            )


@dataclass(frozen=True)
class SandboxConfig:
    """Where and with which limits model code runs.

    ``backend = "local"`` runs it in :class:`~retool.sandbox.LocalSandbox` on
    this machine; ``"sandboxfusion"`` sends it to a SandboxFusion service at
    ``url`` (:class:`~retool.sandbox.fusion.FusionSandbox`), with the same
    results, limits and auto-print. ``isolation`` is the local sandbox's
    setting (the service isolates as it is deployed, so only ``auto`` is
    accepted there); ``url`` and the ``request_*`` settings are read by the
    service client only and ignored by the local sandbox.
    """

    timeout: float = 10.0  # wall-clock seconds per call
    memory_mb: int = 1024  # memory cap per call (sent as memory_limit_MB to the service)
    max_workers: int = 8  # calls running at once (HTTP requests in flight, for the service)
    max_output_bytes: int = 16384  # kept of stdout and of stderr (the tail)
    isolation: str = "auto"  # local: auto | strict | none
    backend: str = "local"  # local | sandboxfusion
    url: str = ""  # sandboxfusion: the service's http(s) base URL or its /run_code endpoint
    request_slack: float = 60.0  # sandboxfusion: seconds a reply may take beyond timeout
    request_retries: int = 3  # sandboxfusion: extra attempts after a transport failure
    request_backoff: float = 0.5  # sandboxfusion: seconds before the first retry; doubles

    def __post_init__(self) -> None:
        _positive("sandbox", "timeout", self.timeout)
        _positive("sandbox", "memory_mb", self.memory_mb)
        _positive("sandbox", "max_workers", self.max_workers)
        _positive("sandbox", "max_output_bytes", self.max_output_bytes)
        if self.isolation not in {"auto", "strict", "none"}:
            raise ConfigError(
                f"sandbox.isolation must be auto, strict or none; got {self.isolation!r}"
            )
        if self.backend not in {"local", "sandboxfusion"}:
            raise ConfigError(
                f"sandbox.backend must be local or sandboxfusion; got {self.backend!r}"
            )
        _positive("sandbox", "request_slack", self.request_slack)
        _at_least("sandbox", "request_retries", self.request_retries, 0)
        _at_least("sandbox", "request_backoff", self.request_backoff, 0)
        if self.backend == "sandboxfusion":
            from retool.sandbox.fusion import parse_endpoint

            parse_endpoint(self.url, "sandbox.url")
            if self.isolation != "auto":
                raise ConfigError(
                    f"sandbox.isolation = {self.isolation!r} applies to the local sandbox only; "
                    'with sandbox.backend = "sandboxfusion" the service isolates calls as it is '
                    'deployed: leave sandbox.isolation = "auto"'
                )


@dataclass(frozen=True)
class RewardConfig:
    """How answers are scored."""

    timeout: float = 5.0  # seconds per equivalence check; a timeout scores -1
    workers: int = 2  # verifier processes
    function: str = ""  # "package.module:function" for a custom reward; "" = boxed answer

    def __post_init__(self) -> None:
        _positive("reward", "timeout", self.timeout)
        _positive("reward", "workers", self.workers)


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop (defaults are the reference's)."""

    steps: int = 20  # training steps (one optimizer step each)
    questions_per_batch: int = 8  # questions per step; trajectories = this x group_size
    loss: str = "ppo"  # ppo | importance_sampling | cispo
    clip_low: float = 0.8  # PPO/CISPO ratio clip, lower bound (absolute)
    clip_high: float = 1.28  # PPO/CISPO ratio clip, upper bound (absolute)
    loss_aggregation: str = "seq_mean"  # seq_mean | token_mean | token_sum
    learning_rate: float = 4e-5  # AdamW
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.95  # AdamW second-moment decay
    eps: float = 1e-12  # AdamW epsilon
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    grad_clip_norm: float = 0.0  # global gradient-norm clip; 0 disables
    max_train_tokens: int = 8192  # longest datum the trainer accepts
    micro_batch_tokens: int = 16384  # padded-area budget per forward_backward
    micro_batch_items: int = 32  # datums per forward_backward at most
    save_every: int = 10  # checkpoint period in steps; 0 saves only at the end
    eval_every: int = 0  # evaluate the policy every this many steps; 0 never
    eval_dataset: str = ""  # problems for those evaluations; "" = data.dev
    eval_n: int = 4  # samples per problem in those evaluations
    eval_limit: int = 0  # first this many problems; 0 = all
    seed: int = 0  # LoRA initialisation
    run_dir: str = "runs/default"  # metrics, checkpoints, samples

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "questions_per_batch",
            "max_train_tokens",
            "micro_batch_tokens",
            "micro_batch_items",
        ):
            _positive("train", name, getattr(self, name))
        _positive("train", "eval_n", self.eval_n)
        for name in (
            "learning_rate",
            "weight_decay",
            "grad_clip_norm",
            "save_every",
            "eps",
            "eval_every",
            "eval_limit",
        ):
            _at_least("train", name, getattr(self, name), 0)
        for name in ("beta1", "beta2"):
            _at_least("train", name, getattr(self, name), 0)
            if getattr(self, name) >= 1:
                raise ConfigError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.loss not in ("ppo", "importance_sampling", "cispo"):
            raise ConfigError(
                f"train.loss must be ppo, importance_sampling or cispo; got {self.loss!r}"
            )
        _positive("train", "clip_low", self.clip_low)
        _finite("train", "clip_high", self.clip_high)
        if not self.clip_low <= 1 <= self.clip_high:
            raise ConfigError(
                f"train.clip_low <= 1 <= train.clip_high must hold, got {self.clip_low} "
                f"and {self.clip_high}"
            )
        if self.loss_aggregation not in ("seq_mean", "token_mean", "token_sum"):
            raise ConfigError(
                "train.loss_aggregation must be seq_mean, token_mean or token_sum; "
                f"got {self.loss_aggregation!r}"
            )
        if self.max_train_tokens > self.micro_batch_tokens:
            raise ConfigError(
                f"train.max_train_tokens ({self.max_train_tokens}) must be <= "
                f"train.micro_batch_tokens ({self.micro_batch_tokens}): a longest datum "
                "must fit one micro-batch"
            )
        if not self.run_dir.strip():
            raise ConfigError("train.run_dir must not be empty")


@dataclass(frozen=True)
class CostConfig:
    """Spend accounting and the budget stop (:mod:`retool.training.cost`).

    Every step records its tokens whatever this section says; prices turn
    them into money. Three kinds, counted from the step's own data:
    *prefill* (prompt tokens sent to the sampler: each sampling request's
    full prompt, once per request, as a remote service bills it; the local
    prefix cache does not change the count), *sampled* (completion tokens
    received) and *trained* (input tokens of the datums sent to
    ``forward_backward``). A limit stops the run cleanly, with a checkpoint,
    before a step that would take the run past it (the next step is
    projected as the mean of the steps so far); 0 means no limit.
    """

    prefill_price: float = 0.0  # money per million prefill tokens
    sample_price: float = 0.0  # money per million sampled tokens
    train_price: float = 0.0  # money per million trained tokens
    currency: str = "USD"  # label of the money in metrics and log lines
    max_tokens: int = 0  # limit on the run's prefill + sampled + trained tokens; 0 = none
    max_money: float = 0.0  # limit on the run's money (needs a price); 0 = none

    def __post_init__(self) -> None:
        for name in ("prefill_price", "sample_price", "train_price", "max_tokens", "max_money"):
            _at_least("cost", name, getattr(self, name), 0)
        if not self.currency.strip():
            raise ConfigError("cost.currency must not be empty")
        if self.max_money > 0 and not self.priced:
            raise ConfigError(
                "cost.max_money needs a price: set cost.prefill_price, cost.sample_price "
                "or cost.train_price (money per million tokens)"
            )

    @property
    def priced(self) -> bool:
        """Whether any price is set (money is recorded only then)."""
        return self.prefill_price > 0 or self.sample_price > 0 or self.train_price > 0


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs, one field per TOML section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cost: CostConfig = field(default_factory=CostConfig)

    def __post_init__(self) -> None:
        if self.rollout.max_trajectory_tokens > self.train.max_train_tokens:
            raise ConfigError(
                f"rollout.max_trajectory_tokens ({self.rollout.max_trajectory_tokens}) must be "
                f"<= train.max_train_tokens ({self.train.max_train_tokens}): longer trajectories "
                "could be sampled but never trained on"
            )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


def _coerce(where: str, annotation: Any, value: Any) -> Any:
    """Check ``value`` against a field's annotation (int, float, str, bool, tuple)."""
    hint = annotation
    if isinstance(hint, str):
        hint = {"int": int, "float": float, "str": str, "bool": bool}.get(hint, hint)
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(where, options[0], value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def build_section(cls: type[C], values: dict[str, Any], section: str) -> C:
    """Instantiate a section dataclass from a mapping, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) in [{section}]: {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(known))}"
        )
    kwargs = {k: _coerce(f"{section}.{k}", hints[k], v) for k, v in values.items()}
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"section.key=value"`` -> (section, key, value); the value is read as TOML."""
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    dotted, raw = text.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word such as markdown
    return parts[0], parts[1], value


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: typing.Sequence[str] = ()
) -> RunConfig:
    """Read a TOML config (or the defaults), apply ``--set`` overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    sections = {f.name: f for f in dataclasses.fields(RunConfig)}
    for name, value in raw.items():
        if name not in sections:
            raise ConfigError(f"{path}: unknown section [{name}]; allowed: {', '.join(sections)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
    for text in overrides:
        section, key, value = parse_override(text)
        if section not in sections:
            raise ConfigError(
                f"--set {text}: unknown section {section!r}; allowed: {', '.join(sections)}"
            )
        raw.setdefault(section, {})[key] = value
    hints = typing.get_type_hints(RunConfig)
    built = {name: build_section(hints[name], raw.get(name, {}), name) for name in sections}
    return RunConfig(**built)
