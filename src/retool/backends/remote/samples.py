"""What the samplers return, as our types: sequences, stop reasons, stop lists, tensors.

Design, and why:

* **Checked at the border.** A sampled sequence becomes our
  :class:`~retool.types.SampledSequence` only with one finite logprob per
  token (:func:`checked_tokens`, also used by the vLLM server client); a
  sequence without logprobs, or stopped for a reason that is neither a stop
  nor the length limit (an abort), is a :class:`~retool.errors.BackendError`,
  which the rollout retries and then counts as ``sampler_error``.
* **Stop reasons** are mapped by meaning, not by one SDK's spelling
  (:func:`stop_reason`), so both services and their versions read alike.
* **Stop lists** go out as one kind, strings or token ids, which is all both
  SDKs accept (:func:`split_stops`).
* **Tensors** from the SDKs keep their kind: integers become int64, anything
  else float32 (:func:`our_tensor`).

SDK values (a tensor, a stop reason, a tokenizer) are typed ``Any`` or
``object``: they are the SDKs' own classes, imported only by the adapters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from retool.errors import BackendError
from retool.types import SampledSequence, SamplerStop, TensorData, Tokenizer


def our_tensor(array: Any) -> TensorData:
    """Our :class:`TensorData` from an SDK tensor or array (float32 / int64 kept)."""
    to_numpy = getattr(array, "to_numpy", None)
    values = np.asarray(to_numpy() if callable(to_numpy) else array)
    if np.issubdtype(values.dtype, np.integer):
        return TensorData.from_numpy(values.astype(np.int64))
    return TensorData.from_numpy(values.astype(np.float32))


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


def split_stops(stop: Sequence[str | int], tokenizer: Tokenizer) -> list[str] | list[int] | None:
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
