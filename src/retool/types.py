"""The Tinker-shaped contract every backend implements.

Values:
    ModelInput        a token sequence sent to a model
    TensorData        a flat numeric array with dtype and shape (``loss_fn_inputs``)
    Datum             one training example: model input + per-token loss inputs
    SamplingParams    how to sample one completion
    SamplerStop       why the sampler stopped one sequence: ``stop`` | ``length``
    SampledSequence   one completion: tokens, per-token logprobs, text, stop reason
    SampleResponse    every completion of one sampling request
    AdamParams        one AdamW step
    ForwardBackwardOutput, OptimStepOutput   what training calls return
    Future            a result that may not have arrived yet (``.result()`` / ``await``)
    Tokenizer         a Hugging Face tokenizer, as clients return it (an open type: ``Any``)

Clients (``typing.Protocol``; the method set of the pytrio/tinker SDKs, plus
what the loop uses: ``max_context_tokens``, ``close``):
    ServiceClient, TrainingClient, SamplingClient

The sandbox (``typing.Protocol``; :class:`~retool.sandbox.LocalSandbox` and
:class:`~retool.sandbox.fusion.FusionSandbox` implement it):
    Sandbox           ``run`` / ``arun`` one snippet, ``close``, ``stats``, ``timeout``

Contract shared by every backend:
    * ``loss_fn_inputs`` are already shifted by the caller: position ``t`` of
      ``target_tokens``/``logprobs``/``advantages`` describes the token predicted
      from ``model_input[: t + 1]``.
    * RL losses (``importance_sampling``, ``ppo``, ``cispo``) reduce by **sum** over
      the loss tokens of all datums in one call. A caller that wants another
      aggregation (per-trajectory mean, ``n_k/N`` micro-batch weights) scales the
      advantages before sending them.
    * Sampled ``logprobs`` are the policy's own: log-softmax of the raw logits at
      temperature 1, without top-p/top-k filtering, i.e. what ``forward`` returns
      for the same tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar, runtime_checkable

from retool.checks import check_number
from retool.errors import ConfigError

if TYPE_CHECKING:  # numpy and torch for TensorData's conversions (imported where used:
    # every command imports this contract, few convert an array, and numpy alone was a
    # third of a command's start); the sandbox's values, for Sandbox only
    import numpy as np
    import torch

    from retool.sandbox.result import ExecResult
    from retool.sandbox.stats import SandboxStats

T = TypeVar("T")

# An HF tokenizer: whatever class transformers (or a service's SDK) loads for the
# model. An open SDK type, so ``Any``, under one name the signatures share.
Tokenizer: TypeAlias = Any


@dataclass(frozen=True)
class ModelInput:
    """A sequence of token ids given to a model."""

    tokens: tuple[int, ...]  # token ids, in order

    @classmethod
    def from_ints(cls, tokens: Sequence[int]) -> ModelInput:
        return cls(tuple(int(t) for t in tokens))

    @classmethod
    def empty(cls) -> ModelInput:
        return cls(())

    def to_ints(self) -> list[int]:
        return list(self.tokens)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def append(self, tokens: Sequence[int]) -> ModelInput:
        """A new input with ``tokens`` added at the end."""
        return ModelInput(self.tokens + tuple(int(t) for t in tokens))


_DTYPES = ("float32", "int64")  # numpy's names


@dataclass(frozen=True)
class TensorData:
    """A numeric array carried inside a :class:`Datum` (flat data + shape)."""

    data: tuple[float, ...] | tuple[int, ...]  # values in row-major order
    dtype: str  # "float32" or "int64"
    shape: tuple[int, ...]  # array shape; prod(shape) == len(data)

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ConfigError(
                f"TensorData.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}"
            )
        if math.prod(self.shape) != len(self.data):
            raise ConfigError(
                f"TensorData.shape {self.shape} does not match {len(self.data)} values"
            )

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> TensorData:
        import numpy as np

        array = np.asarray(array)
        if np.issubdtype(array.dtype, np.integer):
            dtype = "int64"
            data: tuple[Any, ...] = tuple(int(x) for x in array.reshape(-1).tolist())
        else:
            dtype = "float32"
            data = tuple(float(x) for x in array.astype(np.float32).reshape(-1).tolist())
        return cls(data=data, dtype=dtype, shape=tuple(int(s) for s in array.shape))

    @classmethod
    def from_list(
        cls, values: Sequence[float] | Sequence[int], dtype: str = "float32"
    ) -> TensorData:
        import numpy as np

        if dtype not in _DTYPES:
            raise ConfigError(f"TensorData.dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        return cls.from_numpy(np.asarray(values, dtype=dtype))

    def to_numpy(self) -> np.ndarray:
        import numpy as np

        return np.asarray(self.data, dtype=self.dtype).reshape(self.shape)

    def tolist(self) -> list[Any]:
        return self.to_numpy().tolist()

    def to_torch(self) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.to_numpy().copy())


@dataclass(frozen=True)
class Datum:
    """One training example: the model input and its per-token loss inputs."""

    model_input: ModelInput  # tokens fed to the model (already shifted: input = full[:-1])
    loss_fn_inputs: Mapping[str, TensorData] = field(default_factory=dict)  # target_tokens, ...

    def __post_init__(self) -> None:
        n = self.model_input.length
        for key, value in self.loss_fn_inputs.items():
            if value.shape and value.shape[0] != n:
                raise ConfigError(
                    f"Datum.loss_fn_inputs[{key!r}] has length {value.shape[0]}, "
                    f"model_input has {n} tokens"
                )


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    max_tokens: int = 256  # new tokens at most, in [1, 2**20]
    temperature: float = 1.0  # 0 means greedy; in [0, 100]
    top_p: float = 1.0  # nucleus mass, in (0, 1]
    top_k: int = -1  # keep the k most likely tokens, in [1, 2**31 - 1]; -1 keeps all
    seed: int | None = None  # same seed + same prompt -> same tokens; in [0, 2**63 - 1]
    stop: tuple[str | int, ...] = ()  # stop strings and/or token ids (the stop is kept)

    def __post_init__(self) -> None:
        check_number("SamplingParams.max_tokens", self.max_tokens, 1, 2**20, integer=True)
        check_number("SamplingParams.temperature", self.temperature, 0, 100)
        check_number("SamplingParams.top_p", self.top_p, 0, 1, low_open=True)
        if self.top_k != -1:
            check_number(
                "SamplingParams.top_k (-1 keeps all)", self.top_k, 1, 2**31 - 1, integer=True
            )
        if self.seed is not None:
            check_number("SamplingParams.seed", self.seed, 0, 2**63 - 1, integer=True)
        stop = self.stop
        if isinstance(stop, str | int):
            stop = (stop,)  # one stop string or token id
        if not isinstance(stop, tuple | list):
            raise ConfigError(
                f"SamplingParams.stop must be a sequence of strings and token ids, got {stop!r}"
            )
        for item in stop:
            if isinstance(item, str):
                if not item:
                    raise ConfigError("SamplingParams.stop must not contain an empty string")
            else:
                check_number("SamplingParams.stop token id", item, 0, 2**31 - 1, integer=True)
        object.__setattr__(self, "stop", tuple(stop))


class SamplerStop(StrEnum):
    """Why the sampler stopped one sequence.

    Not why a trajectory ended: that is :class:`retool.rollout.StopReason`, which the
    rollout derives partly from this one (a ``length`` stop under a shrunk budget is
    ``budget_exhausted``).
    """

    STOP = "stop"
    """A stop string or stop token (EOS included) was produced; it is in ``tokens``."""
    LENGTH = "length"
    """``max_tokens`` new tokens were produced."""


@dataclass(frozen=True)
class SampledSequence:
    """One sampled completion."""

    tokens: tuple[int, ...]  # the sampler's own token ids (never re-encoded)
    logprobs: tuple[float, ...]  # policy logprob of each token, temperature 1, unfiltered
    text: str | None = None  # decoded from ``tokens`` (special tokens skipped)
    stop_reason: SamplerStop = SamplerStop.LENGTH  # why sampling ended
    # the weights that produced it, as the engine reports them (``policy-step-N``); None
    # where the sampler cannot say (a frozen local snapshot, a remote service)
    policy_version: str | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.logprobs):
            raise ValueError(
                f"SampledSequence has {len(self.tokens)} tokens but {len(self.logprobs)} logprobs"
            )


@dataclass(frozen=True)
class SampleResponse:
    """Every completion of one sampling request, in request order."""

    sequences: tuple[SampledSequence, ...]


@dataclass(frozen=True)
class AdamParams:
    """One AdamW step. ``grad_clip_norm <= 0`` disables global-norm clipping."""

    learning_rate: float = 1e-4  # in [0, 1]
    beta1: float = 0.9  # in [0, 1)
    beta2: float = 0.95  # in [0, 1)
    eps: float = 1e-12  # in (0, 1]
    weight_decay: float = 0.0  # in [0, 1]
    grad_clip_norm: float = 0.0  # finite; <= 0 disables

    def __post_init__(self) -> None:
        check_number("AdamParams.learning_rate", self.learning_rate, 0, 1)
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            check_number(f"AdamParams.{name}", value, 0, 1)
            if value >= 1:
                raise ConfigError(f"AdamParams.{name} must be in [0, 1), got {value}")
        check_number("AdamParams.eps", self.eps, 0, 1, low_open=True)
        check_number("AdamParams.weight_decay", self.weight_decay, 0, 1)
        check_number("AdamParams.grad_clip_norm", self.grad_clip_norm)


@dataclass(frozen=True)
class ForwardBackwardOutput:
    """Result of ``forward`` / ``forward_backward``."""

    loss_fn_outputs: tuple[dict[str, TensorData], ...]  # per datum, e.g. {"logprobs": ...}
    metrics: dict[str, float]  # "loss:sum", "loss_tokens", "clip_fraction", ...


@dataclass(frozen=True)
class OptimStepOutput:
    """Result of ``optim_step``."""

    metrics: dict[str, float]  # "grad_norm", "learning_rate", ...


@dataclass(frozen=True)
class SaveStateOutput:
    """Where a checkpoint was written."""

    path: str  # directory of the checkpoint


class Future(Generic[T]):
    """A result that may not have arrived yet.

    Wraps a :class:`concurrent.futures.Future` so that callers can block with
    ``.result()`` from synchronous code or ``await`` it from an event loop, like the
    SDK futures of remote backends.
    """

    def __init__(self, inner: concurrent.futures.Future[T]) -> None:
        self._inner = inner

    @classmethod
    def completed(cls, value: T) -> Future[T]:
        inner: concurrent.futures.Future[T] = concurrent.futures.Future()
        inner.set_result(value)
        return cls(inner)

    @classmethod
    def failed(cls, exc: BaseException) -> Future[T]:
        inner: concurrent.futures.Future[T] = concurrent.futures.Future()
        inner.set_exception(exc)
        return cls(inner)

    @classmethod
    def run(cls, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` now and wrap its value or exception."""
        try:
            return cls.completed(fn())
        except BaseException as exc:
            return cls.failed(exc)

    def result(self, timeout: float | None = None) -> T:
        return self._inner.result(timeout)

    def done(self) -> bool:
        return self._inner.done()

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self._inner).__await__()


