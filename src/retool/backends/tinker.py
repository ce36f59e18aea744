"""``model.backend = "tinker"``: the Tinker training service through the ``tinker`` SDK.

The shared client logic is in :mod:`retool.backends.remote`; this module is
the Tinker half, written against ``tinker`` 0.38.0 (file paths below are
inside the installed package). What differs from PyTRIO, and how it is
bridged:

* ``create_lora_training_client``, ``create_training_client_from_state*``,
  ``create_sampling_client`` and ``save_weights_and_get_sampling_client``
  return futures of clients (tinker/lib/public_interfaces/service_client.py,
  training_client.py): resolved with ``.result()``. ``create_sampling_client``
  takes ``model_path`` first: always called with keywords.
* Futures expose their ``concurrent.futures.Future`` (``APIFuture.future()``,
  tinker/lib/public_interfaces/api_future.py), bridged by :func:`remote.futures.bridge`.
* Sampled sequences have no ``text`` (tinker/types/sampled_sequence.py): it is
  decoded here from the tokens with the model's tokenizer, special tokens
  skipped, as the rollout decodes. Stop reasons are ``"stop"`` / ``"length"``
  (tinker/types/_pydantic_types/stop_reason.py).
* Losses are sums: the SDK's own custom-loss path relies on "Backend CE is
  L = sum(-logprobs * weights)" (tinker/lib/public_interfaces/training_client.py:
  ``_compute_custom_loss``) and chunk metrics named ``<name>:sum`` are summed
  (tinker/lib/chunked_fwdbwd_helpers.py), so ``model.loss_reduction = "auto"``
  sends advantages unchanged. Metric names ``<name>:<reduction>`` map to ours:
  ``:sum`` kept, ``:mean`` dropped, ``:max``/``:min`` to ``_max``/``_min``.
* The longest sequence of a model comes from the server's capabilities
  (``RestClient.get_server_capabilities``, ``SupportedModel.max_context_length``),
  read once per base model when a client is created.
* Checkpoint names become the last segment of ``tinker://<run>/weights/<name>``
  (tinker/types/checkpoint.py: ``ParsedCheckpointTinkerPath``): no ``/``.
* Credentials: ``TINKER_API_KEY``, ``TINKER_CREDENTIAL_CMD`` or the key
  ``tinker auth login`` stores, checked locally by the SDK's own resolver
  (tinker/lib/_auth_token_provider.py: ``resolve_auth_provider``).

The SDK's objects (its module, clients, requests and replies) are typed ``Any``:
they are the SDK's own classes, imported only when the backend is used.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from retool.backends.remote.clients import (
    RemoteSamplingClient,
    RemoteServiceClient,
    RemoteTrainingClient,
)
from retool.backends.remote.futures import call
from retool.backends.remote.samples import our_tensor, split_stops
from retool.errors import BackendError, require
from retool.limits import TINKER_MIN_LORA_RANK, check_tinker_rank
from retool.types import (
    AdamParams,
    Future,
    ModelInput,
    SampleResponse,
    SamplingParams,
    TensorData,
)

if TYPE_CHECKING:  # config sits a floor above the backends: annotations only
    from retool.config import ModelConfig

log = logging.getLogger(__name__)

BACKEND = "tinker"
EXTRA = "tinker"
API_KEY_VARIABLE = "TINKER_API_KEY"
LOGIN_COMMAND = "tinker auth login"
SCHEME = "tinker://"
CAPABILITIES_TIMEOUT = 60.0  # seconds to wait for the server's model list


def sdk() -> Any:
    """The ``tinker`` package, or a :class:`DependencyError` naming the extra."""
    return require("tinker", EXTRA)


def check_credentials() -> None:
    """Raise :class:`BackendError` when the SDK resolves no credential (local check, no request)."""
    tinker = sdk()
    try:
        tinker.auth.resolve_auth_provider(api_key=None, enforce_cmd=False)
    except (OSError, ValueError, tinker.TinkerError) as exc:
        detail = " ".join(str(exc).split())
        missing = "TINKER_API_KEY environment variable" in detail  # the SDK's own message
        raise BackendError(
            f"tinker needs an API key: set {API_KEY_VARIABLE} (or TINKER_CREDENTIAL_CMD) "
            f"or run `{LOGIN_COMMAND}`" + ("" if missing else f" ({detail})")
        ) from None


def metric_name(name: str) -> str | None:
    """Our name for a Tinker metric ``<name>:<reduction>`` (None: not combinable by us)."""
    base, _, reduction = name.rpartition(":")
    if not base:
        return name
    return {"sum": name, "mean": base, "max": f"{base}_max", "min": f"{base}_min"}.get(reduction)


def our_metrics(metrics: dict[str, float] | None) -> dict[str, float]:
    out = {}
    for name, value in (metrics or {}).items():
        mapped = metric_name(str(name))
        if mapped is not None:
            out[mapped] = float(value)
    return out


class TinkerSamplingClient(RemoteSamplingClient):
    backend = BACKEND

    def sample(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Future[SampleResponse]:
        try:
            self.get_tokenizer()  # loaded here, not in the SDK's completion callback
        except BackendError as exc:
            return Future.failed(exc)
        return super().sample(prompt, num_samples, sampling_params)

    def _sdk_prompt(self, prompt: ModelInput) -> Any:
        return sdk().types.ModelInput.from_ints(list(prompt.tokens))

    def _sdk_params(self, params: SamplingParams) -> Any:
        return sdk().types.SamplingParams(
            max_tokens=params.max_tokens,
            seed=params.seed,
            stop=split_stops(params.stop, self.get_tokenizer()),
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
        )

    def _sdk_sample(self, prompt: ModelInput, num_samples: int, params: Any) -> Any:
        return self.sdk.sample(
            prompt=self._sdk_prompt(prompt), num_samples=num_samples, sampling_params=params
        )

    def _text(self, sdk_sequence: Any) -> str:
        # Tinker's sequences carry no text: decode the tokens, as the rollout would.
        return self.get_tokenizer().decode(list(sdk_sequence.tokens), skip_special_tokens=True)


class TinkerTrainingClient(RemoteTrainingClient):
    backend = BACKEND
    sampling_client_class = TinkerSamplingClient

    @property
    def max_context_tokens(self) -> int | None:
        assert isinstance(self.service, TinkerServiceClient)
        return self.service.model_context_limit(self.base_model)

    def _sdk_datum(self, model_input: ModelInput, inputs: dict[str, np.ndarray]) -> Any:
        types = sdk().types
        return types.Datum(
            model_input=types.ModelInput.from_ints(list(model_input.tokens)),
            loss_fn_inputs={k: types.TensorData.from_numpy(v) for k, v in inputs.items()},
        )

    def _sdk_forward(
        self, data: list[Any], loss_fn: str, config: dict[str, float] | None, backward: bool
    ) -> Any:
        method = self.sdk.forward_backward if backward else self.sdk.forward
        return method(data, loss_fn, config)

    def _forward_output(
        self, output: Any, count: int
    ) -> tuple[list[dict[str, TensorData]], float | None, dict[str, float]]:
        outputs = [{k: our_tensor(v) for k, v in o.items()} for o in output.loss_fn_outputs]
        if len(outputs) != count:
            raise BackendError(f"tinker returned {len(outputs)} outputs for {count} datums")
        metrics = our_metrics(output.metrics)
        # None: no loss:sum (a service under another name): the caller recomputes it
        return outputs, metrics.pop("loss:sum", None), metrics

    def _sdk_optim(self, params: AdamParams) -> Any:
        return self.sdk.optim_step(
            sdk().types.AdamParams(
                learning_rate=params.learning_rate,
                beta1=params.beta1,
                beta2=params.beta2,
                eps=params.eps,
                weight_decay=params.weight_decay,
                grad_clip_norm=max(params.grad_clip_norm, 0.0),
            )
        )

    def _optim_metrics(self, response: Any) -> dict[str, float]:
        return our_metrics(response.metrics)

    def _sdk_save_state(self, name: str) -> Any:
        return self.sdk.save_state(name)

    def _sdk_save_sampler(self, name: str) -> Any:
        return self.sdk.save_weights_for_sampler(name)

    def _sdk_snapshot(self) -> Any:
        return self.sdk.save_weights_and_get_sampling_client().result()


class TinkerServiceClient(RemoteServiceClient):
    """``model.backend = "tinker"``."""

    backend = BACKEND
    scheme = SCHEME
    training_client_class = TinkerTrainingClient
    sampling_client_class = TinkerSamplingClient

    def __init__(
        self, model: ModelConfig, checkpoint_root: str | Path = "runs/checkpoints"
    ) -> None:
        super().__init__(model, checkpoint_root)
        self._limits: dict[str, int | None] | None = None
        self._limits_lock = threading.Lock()

    def _check_credentials(self) -> None:
        check_credentials()

    def _new_sdk_service(self) -> Any:
        return sdk().ServiceClient()

    def close(self) -> None:
        """Finish the Tinker session (stops its heartbeats); a no-op before first use."""
        if self._sdk is not None:
            call(lambda: self._sdk.close("success").result(), BACKEND, "close")

    def check_rank(self, rank: int) -> None:
        check_tinker_rank(rank)

    def rank_rule(self) -> str:
        return f">= {TINKER_MIN_LORA_RANK}"

    def _sdk_lora(self, base_model: str, rank: int, seed: int | None) -> Any:
        return self.sdk.create_lora_training_client(
            base_model=base_model, rank=rank, seed=seed
        ).result()

    def _sdk_from_state(self, remote_path: str, with_optimizer: bool) -> Any:
        if with_optimizer:
            return self.sdk.create_training_client_from_state_with_optimizer(remote_path).result()
        return self.sdk.create_training_client_from_state(remote_path).result()

    def _sdk_sampling(self, remote_path: str | None, base_model: str) -> Any:
        if remote_path is not None:  # the server knows the checkpoint's base model
            return self.sdk.create_sampling_client(model_path=remote_path).result()
        return self.sdk.create_sampling_client(base_model=base_model).result()

    def context_limit(self, base_model: str, sdk_client: Any) -> int | None:
        name = base_model
        if sdk_client is not None and hasattr(sdk_client, "get_base_model"):
            name = sdk_client.get_base_model()
        return self.model_context_limit(name)

    def model_context_limit(self, base_model: str) -> int | None:
        """``max_context_length`` of ``base_model`` in the server's capabilities (cached)."""
        with self._limits_lock:
            if self._limits is None:
                self._limits = self._fetch_limits()
            return self._limits.get(base_model)

    def _fetch_limits(self) -> dict[str, int | None]:
        try:
            capabilities = sdk().RestClient().get_server_capabilities()
            response = capabilities.result(timeout=CAPABILITIES_TIMEOUT)
        except Exception as exc:  # the limit is a convenience; the service still checks
            log.warning("tinker: could not read the models' context limits: %s", exc)
            return {}
        return {
            str(m.model_name): m.max_context_length
            for m in response.supported_models
            if m.model_name
        }
