"""What the PyTRIO and Tinker adapters share: clients over a remote training service.

Both services speak the Tinker-shaped API of :mod:`retool.types`, so one set
of client classes serves both; :mod:`retool.backends.pytrio` and
:mod:`retool.backends.tinker` subclass them with the few SDK calls and type
conversions that differ (each cites the installed SDK file it follows).

Design, and why:

* **Futures.** SDK futures (Tinker's ``APIFuture``, PyTRIO's ``APIFuture``
  without ``result_async``) are bridged into our :class:`~retool.types.Future`
  by a done-callback on the SDK's own ``concurrent.futures.Future``: no thread
  waits per request, ``.result()`` and ``await`` both work, and an SDK
  exception (raised at submit time or delivered later) comes out of our
  future as a :class:`~retool.errors.BackendError` that keeps the SDK error
  as its cause. No retry layer is added: both SDKs retry transport errors
  themselves, and what is left is the rollout's ``sampler_error`` path.
* **Loss reduction.** Our contract is a sum over loss tokens
  (:mod:`retool.types`). A service that divides each ``forward_backward``
  call by a token count gets the advantages (or cross-entropy weights)
  multiplied by that same count, which makes its update equal to the sum:
  every built-in loss is positively homogeneous in the advantage. The
  count is computed from the datums exactly as the SDK computes the
  denominators it sends (see :func:`loss_denominator`), and which count, if
  any, is ``model.loss_reduction`` (documented on
  :class:`~retool.config.ModelConfig`).
* **Masking.** Policy losses send exactly ``target_tokens``, ``logprobs`` and
  ``advantages``; cross-entropy sends ``target_tokens`` and ``weights``. Any
  other key (a ``mask``, ``weights`` on a policy loss) is dropped, as the
  local backend ignores it too: masked positions already carry advantage 0
  and logprob 0.
* **Checkpoints.** A remote checkpoint lives on the service; the run
  directory gets a small *pointer* directory for it
  (``checkpoints/state/<name>/retool_state.json``,
  ``checkpoints/sampler/<name>/retool_sampler.json``) naming the backend and
  the service URI, written atomically. The run directory's manifest,
  ``--resume``, ``--init-from`` and ``retool eval --model RUN_DIR`` then work
  unchanged; resume goes through
  ``create_training_client_from_state_with_optimizer`` on both services
  (PyTRIO's ``load_state`` only works before the first training step).
* **Limits** the service imposes and the SDK states (LoRA rank range,
  checkpoint names, the model's longest sequence) are checked before the
  request that would break them, with an error that says what to change.
* **Credentials** are the SDKs' own (environment variable or the SDK's login
  command); they are checked for presence before any request and never read
  into, stored or logged by our code.
"""

from __future__ import annotations

import abc
import concurrent.futures
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retool.errors import BackendError, ConfigError, RetoolError
from retool.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    Future,
    ModelInput,
    OptimStepOutput,
    SampledSequence,
    SampleResponse,
    SamplerStop,
    SamplingParams,
    SaveStateOutput,
    TensorData,
)

log = logging.getLogger(__name__)

POINTER_FORMAT = "remote-1"  # format tag of a pointer directory's JSON file
POLICY_LOSSES = ("importance_sampling", "ppo", "cispo")
LOSS_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    **{name: ("target_tokens", "logprobs", "advantages") for name in POLICY_LOSSES},
}
CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")
IGNORED_TARGET = -100  # label both SDKs skip (pytrio/client/training_batch.py)

# A checkpoint name the services accept and that is a safe directory name here:
# PyTRIO's own pattern (pytrio/client/builders/training.py: CHECKPOINT_NAME_PATTERN_TEXT).
CHECKPOINT_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?$")
CHECKPOINT_NAME_MAX = 200  # pytrio/client/builders/training.py: CHECKPOINT_NAME_MAX_LENGTH
MESSAGE_LIMIT = 600  # characters of an SDK error kept in our one-line message


# -- errors and futures -----------------------------------------------------------------


