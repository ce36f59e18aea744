"""The client classes the PyTRIO and Tinker adapters subclass.

:class:`RemoteServiceClient` creates the other two; :class:`RemoteTrainingClient`
holds the trainable LoRA weights and optimizer state on the service;
:class:`RemoteSamplingClient` samples from one snapshot of them. Each does
what both SDKs share (checks before a request, futures, metrics, pointer
checkpoints) and leaves the SDK calls and type conversions that differ to
abstract ``_sdk_*`` methods, written by :mod:`retool.backends.pytrio` and
:mod:`retool.backends.tinker`.

Every request returns our :class:`~retool.types.Future` at once (see
:mod:`retool.backends.remote.futures`), in the order it was submitted, which
is the order the service runs it in: ``forward_backward`` calls and the
``optim_step`` after them can all be in flight together.

SDK objects (the SDK's clients, futures, results and its tokenizer) are
typed ``Any``: they are the SDKs' own classes, imported only by the adapters.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from retool.backends.remote.checkpoints import (
    SAMPLER_FILE,
    STATE_FILE,
    RemoteCheckpoint,
    check_checkpoint_name,
    read_pointer,
    write_pointer,
)
from retool.backends.remote.futures import call, submit, translate
from retool.backends.remote.losses import (
    check_lengths,
    check_loss_inputs,
    fallback_loss,
    loss_config,
    loss_denominator,
    loss_inputs,
    resolve_loss_reduction,
    trainer_metrics,
)
from retool.backends.remote.samples import sequence
from retool.errors import BackendError, ConfigError
from retool.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    Future,
    ModelInput,
    OptimStepOutput,
    SampleResponse,
    SamplingParams,
    SaveStateOutput,
    TensorData,
    Tokenizer,
)

if TYPE_CHECKING:  # config sits a floor above the backends: annotations only
    from retool.config import ModelConfig


class RemoteSamplingClient(abc.ABC):
    """Samples from one snapshot of the policy held by the service."""

    backend = "remote"

    def __init__(
        self,
        sdk_client: Any,  # the SDK's sampling client
        max_context_tokens: int | None = None,
        tokenizer: Tokenizer = None,  # the SDK's (a Hugging Face tokenizer)
        name: str | None = None,
    ) -> None:
        self.sdk = sdk_client
        self.name = name
        self._max_context_tokens = max_context_tokens
        self._tokenizer = tokenizer
        self._tokenizer_lock = threading.Lock()

    @property
    def max_context_tokens(self) -> int | None:
        """Longest prompt + completion the service accepts (checked by the rollout)."""
        return self._sdk_limit() or self._max_context_tokens

    def _sdk_limit(self) -> int | None:
        """The sequence limit the SDK client itself reports, if any."""
        return None

    def close(self) -> None:  # noqa: B027 - the service holds the snapshot, nothing to free here
        """Nothing to release: the snapshot lives on the service until the session ends."""

    def get_tokenizer(self) -> Tokenizer:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = call(self.sdk.get_tokenizer, self.backend, "get_tokenizer")
            return self._tokenizer

    def sample(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Future[SampleResponse]:
        def start() -> Any:
            return self._sdk_sample(prompt, num_samples, self._sdk_params(sampling_params))

        return submit(start, lambda r: self._response(r, sampling_params), self.backend, "sample")

    def sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Awaitable[SampleResponse]:
        return self.sample(prompt, num_samples, sampling_params)

    def compute_logprobs(self, prompt: ModelInput) -> Future[list[float | None]]:
        def convert(values: Sequence[float | None]) -> list[float | None]:
            return [None if v is None else float(v) for v in values]

        return submit(
            lambda: self.sdk.compute_logprobs(self._sdk_prompt(prompt)),
            convert,
            self.backend,
            "compute_logprobs",
        )

    # -- SDK-specific ------------------------------------------------------------------
    @abc.abstractmethod
    def _sdk_prompt(self, prompt: ModelInput) -> Any: ...

    @abc.abstractmethod
    def _sdk_params(self, params: SamplingParams) -> Any: ...

    @abc.abstractmethod
    def _sdk_sample(self, prompt: ModelInput, num_samples: int, params: Any) -> Any: ...

    def _response(self, response: Any, params: SamplingParams) -> SampleResponse:
        """The SDK's response as ours: sequences in order, text from :meth:`_text`."""
        return SampleResponse(
            tuple(
                sequence(
                    s.tokens,
                    s.logprobs,
                    self._text(s),
                    s.stop_reason,
                    params.max_tokens,
                    self.backend,
                )
                for s in response.sequences
            )
        )

    def _text(self, sdk_sequence: Any) -> str | None:
        """A sequence's text as the SDK gives it (``None`` when it has none)."""
        return getattr(sdk_sequence, "text", None)


