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
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

# The limits each section checks belong to the code they protect (a config the
# sandbox or a service would refuse is refused here, before anything starts).
from retool.backends.pytrio import check_rank as check_pytrio_rank
from retool.backends.tinker import check_rank as check_tinker_rank
from retool.checks import SEED_MAX, check_device, check_number, check_path_text
from retool.data.files import read_text
from retool.data.longints import toml_loads
from retool.errors import ConfigError
from retool.protocol import PROTOCOL_NAMES
from retool.sandbox.fusion_endpoint import parse_endpoint
from retool.sandbox.limits import (
    MAX_OUTPUT_BYTES,
    MAX_REQUEST_RETRIES,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    MEMORY_MB_RANGE,
)

C = TypeVar("C")


def check_range(
    section: str,
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    integer: bool | None = None,
    low_open: bool = False,
) -> None:
    """:func:`check_number` for config field ``section.name``.

    Pass ``integer`` for an ``int`` field (``None`` only checks an int value as
    an integer, which older callers rely on).
    """
    check_number(
        f"{section}.{name}",
        value,
        low,
        high,
        integer=isinstance(value, int) if integer is None else integer,
        low_open=low_open,
    )


def _finite(section: str, name: str, value: float) -> None:
    check_range(section, name, value)


def _positive(section: str, name: str, value: float, high: float | None = None) -> None:
    check_range(section, name, value, 0, high, low_open=True)


def _at_least(section: str, name: str, value: float, low: float, high: float | None = None) -> None:
    check_range(section, name, value, low, high)


def expand_home(config: Any, *names: str) -> None:
    """A leading ``~`` in a path setting is the home directory, the same for every command."""
    for name in names:
        value = getattr(config, name)
        if value.startswith("~"):
            object.__setattr__(config, name, os.path.expanduser(value))


LOSS_REDUCTIONS = ("auto", "sum", "active_token_mean", "advantage_token_mean")