def translate(exc: BaseException, backend: str, what: str) -> BaseException:
    """An SDK exception as a one-line :class:`BackendError` (the SDK error kept as cause)."""
    if isinstance(exc, RetoolError) or not isinstance(exc, Exception):
        return exc
    text = " ".join(str(exc).split())
    if len(text) > MESSAGE_LIMIT:
        text = text[:MESSAGE_LIMIT] + "..."
    error = BackendError(f"{backend}: {what} failed: {type(exc).__name__}: {text}")
    error.__cause__ = exc
    return error


_waiters: concurrent.futures.ThreadPoolExecutor | None = None
_waiters_lock = threading.Lock()


def _concurrent_future(sdk_future: Any) -> concurrent.futures.Future[Any]:
    """The ``concurrent.futures.Future`` behind an SDK future.

    Tinker exposes it (``APIFuture.future()``, tinker/lib/public_interfaces/
    api_future.py); PyTRIO's ``APIFuture`` keeps it as ``_future`` and awaits
    it the same way (pytrio/types/future/api_future.py: ``APIFuture.__await__``).
    Anything else is waited on by a shared worker thread.
    """
    getter = getattr(sdk_future, "future", None)
    if callable(getter):
        inner = getter()
        if isinstance(inner, concurrent.futures.Future):
            return inner
    if isinstance(sdk_future, concurrent.futures.Future):
        return sdk_future
    inner = getattr(sdk_future, "_future", None)
    if isinstance(inner, concurrent.futures.Future):
        return inner
    global _waiters
    with _waiters_lock:
        if _waiters is None:
            _waiters = concurrent.futures.ThreadPoolExecutor(4, "retool-remote-wait")
    return _waiters.submit(sdk_future.result)


def bridge(sdk_future: Any, convert: Callable[[Any], Any], backend: str, what: str) -> Future[Any]:
    """Our :class:`Future` of ``convert(result)`` for an SDK future.

    ``convert`` runs in the SDK's completion callback; an exception from the
    SDK or from ``convert`` fails our future (translated, see :func:`translate`).
    """
    source = _concurrent_future(sdk_future)
    target: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def done(finished: concurrent.futures.Future[Any]) -> None:
        if target.done():
            return
        if finished.cancelled():
            target.cancel()
            return
        error = finished.exception()
        if error is not None:
            target.set_exception(translate(error, backend, what))
            return
        try:
            target.set_result(convert(finished.result()))
        except BaseException as exc:
            target.set_exception(translate(exc, backend, what))

    source.add_done_callback(done)
    return Future(target)


def submit(
    start: Callable[[], Any], convert: Callable[[Any], Any], backend: str, what: str
) -> Future[Any]:
    """``bridge(start(), convert)``; an exception raised by ``start`` fails the future."""
    try:
        sdk_future = start()
    except Exception as exc:
        return Future.failed(translate(exc, backend, what))
    return bridge(sdk_future, convert, backend, what)


def call(start: Callable[[], Any], backend: str, what: str) -> Any:
    """``start()`` with SDK exceptions translated (for calls that block and return)."""
    try:
        return start()
    except RetoolError:
        raise
    except Exception as exc:
        raise translate(exc, backend, what) from exc


# -- limits -----------------------------------------------------------------------------


def check_checkpoint_name(name: str, backend: str) -> None:
    """Refuse a checkpoint name the service would reject (before any request)."""
    if not isinstance(name, str) or not CHECKPOINT_NAME.fullmatch(name):
        raise BackendError(
            f"{backend}: checkpoint name {name!r} must match {CHECKPOINT_NAME.pattern} "
            "(letters, digits, '.', '_', '-'; no '/' or spaces)"
        )
    if len(name) > CHECKPOINT_NAME_MAX:
        raise BackendError(
            f"{backend}: checkpoint name {name[:40]!r}... is {len(name)} characters, "
            f"more than {CHECKPOINT_NAME_MAX}"
        )


