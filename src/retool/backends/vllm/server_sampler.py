"""Sampling from ``vllm serve``: the step's client of one served model (an adapter or the base).

:class:`ServerSamplingClient` is the :class:`~retool.types.SamplingClient` the
rollout uses in server mode; :class:`~retool.backends.vllm.servers.VllmServers`
carries its requests.

Design, and why:

* **Token-in/token-out over ``/v1/completions``.** ``prompt`` is a list of
  token ids, ``return_token_ids`` brings the sampled ids back (vLLM 0.32:
  ``CompletionResponseChoice.token_ids``), ``logprobs = 0`` the sampled
  token's logprob (``logprobs.token_logprobs``), which is our convention when
  the server runs with ``--logprobs-mode raw_logprobs`` (vLLM's default: the
  log-softmax of the raw logits, before temperature and top-p/top-k). The
  fields are :func:`retool.backends.vllm.convert.request_fields`, shared with
  the in-process engine, so both ask vLLM the same thing. Text is decoded here
  from the tokens (vLLM's text ends at a stop string; the last token may carry
  characters past it), as the local sampler does. ``compute_logprobs`` asks
  for ``prompt_logprobs = 0``.
* **Greedy with several samples** is sent as that many copies of the prompt
  (vLLM refuses ``n > 1`` at temperature 0); seeded samples keep ``n``: vLLM
  gives sample ``i`` the seed ``seed + i`` (``v1/engine/parallel_sampling.py``),
  so seeds are folded below ``2**62`` to keep that sum in range.
* **The version is the server's word.** The server names the model it used in
  each reply's ``model`` field; that name becomes every sample's
  ``policy_version``, the evidence the rollout checks against the step, so a
  sync that did not apply is seen in every sample.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from retool.backends.vllm.convert import request_fields, sequence
from retool.backends.vllm.endpoints import BACKEND
from retool.errors import BackendError
from retool.types import Future, ModelInput, SampleResponse, SamplingParams, Tokenizer

if TYPE_CHECKING:  # servers makes these clients: annotations only, no import circle
    from retool.backends.vllm.servers import VllmServers

SEED_RANGE = 1 << 62  # seeds are folded below this: vLLM adds the sample index to it


class ServerSamplingClient:
    """Samples one served model (a published ``policy-step-N`` or the base) of the servers."""

    def __init__(
        self,
        servers: VllmServers,
        model: str,
        tokenizer: Tokenizer,
        max_context_tokens: int | None = None,
    ) -> None:
        self.servers = servers
        self.model = model
        self.name = model
        # the version every sample must carry (the rollout checks); the servers name the one
        # they used in each reply
        self.policy_version = model
        self._tokenizer = tokenizer
        self._max_context_tokens = max_context_tokens

    @property
    def max_context_tokens(self) -> int | None:
        """The servers' ``max_model_len`` (checked by the rollout)."""
        return self._max_context_tokens

    def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def close(self) -> None:
        """Nothing to free: the servers hold the weights; the adapter is retired on publish."""

    def completion_body(
        self, prompt: ModelInput, num_samples: int, params: SamplingParams
    ) -> dict[str, Any]:
        """The ``/v1/completions`` request for one sampling call."""
        fields = request_fields(params, num_samples)
        fields.pop("detokenize", None)  # an engine argument; the server decides by itself
        if fields.get("seed") is not None:
            fields["seed"] = int(fields["seed"]) % SEED_RANGE
        tokens = prompt.to_ints()
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": tokens,
            "return_token_ids": True,
            "stream": False,
            # Explicit, so a model's generation_config cannot change the sampling.
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "min_p": 0.0,
            **fields,
        }
        if params.temperature == 0 and num_samples > 1:
            body["prompt"] = [tokens] * num_samples  # vLLM refuses n > 1 when greedy
            body["n"] = 1
        return body

    def _sample(self, prompt: ModelInput, num_samples: int, params: SamplingParams) -> Any:
        if prompt.length == 0:
            raise BackendError(f"{BACKEND}: cannot sample from an empty prompt")
        body = self.completion_body(prompt, num_samples, params)
        reply = self.servers.request("/v1/completions", body)
        return self._response(reply, num_samples, params)

    def _response(self, reply: Any, num_samples: int, params: SamplingParams) -> SampleResponse:
        try:
            served = str(reply["model"])
            choices = sorted(reply["choices"], key=lambda c: int(c["index"]))
        except (TypeError, KeyError, ValueError):
            raise BackendError(
                f"{BACKEND}: a completion reply without model/choices: {reply!r:.200}"
            ) from None
        if len(choices) != num_samples:
            raise BackendError(
                f"{BACKEND}: asked for {num_samples} samples, the server returned {len(choices)}"
            )
        sequences = []
        for choice in choices:
            token_ids = choice.get("token_ids")
            if token_ids is None:
                raise BackendError(
                    f"{BACKEND}: the server returned no token_ids (vLLM older than 0.10.2?)"
                )
            logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
            if logprobs is None or any(v is None for v in logprobs):
                raise BackendError(f"{BACKEND}: the server returned no logprobs for a sample")
            sequences.append(
                sequence(
                    token_ids,
                    logprobs,
                    choice.get("finish_reason"),
                    params.max_tokens,
                    text=self._text(token_ids),
                    policy_version=served,
                )
            )
        return SampleResponse(tuple(sequences))

    def _text(self, token_ids: Sequence[int]) -> str | None:
        if self._tokenizer is None:
            return None
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def sample(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Future[SampleResponse]:
        return self.servers.submit(lambda: self._sample(prompt, num_samples, sampling_params))

    def sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Awaitable[SampleResponse]:
        return self.sample(prompt, num_samples, sampling_params)

    def compute_logprobs(self, prompt: ModelInput) -> Future[list[float | None]]:
        """Logprob of each prompt token given those before it (``None`` for the first)."""

        def run() -> list[float | None]:
            tokens = prompt.to_ints()
            body = {
                "model": self.model,
                "prompt": tokens,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 0,
                "stream": False,
            }
            reply = self.servers.request("/v1/completions", body)
            try:
                entries = reply["choices"][0]["prompt_logprobs"]
            except (TypeError, KeyError, IndexError):
                raise BackendError(f"{BACKEND}: a reply without prompt_logprobs") from None
            return prompt_logprobs(entries, tokens)

        return self.servers.submit(run)


def prompt_logprobs(entries: Any, prompt: Sequence[int]) -> list[float | None]:
    """A JSON ``prompt_logprobs`` list (``{"<token id>": {"logprob": ...}}`` per position)
    as ``compute_logprobs`` returns it: ``None`` first, then each token's logprob."""
    if not isinstance(entries, list) or len(entries) != len(prompt):
        got = len(entries) if isinstance(entries, list) else "none"
        raise BackendError(
            f"{BACKEND}: asked for {len(prompt)} prompt logprobs, the server returned {got}"
        )
    out: list[float | None] = [None]
    for position in range(1, len(prompt)):
        entry = entries[position]
        value = entry.get(str(int(prompt[position]))) if isinstance(entry, Mapping) else None
        if isinstance(value, Mapping):
            value = value.get("logprob")
        if value is None:
            raise BackendError(f"{BACKEND}: no logprob for prompt token at position {position}")
        out.append(float(value))
    return out