@dataclass(frozen=True)
class ModelConfig:
    """Which model and backend to train.

    ``backend = "local"`` trains on this machine; ``"pytrio"`` and ``"tinker"``
    on those training services through their SDKs (the ``pytrio`` / ``tinker``
    extras; :mod:`retool.backends.remote`). The services train LoRA adapters
    only: ``lora_rank`` in [4, 64] on PyTRIO (its SDK refuses other ranks before
    any request), >= 1 on Tinker; ``base_model`` is the service's model name
    (``"Qwen/Qwen3-8B"``); ``device``, ``dtype`` and ``compile`` (:mod:`retool.backends.
    local.compiled`) are the local backend's.

    ``loss_reduction`` says how the service reduces the per-token losses of
    one ``forward_backward`` call. Our contract is their *sum*
    (:mod:`retool.types`); for a service that divides by a count, the adapter
    multiplies the advantages (cross-entropy: the weights) by that same count,
    which gives the same update for the same advantages on every backend:

    * ``sum``: the service sums; advantages are sent unchanged. The local
      backend sums, and so does Tinker: its SDK relies on "Backend CE is
      L = sum(-logprobs * weights)" and sums ``loss:sum`` over chunks
      (tinker/lib/public_interfaces/training_client.py: ``_compute_custom_loss``;
      tinker/lib/chunked_fwdbwd_helpers.py).
    * ``active_token_mean``: divides by the call's ``total_active_tokens``:
      positions whose target is not -100 (every position of our datums, prompt
      and observation positions included), for cross-entropy only those with a
      non-zero weight.
    * ``advantage_token_mean``: divides by ``total_advantage_tokens``, the
      positions with a non-zero advantage (cross-entropy: as above).
    * ``auto`` (default): ``sum`` on local and Tinker, ``active_token_mean`` on
      PyTRIO.

    Why ``active_token_mean`` for PyTRIO: its service code is not public and
    was unreachable when the adapter was written, so this rests on the SDK
    (``pytrio`` 0.2.9). Every chunk of a call carries the whole call's
    ``total_samples``, ``total_active_tokens`` and ``total_advantage_tokens``,
    documented as the global normalisation the trainer uses to compute the
    equivalent full-batch gradient (pytrio/protocol/actor/events/trainer/
    forward.py: ``GradientAccumulationSpec``); advantage tokens are "the
    separate denominator for DRO and similar normalisation modes", with
    zero-advantage labels counted as active (pytrio/client/training_batch.py:
    ``plan_training_batch``); the SDK's ``forward_backward_custom`` promises
    only the same gradient *direction* as the user's loss (pytrio/client/
    training.py); and results report ``loss_mean = loss_sum / token_count``.
    So a policy loss is divided by the active tokens. Should PyTRIO document
    another reduction, set the matching value here: nothing else changes.
    """

    base_model: str = "smollm2-135m-instruct"  # alias, .gguf file, HF directory or service name
    backend: str = "local"  # local | pytrio | tinker
    lora_rank: int = 32  # LoRA rank, in [0, 4096]; 0 trains all weights (local backend only)
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | float32 | bfloat16
    compile: str = "auto"  # auto | on | off: fused element-wise kernels for the local trainer
    loss_reduction: str = "auto"  # auto | sum | active_token_mean | advantage_token_mean

    def __post_init__(self) -> None:
        if self.backend not in {"local", "pytrio", "tinker"}:
            raise ConfigError(
                f"model.backend must be one of local, pytrio, tinker; got {self.backend!r}"
            )
        # a rank past any hidden size is a typo: it would end in a failed allocation
        check_range("model", "lora_rank", self.lora_rank, 0, 2**12, integer=True)
        check_device(self.device)
        if self.dtype not in {"auto", "float32", "bfloat16", "float16"}:
            raise ConfigError(
                f"model.dtype must be auto, float32, bfloat16 or float16; got {self.dtype!r}"
            )
        if self.compile not in {"auto", "on", "off"}:
            raise ConfigError(f"model.compile must be auto, on or off; got {self.compile!r}")
        if self.loss_reduction not in LOSS_REDUCTIONS:
            raise ConfigError(
                f"model.loss_reduction must be one of {', '.join(LOSS_REDUCTIONS)}; "
                f"got {self.loss_reduction!r}"
            )
        if self.backend == "local" and self.loss_reduction not in ("auto", "sum"):
            raise ConfigError(
                "model.loss_reduction describes a remote service; the local backend sums "
                f'(use "auto" or "sum"), got {self.loss_reduction!r}'
            )
        if self.backend != "local":
            if self.compile == "on":
                raise ConfigError(
                    f"model.compile = on describes the local trainer; {self.backend} compiles "
                    'its own kernels (use "auto" or "off")'
                )
            if self.lora_rank == 0:
                raise ConfigError(
                    f"model.lora_rank = 0 (full fine-tuning) is not offered by {self.backend}: "
                    "it trains LoRA adapters; set model.lora_rank (for example 32)"
                )
            check_rank = check_pytrio_rank if self.backend == "pytrio" else check_tinker_rank
            check_rank(self.lora_rank)


@dataclass(frozen=True)
class DataConfig:
    """Where training and evaluation questions come from."""

    train: str = "demo:train"  # "demo:<split>" or a .jsonl/.parquet path
    dev: str = "demo:dev"  # held-out questions for evaluation
    seed: int = 42  # batch order, in [0, 2**32 - 1]

    def __post_init__(self) -> None:
        check_path_text("data.train", self.train)
        check_path_text("data.dev", self.dev)
        expand_home(self, "train", "dev")
        check_range("data", "seed", self.seed, 0, SEED_MAX, integer=True)