def check_lengths(data: Sequence[Datum], limit: int | None, backend: str) -> None:
    """Refuse a datum longer than the service's sequence limit (before any request)."""
    if not limit:
        return
    for index, datum in enumerate(data):
        if datum.model_input.length > limit:
            raise BackendError(
                f"{backend}: datum {index} has {datum.model_input.length} tokens, more than "
                f"the model's max_seq_len ({limit}) on this service; lower "
                "train.max_train_tokens and rollout.max_trajectory_tokens"
            )


# -- losses -----------------------------------------------------------------------------


def _array(datum: Datum, key: str) -> np.ndarray:
    return datum.loss_fn_inputs[key].to_numpy().reshape(-1)


def check_loss_inputs(data: Sequence[Datum], loss_fn: str, backend: str) -> None:
    if loss_fn not in LOSS_INPUTS:
        raise BackendError(
            f"{backend}: unknown loss_fn {loss_fn!r}; choose one of {', '.join(LOSS_INPUTS)}"
        )
    if not data:
        raise BackendError(f"{backend}: forward_backward needs at least one datum")
    for index, datum in enumerate(data):
        if datum.model_input.length == 0:
            raise BackendError(f"{backend}: datum {index} has no tokens")
        for key in LOSS_INPUTS[loss_fn]:
            if key not in datum.loss_fn_inputs:
                raise BackendError(
                    f"{backend}: datum {index} lacks loss_fn_inputs[{key!r}] needed by {loss_fn}"
                )


def loss_denominator(reduction: str, loss_fn: str, data: Sequence[Datum]) -> int:
    """The count a service divides one call's summed loss by (1 for ``sum``).

    Counted as PyTRIO counts the denominators it sends with every chunk of a
    call (pytrio/client/training_batch.py: ``plan_training_batch``, with
    ``auto_shift=False``): ``total_active_tokens`` is the positions whose
    target is not -100, further restricted to non-zero ``weights`` for
    cross-entropy; ``total_advantage_tokens`` the active positions with a
    non-zero advantage. Cross-entropy has no advantages, so
    ``advantage_token_mean`` counts its active tokens.
    """
    if reduction == "sum":
        return 1
    total = 0
    for datum in data:
        active = _array(datum, "target_tokens") != IGNORED_TARGET
        if loss_fn == "cross_entropy":
            active &= _array(datum, "weights") != 0
        elif reduction == "advantage_token_mean":
            active &= _array(datum, "advantages") != 0
        total += int(active.sum())
    return max(total, 1)


def loss_inputs(datum: Datum, loss_fn: str, scale: float) -> dict[str, np.ndarray]:
    """The arrays the service gets for ``datum``: only the loss's keys, scaled for reduction."""
    target = _array(datum, "target_tokens").astype(np.int64)
    if loss_fn == "cross_entropy":
        weights = _array(datum, "weights").astype(np.float64) * scale
        return {"target_tokens": target, "weights": weights.astype(np.float32)}
    advantages = _array(datum, "advantages").astype(np.float64) * scale
    return {
        "target_tokens": target,
        "logprobs": _array(datum, "logprobs").astype(np.float32),
        "advantages": advantages.astype(np.float32),
    }


def loss_config(loss_fn: str, config: Mapping[str, float] | None) -> dict[str, float] | None:
    """The ``loss_fn_config`` to send: clip thresholds only where the loss clips."""
    if not config:
        return None
    kept = {
        str(k): float(v)
        for k, v in config.items()
        if loss_fn in ("ppo", "cispo") or k not in CLIP_KEYS
    }
    return kept or None


def loss_tokens(datum: Datum, loss_fn: str) -> int:
    """Positions that produce loss, counted as the local backend counts them."""
    key = "weights" if loss_fn == "cross_entropy" else "advantages"
    return int(np.count_nonzero(_array(datum, key)))


