"""What the fake PyTRIO and Tinker services share.

The SDKs run unmodified: every ``httpx.AsyncClient`` they open gets an
``httpx.MockTransport`` whose handler plays the service, so their own
authentication, serialization (JSON, msgpack, protobuf), retries and future
polling are what the adapters are tested against. Nothing leaves the process.

``Policy`` is the fake model: deterministic samples, and "current" logprobs
that differ from the sampler's by a known perturbation, so importance ratios
vary and some fall outside the clip range.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

VOCAB = 200  # token ids of the fake tokenizer
EOS = 1  # its end-of-sequence id


# One word per role marker, so prompts tokenize into known words and <unk>.
CHAT_TEMPLATE = (
    "{% for m in messages %}w2 {{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}w2 assistant {% endif %}"
)


def make_tokenizer_dir(root: Path) -> Path:
    """A tiny word-level tokenizer saved as an HF directory (loads offline, no torch)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": EOS} | {f"w{i}": i for i in range(2, VOCAB)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    path = root / "fake-org" / "tiny-model"
    tokenizer.save_pretrained(path)
    return path


def install_transport(
    monkeypatch, handler: Callable[[httpx.Request], httpx.Response], delay: float = 0.0
) -> None:
    """Route every ``httpx.AsyncClient`` created from now on to ``handler``.

    Clients keep the transport they were built with, so SDK requests made
    after the test (finalizers, heartbeats) still reach the fake. ``delay``:
    seconds each exchange takes on the wire, half before the fake answers and
    half after (``bench/remote_pipeline.py``), without blocking the SDK's loop.
    """
    transport = httpx.MockTransport(handler if delay <= 0 else _delayed(handler, delay))
    original = httpx.AsyncClient.__init__

    def init(self, *args, **kwargs):
        kwargs["transport"] = transport
        kwargs["trust_env"] = False  # no proxy mounts from the environment
        kwargs.pop("http2", None)
        original(self, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "__init__", init)


def _delayed(handler: Callable[[httpx.Request], httpx.Response], delay: float):
    async def exchange(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(delay / 2)
        response = handler(request)
        await asyncio.sleep(delay / 2)
        return response

    return exchange


class Faults:
    """Paths that answer an error a given number of times before they work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: dict[str, tuple[int, int]] = {}  # path fragment -> (times left, status)
        self.served: dict[str, int] = {}

    def fail(self, path_fragment: str, times: int = 1, status: int = 503) -> None:
        with self._lock:
            self.pending[path_fragment] = (times, status)

    def take(self, path: str) -> httpx.Response | None:
        """The error response owed to ``path``, if any."""
        with self._lock:
            for fragment, (left, status) in self.pending.items():
                if fragment in path and left > 0:
                    self.pending[fragment] = (left - 1, status)
                    self.served[fragment] = self.served.get(fragment, 0) + 1
                    # `retry-after-ms` keeps Tinker's HTTP client from backing off long.
                    return httpx.Response(
                        status,
                        json={"code": "injected", "message": f"injected {status}"},
                        headers={"retry-after-ms": "1"},
                    )
        return None


class Policy:
    """A deterministic stand-in for the model behind the fake services."""

    @staticmethod
    def sample(prompt: list[int], num_samples: int, max_tokens: int, seed: int | None):
        """``(tokens, logprobs, stopped)`` per sample: even samples end at EOS early."""
        out = []
        for j in range(num_samples):
            stops = j % 2 == 0 and max_tokens > 4
            length = 4 if stops else max_tokens
            tokens = [2 + (sum(prompt) + 31 * j + 7 * i + (seed or 0)) % 150 for i in range(length)]
            if stops:
                tokens[-1] = EOS
            logprobs = [-0.05 * (i + 1) - 0.01 * j for i in range(length)]
            out.append((tokens, logprobs, stops))
        return out

    @staticmethod
    def current(old: np.ndarray) -> np.ndarray:
        """The trained policy's logprobs for the sampled tokens: ``old`` plus a wobble."""
        positions = np.arange(old.size, dtype=np.float64)
        return old.astype(np.float64) + 0.1 * np.sin(positions + 1.0)

    @staticmethod
    def losses(loss_fn: str, inputs: dict[str, np.ndarray], current: np.ndarray, config: dict):
        """Per-token losses and their gradient w.r.t. ``current``, as the local backend defines."""
        if loss_fn == "cross_entropy":
            w = inputs["weights"].astype(np.float64)
            return -(w * current), -w
        old = inputs["logprobs"].astype(np.float64)
        adv = inputs["advantages"].astype(np.float64)
        low = float(config.get("clip_low_threshold", 0.8))
        high = float(config.get("clip_high_threshold", 1.2))
        ratio = np.exp(current - old)
        clipped = np.clip(ratio, low, high)
        outside = (ratio < low) | (ratio > high)
        if loss_fn == "importance_sampling":
            return -(ratio * adv), -(ratio * adv)
        if loss_fn == "ppo":
            plain, cut = ratio * adv, clipped * adv
            use_plain = plain <= cut
            grad = np.where(use_plain | ~outside, -(ratio * adv), 0.0)
            return -np.minimum(plain, cut), grad
        if loss_fn == "cispo":
            return -(clipped * adv * current), -(clipped * adv)
        raise ValueError(loss_fn)


def alternating_reward(final_text: str, reference: str) -> float:
    """A reward that differs within a group (so every step trains): by the text's length."""
    return 1.0 if len(final_text.split()) % 2 else -1.0