@dataclass(frozen=True)
class RolloutConfig:
    """Budgets and sampling of one rollout (see ARCHITECTURE.md)."""

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
            _positive("rollout", name, getattr(self, name), high)
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
            _positive("rollout", name, getattr(self, name), 2**16)
        for name in ("sample_retries", "sandbox_retries"):
            _at_least("rollout", name, getattr(self, name), 0, 1000)
        _at_least("rollout", "min_observation_tokens", self.min_observation_tokens, 0)
        _at_least("rollout", "retry_backoff", self.retry_backoff, 0, 3600)
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
        _at_least("rollout", "temperature", self.temperature, 0, 100)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
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

    timeout: float = 10.0  # wall-clock seconds per call, in (0, 86400]
    # MiB of headroom per call above the preloaded interpreter (not a total cap), in
    # [16, 2**20]; sent as memory_limit_MB to the service, which applies it as deployed
    memory_mb: int = 1024
    max_workers: int = 8  # calls running at once (HTTP requests in flight), in [1, 256]
    max_output_bytes: int = 16384  # kept of stdout and of stderr (the tail), in [1, 2**23]
    isolation: str = "auto"  # local: auto | strict | none
    backend: str = "local"  # local | sandboxfusion
    url: str = ""  # sandboxfusion: the service's http(s) base URL or its /run_code endpoint
    request_slack: float = 60.0  # sandboxfusion: seconds a reply may take beyond timeout
    request_retries: int = 3  # sandboxfusion: extra attempts after a transport failure
    request_backoff: float = 0.5  # sandboxfusion: seconds before the first retry; doubles

    def __post_init__(self) -> None:
        _positive("sandbox", "timeout", self.timeout, MAX_TIMEOUT_S)
        check_range("sandbox", "memory_mb", self.memory_mb, *MEMORY_MB_RANGE, integer=True)
        # (0, n] is [1, n] for an integer, said as "> 0" like the other counts
        check_range(
            "sandbox", "max_workers", self.max_workers, 0, MAX_WORKERS, integer=True, low_open=True
        )
        check_range(
            "sandbox",
            "max_output_bytes",
            self.max_output_bytes,
            0,
            MAX_OUTPUT_BYTES,
            integer=True,
            low_open=True,
        )
        if self.isolation not in {"auto", "strict", "none"}:
            raise ConfigError(
                f"sandbox.isolation must be auto, strict or none; got {self.isolation!r}"
            )
        if self.backend not in {"local", "sandboxfusion"}:
            raise ConfigError(
                f"sandbox.backend must be local or sandboxfusion; got {self.backend!r}"
            )
        _positive("sandbox", "request_slack", self.request_slack, MAX_TIMEOUT_S)
        check_range(
            "sandbox", "request_retries", self.request_retries, 0, MAX_REQUEST_RETRIES, integer=True
        )
        _at_least("sandbox", "request_backoff", self.request_backoff, 0, MAX_TIMEOUT_S)
        if self.backend == "sandboxfusion":
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

    timeout: float = 5.0  # seconds per equivalence check, in (0, 3600]; a timeout scores -1
    workers: int = 2  # verifier processes, in [1, 256]
    function: str = ""  # "package.module:function" for a custom reward; "" = boxed answer

    def __post_init__(self) -> None:
        check_range("reward", "timeout", self.timeout, 0, 3600, integer=False, low_open=True)
        check_range("reward", "workers", self.workers, 1, 256, integer=True)
        check_path_text("reward.function", self.function, empty=True)
        if self.function and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.function):
            raise ConfigError(
                "reward.function must look like 'package.module:function' (or \"\" for the "
                f"boxed-answer reward), got {self.function!r}"
            )


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop (defaults are the reference's)."""

    steps: int = 20  # training steps (updates_per_step optimizer steps each), in [1, 10**7]
    questions_per_batch: int = 8  # questions per step, in [1, 2**16]; trajectories: x group_size
    # optimizer updates per step, each on a contiguous share of the step's groups (PPO
    # mini-batches; retool.training.updates), in [1, questions_per_batch]
    updates_per_step: int = 1
    loss: str = "ppo"  # ppo | importance_sampling | cispo
    clip_low: float = 0.8  # PPO/CISPO ratio clip, lower bound (absolute), in (0, 1]
    clip_high: float = 1.28  # PPO/CISPO ratio clip, upper bound (absolute), in [1, 100]
    loss_aggregation: str = "seq_mean"  # seq_mean | token_mean | token_sum
    learning_rate: float = 4e-5  # AdamW, in [0, 1]
    beta1: float = 0.9  # AdamW first-moment decay, in [0, 1)
    beta2: float = 0.95  # AdamW second-moment decay, in [0, 1)
    eps: float = 1e-12  # AdamW epsilon, in (0, 1]
    weight_decay: float = 0.0  # AdamW decoupled weight decay, in [0, 1]
    grad_clip_norm: float = 0.0  # global gradient-norm clip, in [0, 1e6]; 0 disables
    max_train_tokens: int = 8192  # longest datum the trainer accepts, in [1, 2**20]
    micro_batch_tokens: int = 16384  # padded-area budget per forward_backward, [1, 2**24]
    micro_batch_items: int = 32  # datums per forward_backward at most, in [1, 2**16]
    save_every: int = 10  # checkpoint period in steps, in [0, 10**7]; 0: only at the end
    eval_every: int = 0  # evaluate the policy every this many steps, in [0, 10**7]; 0 never
    eval_dataset: str = ""  # problems for those evaluations; "" = data.dev
    eval_n: int = 4  # samples per problem in those evaluations, in [1, 1024]
    eval_limit: int = 0  # first this many problems, in [0, 10**7]; 0 = all
    seed: int = 0  # LoRA initialisation, in [0, 2**32 - 1]
    run_dir: str = "runs/default"  # metrics, checkpoints, samples
    # Sampler/trainer numerics (retool.training.numerics): where pi_old comes from, and the
    # rollout correction (auto: none when sampler and trainer are float32, else tis).
    old_logprobs: str = "sampler"  # sampler | recompute (one trainer forward per step)
    rollout_correction: str = "auto"  # auto | none | tis | mis
    rollout_correction_cap: float = 2.0  # C: TIS cap, MIS keeps ratios in [1/C, C]; (1, 100]

    def __post_init__(self) -> None:
        if self.old_logprobs not in ("sampler", "recompute"):
            raise ConfigError(
                f"train.old_logprobs must be sampler or recompute; got {self.old_logprobs!r}"
            )
        if self.rollout_correction not in ("auto", "none", "tis", "mis"):
            raise ConfigError(
                "train.rollout_correction must be auto, none, tis or mis; "
                f"got {self.rollout_correction!r}"
            )
        check_range(
            "train", "rollout_correction_cap", self.rollout_correction_cap, 1, 100, low_open=True
        )
        ints = {  # name: (low, high); every bound is inclusive
            "steps": (1, 10**7),
            "questions_per_batch": (1, 2**16),
            "updates_per_step": (1, 2**16),
            "max_train_tokens": (1, 2**20),
            "micro_batch_tokens": (1, 2**24),
            "micro_batch_items": (1, 2**16),
            "save_every": (0, 10**7),
            "eval_every": (0, 10**7),
            "eval_n": (1, 1024),
            "eval_limit": (0, 10**7),
            "seed": (0, SEED_MAX),
        }
        for name, (low, high) in ints.items():
            check_range("train", name, getattr(self, name), low, high, integer=True)
        floats: dict[str, tuple[float, float]] = {
            "learning_rate": (0, 1),
            "weight_decay": (0, 1),
            "grad_clip_norm": (0, 1e6),
            "clip_high": (1, 100),
        }
        for name, (lowest, highest) in floats.items():
            check_range("train", name, getattr(self, name), lowest, highest, integer=False)
        check_range("train", "eps", self.eps, 0, 1, integer=False, low_open=True)
        check_range("train", "clip_low", self.clip_low, 0, 1, integer=False, low_open=True)
        for name in ("beta1", "beta2"):
            check_range("train", name, getattr(self, name), 0, 1, integer=False)
            if getattr(self, name) >= 1:
                raise ConfigError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.loss not in ("ppo", "importance_sampling", "cispo"):
            raise ConfigError(
                f"train.loss must be ppo, importance_sampling or cispo; got {self.loss!r}"
            )
        if self.loss_aggregation not in ("seq_mean", "token_mean", "token_sum"):
            raise ConfigError(
                "train.loss_aggregation must be seq_mean, token_mean or token_sum; "
                f"got {self.loss_aggregation!r}"
            )
        if self.updates_per_step > self.questions_per_batch:
            raise ConfigError(
                f"train.updates_per_step ({self.updates_per_step}) must be <= "
                f"train.questions_per_batch ({self.questions_per_batch}): each update trains "
                "on whole groups, at least one"
            )
        if self.max_train_tokens > self.micro_batch_tokens:
            raise ConfigError(
                f"train.max_train_tokens ({self.max_train_tokens}) must be <= "
                f"train.micro_batch_tokens ({self.micro_batch_tokens}): a longest datum "
                "must fit one micro-batch"
            )
        check_path_text("train.eval_dataset", self.eval_dataset, empty=True)
        check_path_text("train.run_dir", self.run_dir)
        expand_home(self, "eval_dataset", "run_dir")


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
class DemoConfig:
    """What ``retool demo`` runs around the RL steps (``train.*`` stay the RL settings).

    Only ``retool demo`` reads this section; every other command ignores it, as
    ``retool eval`` ignores ``train.*``. The demo evaluates on two held-out
    splits by default: ``demo:test`` (new numbers, phrasings seen in training)
    and ``demo:paraphrase`` (phrasings no training data uses). The settings
    here were chosen on ``demo:dev``, so the tables it prints are measured on
    problems nothing was tuned on.
    """

    sft_steps: int = 40  # cold-start SFT steps on demonstrations from data.train
    sft_batch: int = 4  # demonstrations per SFT step (40 x 4 beat 20 x 8 and 10 x 16 on demo:dev)
    sft_learning_rate: float = 1e-3  # AdamW learning rate of the cold start
    rl_steps: int = 6  # RL steps from the SFT checkpoint (train.* holds their settings)
    eval_dataset: str = "demo:test"  # held-out problems for base / SFT / RL
    # held-out phrasings, evaluated like eval_dataset; "" = none
    paraphrase_dataset: str = "demo:paraphrase"
    eval_n: int = 4  # samples per problem, the same seeds for all three policies
    eval_limit: int = 0  # first this many problems; 0 = all
    eval_temperature: float = 0.7  # sampling temperature of the evaluations
    eval_top_p: float = 1.0  # nucleus mass of the evaluations

    def __post_init__(self) -> None:
        check_range("demo", "sft_steps", self.sft_steps, 0, 10_000, integer=True)
        check_range("demo", "sft_batch", self.sft_batch, 1, 4096, integer=True)
        check_range("demo", "sft_learning_rate", self.sft_learning_rate, 0, 1, low_open=True)
        check_range("demo", "rl_steps", self.rl_steps, 0, 10_000, integer=True)
        check_path_text("demo.eval_dataset", self.eval_dataset)
        check_path_text("demo.paraphrase_dataset", self.paraphrase_dataset, empty=True)
        expand_home(self, "eval_dataset", "paraphrase_dataset")
        check_range("demo", "eval_n", self.eval_n, 1, 1024, integer=True)
        check_range("demo", "eval_limit", self.eval_limit, 0, 10**7, integer=True)
        check_range("demo", "eval_temperature", self.eval_temperature, 0, 100)
        check_range("demo", "eval_top_p", self.eval_top_p, 0, 1, low_open=True)


@dataclass(frozen=True)
class SamplerConfig:
    """Which engine samples the rollouts (:mod:`retool.backends.vllm`); the trainer is
    ``model.backend``'s either way.

    ``engine = "local"`` (default) samples with the local backend's own sampler
    from a frozen copy of the trainer's weights. ``"vllm"`` samples with vLLM
    (the ``vllm`` extra): in this process when ``urls`` is empty, else from
    ``vllm serve`` endpoints at ``urls``. After each optimizer step the
    trainer's weights reach the engine by ``sync``: ``lora`` publishes the
    adapter under a new id (``policy-step-N``), ``merged`` writes the merged
    weights into the engine in place. Every sample carries the policy version
    the engine used, and the rollout refuses one that is not the step's.
    """

    engine: str = "local"  # local | vllm
    dtype: str = "float32"  # vllm: float32 | bfloat16 | float16 (float32 keeps logprobs to 1e-4)
    sync: str = "merged"  # vllm: merged | lora (see the README's measurements)
    enforce_eager: bool = True  # vllm: no graph compilation (start-up ~17 s instead of ~67 s)
    max_model_len: int = 0  # vllm: longest prompt + completion; 0 = train.max_train_tokens
    kv_cache_gb: int = 1  # vllm on CPU: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE), [1, 1024]
    gpu_memory_utilization: float = 0.9  # vllm on a GPU: share of its memory, in (0, 1]
    threads_bind: str = "auto"  # vllm on CPU: VLLM_CPU_OMP_THREADS_BIND; auto = every core
    urls: str = ""  # vllm serve base URLs, comma-separated (http://host:port); "" = in-process

    def __post_init__(self) -> None:
        if self.engine not in ("local", "vllm"):
            raise ConfigError(f"sampler.engine must be local or vllm; got {self.engine!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(
                f"sampler.dtype must be float32, bfloat16 or float16; got {self.dtype!r}"
            )
        if self.sync not in ("lora", "merged"):
            raise ConfigError(f"sampler.sync must be lora or merged; got {self.sync!r}")
        check_range("sampler", "max_model_len", self.max_model_len, 0, 2**24, integer=True)
        check_range("sampler", "kv_cache_gb", self.kv_cache_gb, 1, 1024, integer=True)
        check_range(
            "sampler",
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            0,
            1,
            integer=False,
            low_open=True,
        )
        if not re.fullmatch(
            r"auto|nobind|\d+(-\d+)?(,\d+(-\d+)?)*(\|\d+(-\d+)?(,\d+(-\d+)?)*)*", self.threads_bind
        ):
            raise ConfigError(
                'sampler.threads_bind must be "auto", "nobind" or CPU ids such as "0-1"; '
                f"got {self.threads_bind!r}"
            )
        if self.url_list and self.engine == "local":
            raise ConfigError(
                'sampler.urls names vllm serve endpoints, but sampler.engine = "local" samples '
                "with the local backend's own sampler and would ignore them: set "
                'sampler.engine = "vllm" (and sampler.sync = "lora") or sampler.urls = ""'
            )
        for url in self.url_list:
            _check_url(url)
        if self.engine == "vllm" and self.url_list and self.sync != "lora":
            raise ConfigError(
                'sampler.urls (vllm serve) syncs by adapter only: set sampler.sync = "lora" '
                '(sampler.sync = "merged" needs the in-process engine, sampler.urls = "")'
            )

    @property
    def url_list(self) -> tuple[str, ...]:
        """``urls`` split at commas, blanks dropped."""
        return tuple(u.strip() for u in self.urls.split(",") if u.strip())


def _check_url(url: str) -> None:
    """One ``sampler.urls`` entry: ``http(s)://host[:port][/path]``, with a host and a valid
    port (``http://[::1`` or ``http://h:99999`` is refused here, not by a traceback later)."""
    problem = ""
    if not re.fullmatch(r"https?://[^\s/,]+(/\S*)?", url):
        problem = "not an http(s) base URL"
    else:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:  # an unclosed [IPv6 bracket, a port out of range
            problem = str(exc)
        else:
            if not parts.hostname:
                problem = "no host"
            elif port == 0:
                problem = "port 0"
    if problem:
        raise ConfigError(
            "sampler.urls must be comma-separated http(s) base URLs of vllm serve "
            f"(http://127.0.0.1:8000); got {url!r} ({problem})"
        )


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
    demo: DemoConfig = field(default_factory=DemoConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)

    def __post_init__(self) -> None:
        if self.sampler.engine == "vllm" and self.model.backend != "local":
            raise ConfigError(
                f'sampler.engine = "vllm" needs model.backend = "local" (the trainer whose '
                f"weights it syncs); got model.backend = {self.model.backend!r}"
            )
        if (
            self.sampler.engine == "vllm"
            and self.sampler.sync == "lora"
            and not self.model.lora_rank
        ):
            raise ConfigError(
                'sampler.sync = "lora" needs a LoRA trainer (model.lora_rank > 0); with '
                'model.lora_rank = 0 use sampler.sync = "merged"'
            )
        if self.rollout.max_trajectory_tokens > self.train.max_train_tokens:
            raise ConfigError(
                f"rollout.max_trajectory_tokens ({self.rollout.max_trajectory_tokens}) must be "
                f"<= train.max_train_tokens ({self.train.max_train_tokens}): longer trajectories "
                "could be sampled but never trained on"
            )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


def _as_toml(value: Any) -> str:
    """A hint for a string that Python reads as a number but TOML does not (``.001``, ``1.``,
    ``1_0.``, ``+.5``): how to write it."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    written = str(int(number)) if number.is_integer() and "." not in value else repr(number)
    return f" (a string, not a TOML number: write {written})"


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
            raise ConfigError(f"{where} must be an integer, got {value!r}{_as_toml(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}{_as_toml(value)}")
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
            f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}; "
            f"allowed in [{section}]: {', '.join(sorted(known))}"
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
        parsed = toml_loads(f"v = {raw.strip()}", f"--set {dotted.strip()}", lines=False)
    except tomllib.TOMLDecodeError:
        return parts[0], parts[1], raw.strip()  # a bare word such as markdown
    if set(parsed) != {"v"}:  # a line break in the value set further keys: never ignore them
        raise ConfigError(
            f"--set {dotted.strip()}: the value must be one value on one line, got {raw!r}"
        )
    return parts[0], parts[1], parsed["v"]


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: typing.Sequence[str] = ()
) -> RunConfig:
    """Read a TOML config (or the defaults), apply ``--set`` overrides, validate."""
    return load_config_given(path, overrides)[0]


def load_config_given(
    path: str | os.PathLike[str] | None = None, overrides: typing.Sequence[str] = ()
) -> tuple[RunConfig, frozenset[str]]:
    """:func:`load_config`, and the ``section.key`` names the file or an override gave.

    For a command whose own default differs from the config's (``retool eval``
    samples with top_p 0.7): it applies its default only where nothing was given.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        text = read_text(path, what="config file", error=ConfigError)
        try:
            raw = toml_loads(text, str(path))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    sections = {f.name: f for f in dataclasses.fields(RunConfig)}
    for name, value in raw.items():
        if name not in sections:
            raise ConfigError(f"{path}: unknown section [{name}]; allowed: {', '.join(sections)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
    origin = {f"{s}.{k}": str(path) for s, table in raw.items() for k in table}
    for text in overrides:
        section, key, value = parse_override(text)
        if section not in sections:
            raise ConfigError(
                f"--set {text}: unknown section {section!r}; allowed: {', '.join(sections)}"
            )
        raw.setdefault(section, {})[key] = value
        origin[f"{section}.{key}"] = f"--set {text}"
    hints = typing.get_type_hints(RunConfig)
    try:
        built = {name: build_section(hints[name], raw.get(name, {}), name) for name in sections}
        return RunConfig(**built), frozenset(origin)
    except ConfigError as exc:
        raise ConfigError(_with_origin(str(exc), origin)) from None


def _with_origin(message: str, origin: dict[str, str]) -> str:
    """Prefix an error about ``section.key`` with where that value came from (file or --set)."""
    named = [key for key in origin if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message)]
    if not named:
        return message
    first = min(named, key=message.index)
    return f"{origin[first]}: {message}"
