"""``model.backend = "pytrio"``: the PyTRIO training service through the ``pytrio`` SDK.

The shared client logic is in :mod:`retool.backends.remote`; this module is
the PyTRIO half, written against ``pytrio`` 0.2.9 (file paths below are inside
the installed package). What differs from Tinker, and how it is bridged:

* Creation calls return clients, not futures (pytrio/client/service.py), and
  ``create_sampling_client(base_model, model_path=None)`` takes the base model
  first and requires it: always called with keywords.
* ``APIFuture`` has ``result()`` and ``await`` but no ``result_async``
  (pytrio/types/future/api_future.py): bridged by :func:`remote.futures.bridge`;
  ``sample_async`` uses the SDK's own ``sample_async``.
* Sampled sequences carry ``text`` and a free-form ``stop_reason``
  (pytrio/types/sample/sample_sequence.py), mapped by :func:`remote.samples.stop_reason`.
* ``forward_backward`` reports ``loss_sum`` / ``loss_mean`` / ``token_count``
  (pytrio/client/adapters/training.py: ``actor_forward_responses_to_sdk``),
  mapped to ``loss:sum`` / ``loss_tokens``; ``token_count`` is kept as
  ``service_tokens``.
* Loss reduction: every chunk of one call carries the call's
  ``total_samples`` / ``total_active_tokens`` / ``total_advantage_tokens``
  (pytrio/client/training_batch.py: ``GradientAccumulationTotals``;
  pytrio/protocol/actor/events/trainer/forward.py: ``GradientAccumulationSpec``,
  "the global normalisation the Trainer uses to compute the logical-batch
  gradient"), so the service divides by a count; see ``model.loss_reduction``
  for which one is assumed and why.
* Policy losses send no ``weights`` (pytrio/client/builders/training.py:
  ``build_trainer_forward_payload``); the masked positions carry advantage 0.
* ``load_state`` works only before the first training call
  (pytrio/client/training.py: ``_load_state_impl``), so resume creates a new
  client with ``create_training_client_from_state_with_optimizer``.
* Credentials: ``PYTRIO_API_KEY`` or the profile ``trio login`` saves under
  ``~/.pytrio``, both read by the SDK at import (pytrio/config/config.py:
  ``load_login_config``, ``_apply_environment_configuration``).

The SDK's objects (its module, clients, requests and replies) are typed ``Any``:
they are the SDK's own classes, imported only when the backend is used.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable
from typing import Any

import numpy as np

from retool.backends.remote.clients import (
    RemoteSamplingClient,
    RemoteServiceClient,
    RemoteTrainingClient,
)
from retool.backends.remote.futures import translate
from retool.backends.remote.samples import our_tensor, split_stops
from retool.errors import BackendError, RetoolError, require
from retool.limits import PYTRIO_LORA_RANKS, check_pytrio_rank
from retool.types import AdamParams, ModelInput, SampleResponse, SamplingParams, TensorData

BACKEND = "pytrio"
EXTRA = "pytrio"
API_KEY_VARIABLE = "PYTRIO_API_KEY"  # pytrio/config/environment.py: EnvironmentVariable
LOGIN_COMMAND = "trio login"


def sdk() -> Any:
    """The ``pytrio`` package, or a :class:`DependencyError` naming the extra."""
    return require("pytrio", EXTRA)


def check_credentials() -> None:
    """Raise :class:`BackendError` when the SDK has no API key; no request, no key read out.

    The SDK resolves ``PYTRIO_API_KEY`` and the ``trio login`` profile when it
    is imported (pytrio/config/config.py); a variable set after that is
    handed to ``ServiceClient`` when the client is made.
    """
    sdk()
    from pytrio.config.config import auth_state

    if auth_state.config_error is not None:
        raise BackendError(
            f"pytrio cannot read its saved login ({auth_state.config_error.message}); "
            f"run `{LOGIN_COMMAND}` again or set {API_KEY_VARIABLE}"
        )
    if not auth_state.api_key.strip() and not os.environ.get(API_KEY_VARIABLE, "").strip():
        raise BackendError(
            f"pytrio needs an API key: set {API_KEY_VARIABLE} or run `{LOGIN_COMMAND}`"
        )


def _limit(sdk_client: Any) -> int | None:
    # The limits Control returned with the run (pytrio/client/adapters/limits.py),
    # kept by the SDK client as `_limits` (pytrio/client/training.py, sampling.py).
    limits = getattr(sdk_client, "_limits", None)
    value = getattr(limits, "max_seq_len", None)
    return int(value) if value else None


class PytrioSamplingClient(RemoteSamplingClient):
    backend = BACKEND

    def _sdk_limit(self) -> int | None:
        return _limit(self.sdk)

    def _sdk_prompt(self, prompt: ModelInput) -> Any:
        return sdk().ModelInput.from_ints(list(prompt.tokens))

    def _sdk_params(self, params: SamplingParams) -> Any:
        stop = params.stop
        needs_tokenizer = any(isinstance(s, int) for s in stop) and any(
            isinstance(s, str) for s in stop
        )
        return sdk().SamplingParams(
            max_tokens=params.max_tokens,
            seed=params.seed,
            stop=split_stops(stop, self.get_tokenizer() if needs_tokenizer else None),
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
        )

    def _sdk_sample(self, prompt: ModelInput, num_samples: int, params: Any) -> Any:
        return self.sdk.sample(
            prompt=self._sdk_prompt(prompt), num_samples=num_samples, sampling_params=params
        )

    async def _sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> SampleResponse:
        try:
            response = await self.sdk.sample_async(
                prompt=self._sdk_prompt(prompt),
                num_samples=num_samples,
                sampling_params=self._sdk_params(sampling_params),
            )
            return self._response(response, sampling_params)
        except RetoolError:
            raise
        except Exception as exc:
            raise translate(exc, self.backend, "sample") from exc

    def sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Awaitable[SampleResponse]:
        # The SDK's own coroutine: `sample()` blocks its caller while the request is
        # queued (pytrio/client/sampling.py: SamplingClient.sample -> run_sync).
        return self._sample_async(prompt, num_samples, sampling_params)


class PytrioTrainingClient(RemoteTrainingClient):
    backend = BACKEND
    loss_metric = "loss_sum"
    sampling_client_class = PytrioSamplingClient

    @property
    def max_context_tokens(self) -> int | None:
        return _limit(self.sdk)

    def _sdk_datum(self, model_input: ModelInput, inputs: dict[str, np.ndarray]) -> Any:
        pytrio = sdk()
        return pytrio.Datum(
            model_input=pytrio.ModelInput.from_ints(list(model_input.tokens)),
            loss_fn_inputs={k: pytrio.types.TensorData.from_numpy(v) for k, v in inputs.items()},
        )

    def _sdk_forward(
        self, data: list[Any], loss_fn: str, config: dict[str, float] | None, backward: bool
    ) -> Any:
        method = self.sdk.forward_backward if backward else self.sdk.forward
        # Our datums are shifted already: auto_shift stays off.
        return method(data, loss_fn=loss_fn, loss_fn_config=config, auto_shift=False)

    def _forward_output(
        self, output: Any, count: int
    ) -> tuple[list[dict[str, TensorData]], float | None, dict[str, float]]:
        outputs = [{k: our_tensor(v) for k, v in o.items()} for o in output.loss_fn_outputs]
        if len(outputs) != count:
            raise BackendError(f"pytrio returned {len(outputs)} outputs for {count} datums")
        metrics = dict(output.metrics)
        # None: no loss_sum (a service under another name): the caller recomputes it
        return (
            outputs,
            float(metrics["loss_sum"]) if "loss_sum" in metrics else None,
            {"service_tokens": float(metrics.get("token_count", 0.0))},
        )

    def _sdk_optim(self, params: AdamParams) -> Any:
        return self.sdk.optim_step(
            sdk().AdamParams(
                learning_rate=params.learning_rate,
                beta1=params.beta1,
                beta2=params.beta2,
                eps=params.eps,
                weight_decay=params.weight_decay,
                grad_clip_norm=max(params.grad_clip_norm, 0.0),
            )
        )

    def _optim_metrics(self, response: Any) -> dict[str, float]:
        return {str(k): float(v) for k, v in (response.metrics or {}).items()}

    def _sdk_save_state(self, name: str) -> Any:
        return self.sdk.save_state(name)

    def _sdk_save_sampler(self, name: str) -> Any:
        return self.sdk.save_weights_for_sampler(name)

    def _sdk_snapshot(self) -> Any:
        # Temporary weights with a 6-hour TTL (pytrio/client/training.py:
        # _save_weights_and_get_sampling_client).
        return self.sdk.save_weights_and_get_sampling_client()


class PytrioServiceClient(RemoteServiceClient):
    """``model.backend = "pytrio"``."""

    backend = BACKEND
    training_client_class = PytrioTrainingClient
    sampling_client_class = PytrioSamplingClient

    def _check_credentials(self) -> None:
        check_credentials()

    def _new_sdk_service(self) -> Any:
        from pytrio.config.config import auth_state

        # The SDK reads PYTRIO_API_KEY when it is imported; a variable set later is
        # handed to it here, never kept.
        late = None if auth_state.api_key.strip() else os.environ.get(API_KEY_VARIABLE)
        return sdk().ServiceClient(api_key=late.strip() if late else None)

    def check_rank(self, rank: int) -> None:
        check_pytrio_rank(rank)

    def rank_rule(self) -> str:
        return f"{PYTRIO_LORA_RANKS.start} to {PYTRIO_LORA_RANKS.stop - 1}"

    def _sdk_lora(self, base_model: str, rank: int, seed: int | None) -> Any:
        return self.sdk.create_lora_training_client(base_model=base_model, rank=rank, seed=seed)

    def _sdk_from_state(self, remote_path: str, with_optimizer: bool) -> Any:
        if with_optimizer:
            return self.sdk.create_training_client_from_state_with_optimizer(remote_path)
        return self.sdk.create_training_client_from_state(remote_path)

    def _sdk_sampling(self, remote_path: str | None, base_model: str) -> Any:
        return self.sdk.create_sampling_client(base_model=base_model, model_path=remote_path)