class RemoteTrainingClient(abc.ABC):
    """Trainable LoRA weights and optimizer state held by the service."""

    backend = "remote"
    loss_metric = "loss:sum"  # the service's name for one call's summed loss
    sampling_client_class: type[RemoteSamplingClient]

    def __init__(
        self,
        service: RemoteServiceClient,
        sdk_client: Any,  # the SDK's training client
        base_model: str,
        lora_rank: int,
        steps: int = 0,
    ) -> None:
        self.service = service
        self.sdk = sdk_client
        self.base_model = base_model
        self.lora_rank = lora_rank
        self.steps = steps  # optimizer steps taken (restored on resume)
        self._tokenizer: Tokenizer = None  # the SDK's, loaded on first use
        self._tokenizer_lock = threading.Lock()

    @property
    def reduction(self) -> str:
        return self.service.loss_reduction

    @property
    def max_context_tokens(self) -> int | None:
        """The model's longest training sequence on this service, when the SDK reports it."""
        return None

    def get_tokenizer(self) -> Tokenizer:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = call(self.sdk.get_tokenizer, self.backend, "get_tokenizer")
            return self._tokenizer

    # -- losses --------------------------------------------------------------------------
    def _call(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        config: Mapping[str, float] | None,
        backward: bool,
    ) -> Future[ForwardBackwardOutput]:
        what = "forward_backward" if backward else "forward"
        data = list(data)
        try:
            check_loss_inputs(data, loss_fn, self.backend)
            check_lengths(data, self.max_context_tokens, self.backend)
            scale = loss_denominator(self.reduction, loss_fn, data)
            sdk_data = [
                self._sdk_datum(d.model_input, loss_inputs(d, loss_fn, scale)) for d in data
            ]
            sent_config = loss_config(loss_fn, config)
        except Exception as exc:
            return Future.failed(translate(exc, self.backend, what))

        def convert(output: Any) -> ForwardBackwardOutput:
            outputs, loss_sum, service_metrics = self._forward_output(output, len(data))
            if loss_sum is None:  # no loss metric: recomputed, already in our (unscaled) terms
                names = [*service_metrics, *getattr(output, "metrics", {})]
                ours = fallback_loss(
                    self.backend, data, loss_fn, outputs, config, names, self.loss_metric
                )
            else:
                ours = loss_sum / scale
            return ForwardBackwardOutput(
                tuple(outputs),
                trainer_metrics(data, loss_fn, ours, outputs, config, service_metrics),
            )

        return submit(
            lambda: self._sdk_forward(sdk_data, loss_fn, sent_config, backward),
            convert,
            self.backend,
            what,
        )

    def forward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
    ) -> Future[ForwardBackwardOutput]:
        """Per-datum logprobs and loss metrics, without gradients."""
        return self._call(data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
    ) -> Future[ForwardBackwardOutput]:
        """As ``forward``, and add this call's gradients to the accumulated ones."""
        return self._call(data, loss_fn, loss_fn_config, backward=True)

    def optim_step(self, adam_params: AdamParams) -> Future[OptimStepOutput]:
        def convert(response: Any) -> OptimStepOutput:
            self.steps += 1
            metrics = {"learning_rate": adam_params.learning_rate}
            metrics.update(self._optim_metrics(response))
            metrics["step"] = float(self.steps)
            return OptimStepOutput(metrics)

        return submit(lambda: self._sdk_optim(adam_params), convert, self.backend, "optim_step")

    # -- checkpoints ---------------------------------------------------------------------
    def save_state(self, name: str) -> Future[SaveStateOutput]:
        """Weights and optimizer state on the service; a pointer directory here."""
        steps = self.steps

        def convert(remote_path: str) -> SaveStateOutput:
            checkpoint = RemoteCheckpoint(
                self.backend, remote_path, self.base_model, self.lora_rank, steps
            )
            directory = self.service.checkpoint_root / "state" / name
            return SaveStateOutput(str(write_pointer(directory, STATE_FILE, checkpoint)))

        return self._save(name, self._sdk_save_state, convert, "save_state")

    def save_weights_for_sampler(self, name: str) -> Future[SaveStateOutput]:
        """Sampler weights on the service; a pointer directory here (``retool eval`` reads it)."""

        def convert(remote_path: str) -> SaveStateOutput:
            checkpoint = RemoteCheckpoint(self.backend, remote_path, self.base_model)
            directory = self.service.checkpoint_root / "sampler" / name
            return SaveStateOutput(str(write_pointer(directory, SAMPLER_FILE, checkpoint)))

        return self._save(name, self._sdk_save_sampler, convert, "save_weights_for_sampler")

    def _save(
        self,
        name: str,
        start: Callable[[str], Any],
        convert: Callable[[str], SaveStateOutput],
        what: str,
    ) -> Future[SaveStateOutput]:
        try:
            check_checkpoint_name(name, self.backend)
        except BackendError as exc:
            return Future.failed(exc)
        return submit(lambda: start(name), lambda r: convert(str(r.path)), self.backend, what)

    def load_state(self, path: str) -> Future[None]:
        """Weights of a ``save_state`` checkpoint (the SDK's ``load_state``).

        PyTRIO accepts it only before the first training call
        (pytrio/client/training.py: ``_load_state_impl``); resuming goes
        through the service's ``create_training_client_from_state_with_optimizer``.
        """
        return self._load(path, with_optimizer=False)

    def load_state_with_optimizer(self, path: str) -> Future[None]:
        """Weights, optimizer state and step counter of a ``save_state`` checkpoint."""
        return self._load(path, with_optimizer=True)

    def _load(self, path: str, with_optimizer: bool) -> Future[None]:
        try:
            checkpoint = self.service.state_checkpoint(path)
        except BackendError as exc:
            return Future.failed(exc)

        def convert(_: object) -> None:
            if with_optimizer:
                self.steps = checkpoint.steps

        method = self.sdk.load_state_with_optimizer if with_optimizer else self.sdk.load_state
        return submit(lambda: method(checkpoint.remote_path), convert, self.backend, "load_state")

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> RemoteSamplingClient:
        """A sampling client of the current weights (saved under ``name`` when given)."""
        if name is not None:
            path = self.save_weights_for_sampler(name).result().path
            return self.service.create_sampling_client(model_path=path, tokenizer=self._tokenizer)
        sdk_sampler = call(self._sdk_snapshot, self.backend, "save_weights_and_get_sampling_client")
        return self.sampling_client_class(
            sdk_sampler, self.max_context_tokens, tokenizer=self._tokenizer
        )

    # -- SDK-specific ------------------------------------------------------------------
    @abc.abstractmethod
    def _sdk_datum(self, model_input: ModelInput, inputs: dict[str, np.ndarray]) -> Any: ...

    @abc.abstractmethod
    def _sdk_forward(
        self, data: list[Any], loss_fn: str, config: dict[str, float] | None, backward: bool
    ) -> Any: ...

    @abc.abstractmethod
    def _forward_output(
        self, output: Any, count: int
    ) -> tuple[list[dict[str, TensorData]], float | None, dict[str, float]]:
        """Per-datum outputs, the service's summed loss (None: not reported, recomputed from
        the outputs), and its other metrics (ours' names)."""

    @abc.abstractmethod
    def _sdk_optim(self, params: AdamParams) -> Any: ...

    @abc.abstractmethod
    def _optim_metrics(self, response: Any) -> dict[str, float]: ...

    @abc.abstractmethod
    def _sdk_save_state(self, name: str) -> Any: ...

    @abc.abstractmethod
    def _sdk_save_sampler(self, name: str) -> Any: ...

    @abc.abstractmethod
    def _sdk_snapshot(self) -> Any: ...


