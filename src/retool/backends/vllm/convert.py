"""Our sampling contract in vLLM's terms, and vLLM's outputs back in ours.

Shared by the in-process engine (:mod:`retool.backends.vllm.engine`) and the
``vllm serve`` client, so both ask the same thing and read replies alike.
Everything here takes and returns plain Python values (no ``vllm`` import):
the server client sends :func:`request_fields` as JSON, the engine passes it
to ``vllm.SamplingParams(**fields)``.

The contract (:mod:`retool.types`), and how vLLM is made to keep it:

* Token-in/token-out: prompts go as token ids, completions come back as
  ``token_ids``; text is never re-encoded. vLLM detokenizes only to find stop
  strings, so ``detokenize`` is on only when the request has some.
* Stops: our stop token ids and strings, nothing else. vLLM also stops at the
  model's EOS ids unless ``ignore_eos``; our sampler stops only where the
  caller says (the rollout passes EOS in its stops), so ``ignore_eos`` is set.
  The stop is kept: stop ids are in ``token_ids`` unless vLLM is told to drop
  them (it keeps them for ``stop_token_ids``); ``include_stop_str_in_output``
  keeps the text of a stop string. vLLM matches stop strings in its own
  detokenized text, so that text keeps special tokens (``skip_special_tokens``
  off): a stop string that is a special token's text matches, as in our sampler.
* Logprobs: ``logprobs=0`` returns the sampled token's logprob only; with the
  engine's ``logprobs_mode = "raw_logprobs"`` it is the log-softmax of the raw
  logits, before temperature and top-p/top-k: the policy's own, as the
  trainer computes it.
* ``top_k = -1`` (keep all) is vLLM's ``0`` (``-1`` is refused by newer vLLM).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from retool.backends.remote.samples import checked_tokens
from retool.errors import BackendError
from retool.types import SampledSequence, SamplerStop, SamplingParams

BACKEND = "vllm"


def request_fields(params: SamplingParams, num_samples: int) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments (and ``/v1/completions`` fields) for ours."""
    stop_ids = [int(s) for s in params.stop if isinstance(s, int)]
    stop_strings = [s for s in params.stop if isinstance(s, str)]
    fields: dict[str, Any] = {
        "n": int(num_samples),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": 0 if params.top_k == -1 else params.top_k,
        "seed": params.seed,
        "stop": stop_strings,
        "stop_token_ids": stop_ids,
        "include_stop_str_in_output": True,
        "ignore_eos": True,
        "logprobs": 0,
        "detokenize": bool(stop_strings),
        # Stop strings are looked for in text decoded with special tokens, as the local
        # sampler does: "<|im_end|>" as a stop string must match the token. The text
        # we return is decoded by us, without them (engine._text, server_sampler._text).
        "skip_special_tokens": False,
    }
    return fields


def finish_to_stop(finish_reason: Any, num_tokens: int, max_tokens: int) -> SamplerStop:
    """vLLM's ``finish_reason`` (``stop`` | ``length`` | ``abort``) as our stop reason."""
    value = str(finish_reason or "").lower()
    if value == "stop":
        return SamplerStop.STOP
    if value == "length" or (not value and num_tokens >= max_tokens):
        return SamplerStop.LENGTH
    raise BackendError(f"{BACKEND}: the engine ended a sequence with reason {finish_reason!r}")


def token_logprobs(entries: Any, token_ids: Sequence[int]) -> list[float]:
    """The sampled token's logprob per position, from vLLM's per-position logprob maps.

    ``entries`` is ``CompletionOutput.logprobs``: one ``{token_id: Logprob}``
    (or ``{token_id: float}``) per generated token; with ``logprobs=0`` each
    map holds the sampled token (and nothing else unless it was also the top-1).
    """
    if entries is None:
        raise BackendError(f"{BACKEND}: the engine returned no logprobs (logprobs=0 not set?)")
    values: list[float] = []
    for position, (token, entry) in enumerate(zip(token_ids, entries, strict=False)):
        picked = _pick(entry, int(token))
        if picked is None:
            raise BackendError(
                f"{BACKEND}: no logprob for sampled token {token} at position {position}"
            )
        values.append(picked)
    if len(values) != len(token_ids):
        raise BackendError(
            f"{BACKEND}: the engine returned {len(token_ids)} tokens but {len(values)} logprobs"
        )
    return values


def _pick(entry: Any, token: int) -> float | None:
    if entry is None:
        return None
    if isinstance(entry, Mapping):
        value: Any = entry.get(token)
        if value is None:
            return None
        return float(getattr(value, "logprob", value))
    return None


def sequence(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    finish_reason: Any,
    max_tokens: int,
    text: str | None = None,
    policy_version: str | None = None,
) -> SampledSequence:
    """One of our sampled sequences from an engine's fields, checked."""
    tokens, values = checked_tokens(token_ids, logprobs, f"{BACKEND}: the engine")
    return SampledSequence(
        tokens=tokens,
        logprobs=values,
        text=text or None,
        stop_reason=finish_to_stop(finish_reason, len(tokens), max_tokens),
        policy_version=policy_version,
    )


def completion_sequence(
    completion: Any, max_tokens: int, text: str | None, policy_version: str | None = None
) -> SampledSequence:
    """A ``vllm.CompletionOutput`` as one of our sequences.

    ``text`` is the caller's decode of the tokens: vLLM's own text ends at a stop
    string, while the last token may carry characters past it.
    """
    token_ids = list(completion.token_ids)
    return sequence(
        token_ids,
        token_logprobs(completion.logprobs, token_ids),
        completion.finish_reason,
        max_tokens,
        text=text,
        policy_version=policy_version,
    )


def prompt_logprobs(entries: Any, prompt: Sequence[int]) -> list[float | None]:
    """``RequestOutput.prompt_logprobs`` (``prompt_logprobs=0``) as ``compute_logprobs`` says:
    the logprob of each prompt token given those before it, ``None`` for the first."""
    if entries is None or len(entries) != len(prompt):
        got = "none" if entries is None else len(entries)
        raise BackendError(
            f"{BACKEND}: asked for {len(prompt)} prompt logprobs, the engine returned {got}"
        )
    out: list[float | None] = [None]
    for position in range(1, len(prompt)):
        picked = _pick(entries[position], int(prompt[position]))
        if picked is None:
            raise BackendError(f"{BACKEND}: no logprob for prompt token at position {position}")
        out.append(picked)
    return out