@runtime_checkable
class SamplingClient(Protocol):
    """Samples from one frozen snapshot of a policy."""

    def sample(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Future[SampleResponse]: ...

    def sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Awaitable[SampleResponse]: ...

    def compute_logprobs(self, prompt: ModelInput) -> Future[list[float | None]]: ...

    def get_tokenizer(self) -> Tokenizer: ...

    @property
    def max_context_tokens(self) -> int | None:
        """Longest prompt + completion the sampler serves; ``None`` if it does not say."""
        ...

    def close(self) -> None:
        """Release what this snapshot holds (a no-op where it holds nothing)."""
        ...


@runtime_checkable
class TrainingClient(Protocol):
    """Holds trainable weights and optimizer state."""

    def forward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
    ) -> Future[ForwardBackwardOutput]: ...

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
    ) -> Future[ForwardBackwardOutput]: ...

    def optim_step(self, adam_params: AdamParams) -> Future[OptimStepOutput]: ...

    def save_state(self, name: str) -> Future[SaveStateOutput]: ...

    def load_state(self, path: str) -> Future[None]: ...  # weights only

    def load_state_with_optimizer(self, path: str) -> Future[None]: ...  # resume

    def save_weights_for_sampler(self, name: str) -> Future[SaveStateOutput]: ...

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> SamplingClient: ...

    def get_tokenizer(self) -> Tokenizer: ...

    @property
    def max_context_tokens(self) -> int | None:
        """Longest datum the trainer accepts; ``None`` if it does not say."""
        ...