class RemoteServiceClient(abc.ABC):
    """Entry point: creates training and sampling clients on the service.

    The credential is checked when this client is made (no request); the SDK's
    own service client is created on first use.
    """

    backend = "remote"
    scheme = ""  # prefix of the service's checkpoint URIs ("" = any "scheme://")
    training_client_class: type[RemoteTrainingClient]
    sampling_client_class: type[RemoteSamplingClient]

    def __init__(
        self, model: ModelConfig, checkpoint_root: str | Path = "runs/checkpoints"
    ) -> None:
        self.model = model
        self.checkpoint_root = Path(checkpoint_root)
        self.loss_reduction = resolve_loss_reduction(model.loss_reduction, self.backend)
        self._check_credentials()
        self._sdk: Any = None  # the SDK's service client, made on first use
        self._sdk_lock = threading.Lock()

    @property
    def sdk(self) -> Any:
        with self._sdk_lock:
            if self._sdk is None:
                self._sdk = call(self._new_sdk_service, self.backend, "connecting")
            return self._sdk

    # -- training clients ----------------------------------------------------------------
    def create_lora_training_client(
        self, base_model: str, rank: int = 32, seed: int | None = None
    ) -> RemoteTrainingClient:
        self.check_rank(rank)
        sdk_client = call(
            lambda: self._sdk_lora(base_model, rank, seed),
            self.backend,
            "create_lora_training_client",
        )
        return self.training_client_class(self, sdk_client, base_model, rank)

    def create_training_client(
        self, base_model: str, full: bool = True, seed: int | None = None
    ) -> RemoteTrainingClient:
        if full:
            raise ConfigError(
                f"{self.backend} trains LoRA adapters only: set model.lora_rank "
                f"({self.rank_rule()})"
            )
        return self.create_lora_training_client(base_model, rank=self.model.lora_rank, seed=seed)

    def state_checkpoint(self, path: str | Path) -> RemoteCheckpoint:
        return read_pointer(path, STATE_FILE, self.backend, self.scheme)

    def create_training_client_from_state(self, path: str | Path) -> RemoteTrainingClient:
        """A new training client with the weights of a checkpoint, fresh optimizer."""
        return self._from_state(path, with_optimizer=False)

    def create_training_client_from_state_with_optimizer(
        self, path: str | Path
    ) -> RemoteTrainingClient:
        """Resume: weights, optimizer state and step counter of a ``save_state`` checkpoint."""
        return self._from_state(path, with_optimizer=True)

    def _from_state(self, path: str | Path, with_optimizer: bool) -> RemoteTrainingClient:
        checkpoint = self.state_checkpoint(path)
        sdk_client = call(
            lambda: self._sdk_from_state(checkpoint.remote_path, with_optimizer),
            self.backend,
            "create_training_client_from_state" + ("_with_optimizer" if with_optimizer else ""),
        )
        return self.training_client_class(
            self,
            sdk_client,
            checkpoint.base_model or self.model.base_model,
            checkpoint.lora_rank or self.model.lora_rank,
            steps=checkpoint.steps if with_optimizer else 0,
        )

    # -- sampling clients ----------------------------------------------------------------
    def create_sampling_client(
        self,
        model_path: str | Path | None = None,
        base_model: str | None = None,
        tokenizer: Tokenizer = None,
    ) -> RemoteSamplingClient:
        """Sample from saved sampler weights (a pointer or a service URI) or a base model."""
        remote_path = None
        if model_path is not None:
            checkpoint = read_pointer(model_path, SAMPLER_FILE, self.backend, self.scheme)
            remote_path = checkpoint.remote_path
            base_model = base_model or checkpoint.base_model or self.model.base_model
        elif base_model is None:
            raise ConfigError("create_sampling_client needs model_path or base_model")
        assert base_model is not None
        sdk_client = call(
            lambda: self._sdk_sampling(remote_path, base_model),
            self.backend,
            "create_sampling_client",
        )
        return self.sampling_client_class(
            sdk_client,
            self.context_limit(base_model, sdk_client),
            tokenizer=tokenizer,
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """End the service session, where the SDK has one to end (see subclasses)."""

    def context_limit(self, base_model: str, sdk_client: Any) -> int | None:
        """The model's longest sequence, when the service reports it (None: unknown)."""
        return None

    # -- SDK-specific ------------------------------------------------------------------
    @abc.abstractmethod
    def _check_credentials(self) -> None:
        """Raise :class:`BackendError` naming the variable and login command when none is set."""

    @abc.abstractmethod
    def _new_sdk_service(self) -> Any: ...

    @abc.abstractmethod
    def check_rank(self, rank: int) -> None: ...

    @abc.abstractmethod
    def rank_rule(self) -> str: ...

    @abc.abstractmethod
    def _sdk_lora(self, base_model: str, rank: int, seed: int | None) -> Any: ...

    @abc.abstractmethod
    def _sdk_from_state(self, remote_path: str, with_optimizer: bool) -> Any: ...

    @abc.abstractmethod
    def _sdk_sampling(self, remote_path: str | None, base_model: str) -> Any: ...