def ratio_metrics(
    data: Sequence[Datum], logprobs: Sequence[np.ndarray], config: Mapping[str, float] | None
) -> dict[str, float]:
    """``clip_fraction``, ``approx_kl`` and ``ratio_max`` over loss tokens, as the local backend.

    Computed from the current-policy logprobs the service returns with the
    loss (``loss_fn_outputs[i]["logprobs"]``) and the sampler's ones we sent.
    """
    ratios, diffs = [], []
    for datum, current in zip(data, logprobs, strict=True):
        active = _array(datum, "advantages") != 0
        old = _array(datum, "logprobs").astype(np.float64)[active]
        new = np.asarray(current, dtype=np.float64).reshape(-1)[active]
        ratios.append(np.exp(new - old))
        diffs.append(old - new)
    ratio = np.concatenate(ratios) if ratios else np.zeros(0)
    n = ratio.size
    metrics = {
        "approx_kl": float(np.concatenate(diffs).sum()) / max(n, 1),
        "ratio_max": float(ratio.max()) if n else 1.0,
    }
    if config and all(k in config for k in CLIP_KEYS):
        low, high = float(config[CLIP_KEYS[0]]), float(config[CLIP_KEYS[1]])
        metrics["clip_fraction"] = float(((ratio < low) | (ratio > high)).sum()) / max(n, 1)
    return metrics


_SAID: set[str] = set()  # backends already told about a missing loss (said once per process)


def loss_from_outputs(
    data: Sequence[Datum],
    loss_fn: str,
    outputs: Sequence[dict[str, TensorData]],
    config: Mapping[str, float] | None,
) -> float | None:
    """The summed loss recomputed from the per-token ``logprobs`` the service returned.

    For a service that reports no loss metric (or one under another name):
    the same sums the local backend takes, over our own (unscaled) weights
    and advantages. ``None`` where the SDK returned no logprobs or the loss
    is not one this formula covers.
    """
    if not outputs or not all("logprobs" in o for o in outputs):
        return None
    total = 0.0
    for datum, output in zip(data, outputs, strict=True):
        new = np.asarray(output["logprobs"].to_numpy(), dtype=np.float64).reshape(-1)
        if loss_fn == "cross_entropy":
            total += float(-(new * _array(datum, "weights").astype(np.float64)).sum())
            continue
        advantages = _array(datum, "advantages").astype(np.float64)
        ratio = np.exp(new - _array(datum, "logprobs").astype(np.float64))
        if loss_fn == "importance_sampling":
            total += float(-(ratio * advantages).sum())
        elif loss_fn == "ppo" and config and all(k in config for k in CLIP_KEYS):
            low, high = float(config[CLIP_KEYS[0]]), float(config[CLIP_KEYS[1]])
            clipped = np.clip(ratio, low, high) * advantages
            total += float(-np.minimum(ratio * advantages, clipped).sum())
        else:
            return None
    return total


def fallback_loss(
    backend: str,
    data: Sequence[Datum],
    loss_fn: str,
    outputs: Sequence[dict[str, TensorData]],
    config: Mapping[str, float] | None,
    metrics: Sequence[str],
    expected: str,
) -> float:
    """The loss when the service's metrics lack ``expected``: recomputed (said once), or an
    error naming what it did report."""
    loss = loss_from_outputs(data, loss_fn, outputs, config)
    if loss is None:
        raise BackendError(
            f"{backend} returned no {expected} (metrics: {sorted(metrics)}) and no per-token "
            "logprobs to compute it from; check that the service speaks this SDK version"
        )
    if backend not in _SAID:
        _SAID.add(backend)
        print(
            f"retool: note: {backend} reported no {expected} (metrics: {sorted(metrics)}); "
            "computing the loss from its per-token logprobs",
            file=sys.stderr,
        )
    return loss


