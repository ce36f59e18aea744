"""``LocalSamplingClient``: a frozen policy snapshot served by a ``SamplingEngine``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import torch

from retool.backends.local.allocator import release_free_memory
from retool.backends.local.engine import SamplingEngine
from retool.backends.local.kv import PrefixStats
from retool.backends.local.threads import run_in_worker
from retool.types import Future, ModelInput, SampleResponse, SamplingParams, Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class LocalSamplingClient:
    """Samples from one frozen copy of the weights.

    The client owns its model while it is open: later optimizer steps of the
    training client it came from do not change what it samples. ``close()``
    stops its engine and hands the model to ``on_close`` (the training client
    reuses it for its next snapshot), so a closed client refuses further calls.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Tokenizer,
        max_context_tokens: int = 8192,
        prefix_cache_bytes: int = 1 << 30,
        name: str | None = None,
        on_close: Callable[[PreTrainedModel], None] | None = None,
        lean_decode: bool = True,
    ) -> None:
        self.name = name
        self._on_close = on_close
        self._tokenizer = tokenizer
        self.engine = SamplingEngine(
            model,
            tokenizer,
            prefix_cache_bytes=prefix_cache_bytes,
            max_context_tokens=max_context_tokens,
            lean_decode=lean_decode,
        )

    def sample(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Future[SampleResponse]:
        return Future(self.engine.submit(prompt.to_ints(), num_samples, sampling_params))

    def sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Awaitable[SampleResponse]:
        return self.sample(prompt, num_samples, sampling_params)

    def compute_logprobs(self, prompt: ModelInput) -> Future[list[float | None]]:
        """Logprob of each prompt token given the ones before it (``None`` for the first)."""

        def run() -> list[float | None]:
            if self.engine.closed:
                raise RuntimeError("the sampling client is closed")
            tokens = prompt.to_ints()
            ids = torch.tensor([tokens], device=self.engine.device)
            with torch.no_grad():
                logits = self.engine.model(input_ids=ids).logits[0].float()
            logprobs = torch.log_softmax(logits[:-1], dim=-1)
            picked = logprobs.gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1).tolist()
            return [None, *picked]

        return Future.run(lambda: run_in_worker(run))

    @property
    def max_context_tokens(self) -> int:
        """Longest prompt + completion this client accepts (checked by the rollout)."""
        return self.engine.max_context_tokens

    def prefix_stats(self) -> PrefixStats:
        return self.engine.prefix_stats()

    def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def close(self) -> None:
        self.engine.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None and self.engine.stopped:
            on_close(self.engine.model)
        if self.engine.stopped:
            # A snapshot's sampling is a phase (an RL step's rollout, an evaluation): hand
            # the heap pages its threads freed back to the OS, or the process keeps them
            # (allocator.py): 6 RL steps of the long demo's config went from 3.0 to 8.0 GB of
            # RSS without this, 2.8 to 3.2 GB with it (docs/measurements.md, 2026-12-07).
            release_free_memory()
