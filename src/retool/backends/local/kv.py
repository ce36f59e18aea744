"""KV-cache storage for the sampling engine: a growable batch cache and a prefix cache.

``BatchCache`` holds the keys/values of every sequence being decoded as one
``[rows, kv_heads, capacity, head_dim]`` buffer per layer. Rows are aligned on
the right (left padding, masked out), so one forward call advances every row by
one token. Appending writes into spare capacity instead of concatenating (HF's
``DynamicCache`` copies the whole cache on every step). Rows join and leave
through :func:`rebuild_batch`: one copy of the rows that stay (without the
columns none of them uses) and every joining prompt's KV into new buffers.

That copy is the expensive part of batch bookkeeping: at 40-64 rows of a few
hundred tokens the batch holds about a gigabyte, and one copy costs 0.3-0.4 s
on this 2-core machine, as much as three decode steps. Measured on an
evaluation of the SFT checkpoint (80 two-turn samples), copying once per
request joining and once per row finishing took 63 of its 125 s. So the
engine copies at most once per step for every request that arrived together,
and lets finished rows ride along (their cost is a row of the next steps'
matrix products, about 3 ms per step at 16-32 rows) until they are half the
batch or new rows join anyway.

``PrefixCache`` remembers the KV of finished prompts and sequences, keyed by
their tokens, so a continuation prompt (previous prompt + completion + delta)
only prefills its new tokens. It is an LRU bounded in bytes and counts hits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [rows, heads, len, dim]


class _GrowableLayer(DynamicLayer):
    """A cache layer that appends into preallocated capacity."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, extra: int) -> None:
        super().__init__()
        rows, heads, length, dim = keys.shape
        self.is_initialized = True
        self.device = keys.device
        self._k = keys.new_empty((rows, heads, length + extra, dim))
        self._v = values.new_empty((rows, heads, length + extra, dim))
        self._k[:, :, :length] = keys
        self._v[:, :, :length] = values
        self._n = length
        self.keys, self.values = self._k[:, :, :length], self._v[:, :, :length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._n + key_states.shape[-2]
        if end > self._k.shape[2]:
            grow = max(end, 2 * self._k.shape[2]) - self._k.shape[2]
            pad = self._k.new_empty((*self._k.shape[:2], grow, self._k.shape[3]))
            self._k = torch.cat([self._k, pad], dim=2)
            self._v = torch.cat([self._v, pad.clone()], dim=2)
        self._k[:, :, self._n : end] = key_states
        self._v[:, :, self._n : end] = value_states
        self._n = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._n

    @classmethod
    def from_buffers(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> _GrowableLayer:
        """A layer over preallocated ``[rows, heads, capacity, dim]`` buffers, ``length`` used."""
        layer = cls.__new__(cls)
        DynamicLayer.__init__(layer)
        layer.is_initialized = True
        layer.device = keys.device
        layer._k, layer._v, layer._n = keys, values, length
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]
        return layer


def make_cache(kv: KV, extra: int = 0) -> DynamicCache:
    """A ``DynamicCache`` whose layers start from ``kv`` and grow in place."""
    cache = DynamicCache()
    cache.layers = [_GrowableLayer(k, v, extra) for k, v in kv]
    return cache


def rebuild_batch(
    cache: DynamicCache | None,
    valid: torch.Tensor | None,
    keep: Sequence[int],
    groups: Sequence[tuple[KV, int]],
    extra: int,
) -> tuple[DynamicCache | None, torch.Tensor | None]:
    """The batch with only rows ``keep`` of ``cache``, then ``count`` rows per ``(kv, count)``.

    ``cache`` is right-aligned with ``valid`` (``[rows, length]``, True where a
    column is real). The result is right-aligned to the widest row in new
    buffers with ``extra`` spare columns, written once: the kept rows lose the
    leading columns none of them uses, the left padding is zeroed (masked, but
    never garbage: a NaN there would survive a zero attention weight), and the
    spare columns are left untouched so they cost no memory until written.
    Returns the new cache and mask, or ``(None, None)`` for an empty batch.
    """
    kept = list(keep) if cache is not None else []
    old_len, first, kept_valid = 0, 0, None
    if kept:
        assert valid is not None
        kept_valid = valid.index_select(0, torch.tensor(kept, device=valid.device))
        first = int(kept_valid.any(0).int().argmax())
        old_len = valid.shape[1] - first
    lengths = [kv[0][0].shape[2] for kv, _ in groups]
    total = len(kept) + sum(count for _, count in groups)
    if total == 0:
        return None, None
    width = max([old_len, *lengths])
    reference: KV = cache_kv(cache) if cache is not None else groups[0][0]
    device = reference[0][0].device
    new_valid = torch.zeros(total, width, dtype=torch.bool, device=device)
    if kept_valid is not None:
        new_valid[: len(kept), width - old_len :] = kept_valid[:, first:]
    row = len(kept)
    for (_, count), n in zip(groups, lengths, strict=True):
        new_valid[row : row + count, width - n :] = True
        row += count
    runs = _runs(kept)
    layers = []
    for index, (ref_k, ref_v) in enumerate(reference):
        buffers = []
        for which, ref in enumerate((ref_k, ref_v)):
            buffer = ref.new_empty((total, ref.shape[1], width + extra, ref.shape[3]))
            if kept:
                buffer[: len(kept), :, : width - old_len].zero_()
                for start, stop, to in runs:
                    buffer[to : to + stop - start, :, width - old_len : width] = ref[
                        start:stop, :, first:
                    ]
            row = len(kept)
            for (kv, count), n in zip(groups, lengths, strict=True):
                buffer[row : row + count, :, : width - n].zero_()
                buffer[row : row + count, :, width - n : width] = kv[index][which]
                row += count
            buffers.append(buffer)
        layers.append(_GrowableLayer.from_buffers(buffers[0], buffers[1], width))
    out = DynamicCache()
    out.layers = layers  # type: ignore[assignment]  # our layers implement HF's layer API
    return out, new_valid


def _runs(rows: Sequence[int]) -> list[tuple[int, int, int]]:
    """``rows`` (ascending) as ``(start, stop, destination)`` runs of consecutive indices."""
    runs: list[tuple[int, int, int]] = []
    for to, row in enumerate(rows):
        if runs and runs[-1][1] == row:
            start, _, dest = runs[-1]
            runs[-1] = (start, row + 1, dest)
        else:
            runs.append((row, row + 1, to))
    return runs


def make_cache_empty() -> DynamicCache:
    """An empty cache for a first prefill (HF's own layers fill it)."""
    return DynamicCache()


def cache_kv(cache: DynamicCache) -> KV:
    """The (views of the) keys/values currently held by ``cache``."""
    # every layer of our caches holds keys and values (HF types also name other layer kinds)
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[misc, union-attr]


def kv_bytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


@dataclass(frozen=True)
class PrefixStats:
    """Prefix-cache counters since the engine started."""

    lookups: int  # prompts looked up
    hits: int  # prompts that reused a cached prefix
    tokens_reused: int  # prompt tokens whose KV came from the cache
    tokens_prefilled: int  # prompt tokens that had to be computed
    entries: int  # entries held now
    bytes: int  # bytes held now


class PrefixCache:
    """LRU map from token sequences to their KV (batch of one), bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._arrays: dict[tuple[int, ...], np.ndarray] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._lookups = self._hits = self._reused = self._prefilled = 0

    def put(self, tokens: Sequence[int], kv: KV, owned: bool = False) -> None:
        """Remember ``kv`` for ``tokens``; ``owned``: the tensors are the caller's to give
        away (fresh, contiguous), so they are kept without a copy."""
        key = tuple(tokens)
        if not key or self.max_bytes <= 0:
            return
        size = kv_bytes(kv)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            # Own the memory: a view would pin a whole batch buffer.
            if not owned:
                kv = [(k.contiguous().clone(), v.contiguous().clone()) for k, v in kv]
            self._entries[key] = kv
            self._arrays[key] = np.asarray(key, dtype=np.int64)
            self._bytes += size
            while self._bytes > self.max_bytes:
                old, evicted = self._entries.popitem(last=False)
                del self._arrays[old]
                self._bytes -= kv_bytes(evicted)

    def longest_prefix(self, tokens: Sequence[int], limit: int) -> tuple[int, KV | None]:
        """The longest cached prefix of ``tokens`` of at most ``limit`` tokens."""
        query = np.asarray(tokens, dtype=np.int64)
        best_len, best_key = 0, None
        with self._lock:
            self._lookups += 1
            for key, array in self._arrays.items():
                n = min(len(array), limit, len(query))
                if n <= best_len:
                    continue
                differ = np.flatnonzero(array[:n] != query[:n])
                common = int(differ[0]) if differ.size else n
                if common > best_len:
                    best_len, best_key = common, key
            best = None
            if best_key is not None:
                self._entries.move_to_end(best_key)
                best = self._entries[best_key]
                self._hits += 1
            self._reused += best_len
            self._prefilled += len(tokens) - best_len
        if best is None:
            return 0, None
        return best_len, [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in best]

    def stats(self) -> PrefixStats:
        with self._lock:
            return PrefixStats(
                self._lookups,
                self._hits,
                self._reused,
                self._prefilled,
                len(self._entries),
                self._bytes,
            )