def trainer_metrics(
    data: Sequence[Datum],
    loss_fn: str,
    loss_sum: float,
    outputs: Sequence[dict[str, TensorData]],
    config: Mapping[str, float] | None,
    service: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """One call's metrics under the local backend's names (see ``training/metrics.py``)."""
    metrics = {
        "loss:sum": float(loss_sum),
        "loss_tokens": float(sum(loss_tokens(d, loss_fn) for d in data)),
    }
    if loss_fn in POLICY_LOSSES and all("logprobs" in o for o in outputs):
        metrics.update(ratio_metrics(data, [o["logprobs"].to_numpy() for o in outputs], config))
    for name, value in (service or {}).items():
        metrics.setdefault(name, float(value))
    return metrics


def our_tensor(array: Any) -> TensorData:
    """Our :class:`TensorData` from an SDK tensor or array (float32 / int64 kept)."""
    to_numpy = getattr(array, "to_numpy", None)
    values = np.asarray(to_numpy() if callable(to_numpy) else array)
    if np.issubdtype(values.dtype, np.integer):
        return TensorData.from_numpy(values.astype(np.int64))
    return TensorData.from_numpy(values.astype(np.float32))


# -- sampling ---------------------------------------------------------------------------

_STOP_WORDS = {"stop", "eos", "stop_sequence", "stop_token", "end_turn", "eos_token"}
_LENGTH_WORDS = {"length", "max_tokens", "max_length", "max_new_tokens"}


def stop_reason(raw: Any, num_tokens: int, max_tokens: int, backend: str) -> SamplerStop:
    """Our :class:`SamplerStop` for an SDK's stop reason.

    Tinker's is ``"stop"`` or ``"length"`` (tinker/types/_pydantic_types/
    stop_reason.py); PyTRIO's is a free string (pytrio/protocol/actor/
    sampling_run/sample.py: ``ActorSampleSequence.stop_reason``, default
    ``""``). An empty one is read from the length: fewer than ``max_tokens``
    new tokens can only have ended at a stop. Anything else (an abort) is an
    error, which the rollout retries and then counts as ``sampler_error``.
    """
    value = str(getattr(raw, "value", raw) or "").strip().lower()
    if value in _STOP_WORDS:
        return SamplerStop.STOP
    if value in _LENGTH_WORDS:
        return SamplerStop.LENGTH
    if not value:
        return SamplerStop.LENGTH if num_tokens >= max_tokens else SamplerStop.STOP
    raise BackendError(f"{backend}: the sampler stopped a sequence with reason {value!r}")


def split_stops(stop: Sequence[str | int], tokenizer: Any) -> list[str] | list[int] | None:
    """Our mixed stop list as one kind, which is all both SDKs accept.

    Both take stop strings *or* stop token ids, not both (pytrio/types/sample/
    sampling_params.py, tinker/types/_pydantic_types/sampling_params.py). A
    mixed list is sent as strings, the token ids rendered to their token text.
    """
    if not stop:
        return None
    if all(isinstance(s, int) for s in stop):
        return [int(s) for s in stop]
    if all(isinstance(s, str) for s in stop):
        return [str(s) for s in stop]
    strings = [s for s in stop if isinstance(s, str)]
    for token in stop:
        if isinstance(token, int):
            text = tokenizer.convert_ids_to_tokens(int(token))
            if text and text not in strings:
                strings.append(text)
    return strings


def checked_tokens(
    token_ids: Sequence[int], logprobs: Sequence[float], who: str
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Sampled tokens and their logprobs as tuples; one logprob per token, all finite
    (``who`` starts the error: "tinker: the sampler", "vllm: the engine")."""
    tokens = tuple(int(t) for t in token_ids)
    values = tuple(float(v) for v in logprobs)
    if len(values) != len(tokens):
        raise BackendError(f"{who} returned {len(tokens)} tokens but {len(values)} logprobs")
    if not all(math.isfinite(v) for v in values):
        raise BackendError(f"{who} returned a non-finite logprob")
    return tokens, values


def sequence(
    tokens: Sequence[int],
    logprobs: Sequence[float] | None,
    text: str | None,
    raw_stop: Any,
    max_tokens: int,
    backend: str,
) -> SampledSequence:
    """One of our sampled sequences from the SDK's fields, checked."""
    if logprobs is None:
        raise BackendError(f"{backend}: the sampler returned no logprobs for a sequence")
    tokens, values = checked_tokens(tokens, logprobs, f"{backend}: the sampler")
    return SampledSequence(
        tokens=tokens,
        logprobs=values,
        text=text,
        stop_reason=stop_reason(raw_stop, len(tokens), max_tokens, backend),
    )


# -- pointer directories ----------------------------------------------------------------


@dataclass(frozen=True)
class RemoteCheckpoint:
    """What a pointer directory records about a checkpoint kept by the service."""

    backend: str  # "pytrio" | "tinker"
    remote_path: str  # the service's URI for it
    base_model: str  # the model it was trained from
    lora_rank: int | None = None  # adapter rank (state checkpoints)
    steps: int = 0  # optimizer steps taken when it was saved (state checkpoints)


STATE_FILE = "retool_state.json"
SAMPLER_FILE = "retool_sampler.json"


def write_pointer(directory: Path, file_name: str, checkpoint: RemoteCheckpoint) -> Path:
    """Write ``directory/file_name`` atomically (a temporary sibling renamed into place)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        record = {"format": POINTER_FORMAT, **asdict(checkpoint)}
        (tmp / file_name).write_text(json.dumps(record, indent=2), encoding="utf-8")
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def read_pointer(path: str | Path, file_name: str, backend: str, scheme: str) -> RemoteCheckpoint:
    """The checkpoint a local pointer directory names, or a bare service URI."""
    text = str(path)
    if "://" in text and not Path(text).exists():
        if scheme and not text.startswith(scheme):
            raise BackendError(f"{backend}: {text!r} is not a {backend} path ({scheme}...)")
        return RemoteCheckpoint(backend, text, "")
    record_path = Path(text) / file_name
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BackendError(
            f"{backend}: {text} is not a checkpoint of this run's service (no {file_name})"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BackendError(f"{record_path}: unreadable ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != POINTER_FORMAT:
        raise BackendError(
            f"{record_path}: a local checkpoint, not a {backend} one; start from it with "
            'model.backend = "local"'
        )
    if record.get("backend") != backend:
        raise BackendError(
            f"{record_path}: saved on {record.get('backend')!r}; set "
            f'model.backend = "{record.get("backend")}" to use it'
        )
    try:
        rank = record.get("lora_rank")
        return RemoteCheckpoint(
            backend=backend,
            remote_path=str(record["remote_path"]),
            base_model=str(record.get("base_model") or ""),
            lora_rank=None if rank is None else int(rank),
            steps=int(record.get("steps") or 0),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BackendError(f"{record_path}: not a valid pointer ({exc})") from None


# -- clients ----------------------------------------------------------------------------


class RemoteSamplingClient(abc.ABC):
    """Samples from one snapshot of the policy held by the service."""

    backend = "remote"

    def __init__(
        self,
        sdk_client: Any,
        max_context_tokens: int | None = None,
        tokenizer: Any = None,
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

    def get_tokenizer(self) -> Any:
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
        def convert(values: Any) -> list[float | None]:
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
        sdk_client: Any,
        base_model: str,
        lora_rank: int,
        steps: int = 0,
    ) -> None:
        self.service = service
        self.sdk = sdk_client
        self.base_model = base_model
        self.lora_rank = lora_rank
        self.steps = steps  # optimizer steps taken (restored on resume)
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()

    @property
    def reduction(self) -> str:
        return self.service.loss_reduction

    @property
    def max_context_tokens(self) -> int | None:
        """The model's longest training sequence on this service, when the SDK reports it."""
        return None

    def get_tokenizer(self) -> Any:
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

        def convert(_: Any) -> None:
            if with_optimizer:
                self.steps = checkpoint.steps

        method = self.sdk.load_state_with_optimizer if with_optimizer else self.sdk.load_state
        return submit(lambda: method(checkpoint.remote_path), convert, self.backend, "load_state")

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> Any:
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

    def __init__(self, model: Any, checkpoint_root: str | Path = "runs/checkpoints") -> None:
        self.model = model  # the ModelConfig
        self.checkpoint_root = Path(checkpoint_root)
        self.loss_reduction = resolve_loss_reduction(model.loss_reduction, self.backend)
        self._check_credentials()
        self._sdk: Any = None
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
        tokenizer: Any = None,
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


def resolve_loss_reduction(setting: str, backend: str) -> str:
    """``model.loss_reduction`` with ``auto`` resolved for ``backend``."""
    if setting != "auto":
        return setting
    return {"pytrio": "active_token_mean"}.get(backend, "sum")