@runtime_checkable
class ServiceClient(Protocol):
    """Entry point of a backend: creates training and sampling clients."""

    def create_lora_training_client(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> TrainingClient: ...

    def create_training_client(
        self, base_model: str, full: bool = True, seed: int | None = None
    ) -> TrainingClient:
        """Full fine-tuning (the local backend only; the services train LoRA adapters)."""
        ...

    def create_training_client_from_state(self, path: str) -> TrainingClient:
        """Weights of a saved state, a fresh optimizer (``--init-from``)."""
        ...

    def create_training_client_from_state_with_optimizer(self, path: str) -> TrainingClient:
        """Weights and optimizer of a saved state (``--resume``)."""
        ...

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None
    ) -> SamplingClient: ...

    def close(self) -> None:
        """End the session (a remote one now, not at process exit; locally a no-op)."""
        ...


@runtime_checkable
class Sandbox(Protocol):
    """Runs model-written code in isolation, one snippet per call."""

    @property
    def timeout(self) -> float:
        """Wall-clock seconds a call may take unless it asks for another limit."""
        ...

    @property
    def stats(self) -> SandboxStats:
        """Counts of the calls so far, by outcome."""
        ...

    def run(self, code: str, timeout: float | None = None) -> ExecResult: ...

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult: ...

    def close(self) -> None: ...

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc: object) -> None: ...
