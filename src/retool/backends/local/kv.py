"""KV-cache storage for the sampling engine: a slot batch cache and a prefix cache.

``BatchCache`` holds the keys/values of every sequence being decoded as one
``[slots, kv_heads, capacity, dim]`` buffer per layer. Rows are aligned on
the right (left padding, masked out), so one forward call advances every row by
one token, written into spare capacity (HF's ``DynamicCache`` concatenates,
copying the whole cache on every step).

Rows join and leave without copying the others. Copying is what made batch
bookkeeping expensive: at 40-64 rows of a few hundred tokens the batch holds
about a gigabyte, and one copy costs 0.3-0.8 s on a 2-core machine, as much as
one to three decode steps. An evaluation of the SFT checkpoint (84 samples,
2026-12-02, AVX2 host) spent 47 of its 210 s in 58 such copies when every
batch of joining rows rebuilt the batch. So a joining row takes a slot a
finished row freed (or a new one), right-aligned at the batch's current
column, and the buffers are copied only when they run out of slots or
columns, or when free slots outnumber live ones; ``bench/batch_cache.py``
measures both bookkeepings on the same workload.

Even those copies stay inside the buffers when they can: new buffers cost
more than the copy itself, because every page of them is faulted in and
zeroed (an evaluation of 28 problems x 4 on the AMX host spent 11 of its 105 s
in ``new_zeros`` for 7 reallocations of 0.3-2.3 GB, 2026-12-04). Compaction
moves the live rows down into the first slots of the same buffers, and a
window that reaches the right end is moved back to the left when that frees
at least half the spare columns; only a batch that needs more slots, or more
columns than its buffers hold, gets new ones.

``PrefixCache`` remembers the KV of finished prompts and sequences, keyed by
their tokens, so a continuation prompt (previous prompt + completion + delta)
only prefills its new tokens. It is an LRU bounded in bytes and counts hits.
"""

from __future__ import annotations

import inspect
import threading
import weakref
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


class _SlotLayer(DynamicLayer):
    """One layer of a :class:`BatchCache`: ``update`` writes the batch's next column.

    It holds its batch by a weak reference. A strong one made a cycle (the batch
    holds its layers), so a batch the engine had dropped was freed only by
    Python's full garbage collection, which a process holding millions of
    long-lived objects (torch, transformers) runs rarely: each RL step's batch
    buffers (1.85 GB for 64 slots of SmolLM2-135M in float32) stayed alive, and the
    long demo's process grew by about that much a step until the OOM killer
    ended it (measured 2026-12-07: 23.9 GB at step 10 on a 24 GiB host).
    """

    def __init__(self, batch: BatchCache, index: int) -> None:
        super().__init__()
        self.is_initialized = True
        self._ref, self._index = weakref.ref(batch), index
        self.device = batch.keys[index].device

    @property
    def _batch(self) -> BatchCache:
        batch = self._ref()
        if batch is None:
            raise RuntimeError("this cache layer's batch was released")
        return batch

    @property  # type: ignore[override]  # HF declares these as attributes
    def keys(self) -> torch.Tensor:
        b = self._batch
        return b.keys[self._index][: b.used, :, b.start : b.end]

    @keys.setter
    def keys(self, value: object) -> None:  # HF's __init__ assigns None
        pass

    @property  # type: ignore[override]
    def values(self) -> torch.Tensor:
        b = self._batch
        return b.values[self._index][: b.used, :, b.start : b.end]

    @values.setter
    def values(self, value: object) -> None:
        pass

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one column (``[used, heads, 1, dim]``) at ``end``; every used column after it."""
        b = self._batch
        k, v = b.keys[self._index], b.values[self._index]
        k[: b.used, :, b.end : b.end + 1] = key_states
        v[: b.used, :, b.end : b.end + 1] = value_states
        return k[: b.used, :, b.start : b.end + 1], v[: b.used, :, b.start : b.end + 1]

    def get_seq_length(self) -> int:
        b = self._batch
        return b.end - b.start


class BatchCache:
    """The KV of every row being decoded: slots x columns, rows right-aligned at ``end``.

    Per layer one ``[slots, kv_heads, capacity, dim]`` buffer for keys and one
    for values, and a ``[slots, capacity]`` mask of the columns that are real.
    Slots ``[0, used)`` take part in a step; a row occupies one slot and its
    tokens the columns just left of ``end``, so one forward call advances every
    row by one token (column ``end``), and ``[start, end)`` is the window a step
    reads: the longest row's tokens.

    Rows join and leave without copying the others (the copy is what made
    batch bookkeeping expensive, see the module docstring): a joining row is
    written into a free slot (a finished row's, else a new one past ``used``),
    right-aligned at ``end``, and the window widens to the left into spare
    columns when the row is longer than every row in it; a finished row frees
    its slot, is computed and ignored until a new row takes it, and the window
    narrows from the left (a view, no copy) when the rows that reached furthest
    left are gone. When free slots outnumber live ones, :meth:`compact` moves
    the live rows down into the first slots of the same buffers; when the
    window reaches the right end (every ``spare`` steps at most), it moves back
    to the left inside them if that frees at least half the spare columns. New
    buffers (the live rows copied) only when the rows need more slots, more
    columns to the left, or a window too wide to move. Buffers do not shrink
    while the batch lives: a batch's memory is its peak until its last row
    finishes.

    ``dtype``: the buffers' dtype, by default the incoming KV's. The lean
    decode step of a bf16 model keeps them in float32 (``decode.py``: bf16
    batched products of this shape are 2-3x slower than float32 ones on CPU);
    a bf16 key or value is exact in float32, and :meth:`row_kv` hands rows back
    in the incoming dtype, so the prefix cache and HF's prefill never see the
    difference.

    A shared prefix (``prefix``: its tokens and KV, given when the batch is
    created or later with :meth:`set_prefix`) is held once: a row whose tokens
    start with it (and go beyond it) keeps only the columns after it, and the
    lean decode step reads the prefix once for all such rows (``decode.py``);
    ``row_kv`` gives the whole KV back.

    Buffers start zeroed, so a masked column holds zeros or an earlier row's
    finite values, never garbage (a NaN there would survive a zero attention
    weight). A free slot's new columns are marked real, so its row attends to
    something and its (ignored) output stays finite.
    """

    def __init__(
        self,
        like: KV,
        slots: int,
        width: int,
        left: int = 128,
        spare: int = 256,
        prefix: tuple[Sequence[int], KV] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.left, self.spare = left, spare
        self.kv_dtype = like[0][0].dtype  # what rows arrive in and leave as
        self.dtype = dtype or self.kv_dtype  # what the buffers hold
        # The shared prefix: its tokens and KV (batch of one), held once for every row whose
        # prompt starts with it; such a row keeps only the columns after it in its slot.
        self.prefix_tokens: tuple[int, ...] = tuple(prefix[0]) if prefix else ()
        self.prefix_kv: KV | None = (
            [(k.to(self.dtype).contiguous(), v.to(self.dtype).contiguous()) for k, v in prefix[1]]
            if prefix
            else None
        )
        self.copies = 0  # buffer copies (reallocations) so far
        self.moves = 0  # compactions and window moves done inside the buffers
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._allocate(like, slots, width)
        self.used = 0
        self._free: list[int] = []  # free slots below ``used``
        self.layers = [_SlotLayer(self, i) for i in range(len(self.keys))]

    def _allocate(self, like: KV, slots: int, width: int) -> None:
        capacity = self.left + width + self.spare
        self.keys = [
            k.new_zeros((slots, k.shape[1], capacity, k.shape[3]), dtype=self.dtype)
            for k, _ in like
        ]
        self.values = [
            v.new_zeros((slots, v.shape[1], capacity, v.shape[3]), dtype=self.dtype)
            for _, v in like
        ]
        self.valid = torch.zeros(slots, capacity, dtype=torch.bool, device=like[0][0].device)
        self.shared = torch.zeros(slots, dtype=torch.bool, device=like[0][0].device)
        self.start = self.end = self.left + width

    @property
    def slots(self) -> int:
        return self.valid.shape[0]

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    @property
    def width(self) -> int:
        return self.end - self.start

    def live(self) -> list[int]:
        free = set(self._free)
        return [s for s in range(self.used) if s not in free]

    # -- rows joining -----------------------------------------------------------
    def add(self, groups: Sequence[tuple[KV, int, Sequence[int]]]) -> list[list[int]]:
        """Put ``count`` rows per ``(kv, count, tokens)``; their slots.

        ``kv`` (a batch of one) holds the KV of ``tokens``. A group whose tokens
        start with the shared prefix (and go beyond it) stores only the columns
        after it. Copies the buffers at most once, only if the rows do not fit.
        """
        shared = [self.starts_with_prefix(tokens) for _, _, tokens in groups]
        skip = len(self.prefix_tokens)
        lengths = [
            kv[0][0].shape[2] - skip * s for (kv, _, _), s in zip(groups, shared, strict=True)
        ]
        rows = sum(count for _, count, _ in groups)
        if not rows:
            return [[] for _ in groups]
        widest = max(lengths)
        spare_slots = len(self._free) + self.slots - self.used
        if rows > spare_slots or widest > self.end:  # no room: copy once
            needed = self.used + rows - len(self._free)
            self._reallocate(needed + min(needed, 16), max(widest, self._live_width()))
        if widest > self.width:  # widen the window into the spare columns on the left
            begin = self.end - widest
            self.valid[: self.used, begin : self.start] = False
            self.start = begin
        out: list[list[int]] = []
        for (kv, count, _), n, share in zip(groups, lengths, shared, strict=True):
            taken = []
            for _ in range(count):
                if self._free:
                    slot = self._free.pop(0)
                else:
                    slot, self.used = self.used, self.used + 1
                taken.append(slot)
            out.append(taken)
            index = torch.tensor(taken, device=self.valid.device)
            self.valid.index_fill_(0, index, False)
            self.valid[index, self.end - n : self.end] = True
            self.shared[index] = share
            first = skip if share else 0
            for layer, (k, v) in enumerate(kv):
                columns = slice(self.end - n, self.end)
                self.keys[layer][index, :, columns] = k[:, :, first:].to(self.dtype)
                self.values[layer][index, :, columns] = v[:, :, first:].to(self.dtype)
        return out

    def set_prefix(self, tokens: Sequence[int], kv: KV) -> None:
        """Hold ``tokens`` (KV ``kv``, a batch of one) once for the rows that join from now on.

        For a batch created without one (its first prompt came alone, as an
        evaluation's first request does): the rows already in it keep all of
        their columns and do not attend to it; the prefix is read once per step
        for every row that joins with a prompt that starts with it.
        """
        if self.prefix_kv is not None:
            raise ValueError("the batch already has a shared prefix")
        if not tokens or kv[0][0].shape[2] < len(tokens):
            raise ValueError("a shared prefix needs tokens and the KV of at least those tokens")
        n = len(tokens)
        self.prefix_tokens = tuple(tokens)
        self.prefix_kv = [
            (k[:, :, :n].to(self.dtype).contiguous(), v[:, :, :n].to(self.dtype).contiguous())
            for k, v in kv
        ]

    def starts_with_prefix(self, tokens: Sequence[int]) -> bool:
        """Whether a row of ``tokens`` would share the prefix (it starts with it and goes on)."""
        n = len(self.prefix_tokens)
        return bool(n) and len(tokens) > n and tuple(tokens[:n]) == self.prefix_tokens

    def step_prefix(self) -> tuple[KV, torch.Tensor] | None:
        """The shared prefix's KV and ``[used]`` which slots attend to it; None without one."""
        if self.prefix_kv is None:
            return None
        return self.prefix_kv, self.shared[: self.used]

    # -- one step -----------------------------------------------------------------
    def step_mask(self) -> torch.Tensor:
        """``[used, width + 1]``: the window plus the column this step writes (real for all).

        Makes room for that column first when the capacity is reached: the
        window moves back to the left inside the buffers if that frees at least
        half the spare columns, else the buffers are copied.
        """
        if self.end >= self.capacity:
            width = self._live_width()
            if self.end - width - self.left >= max(self.spare // 2, 1):
                self._move_window(width)
            else:
                self._reallocate(self.slots, width)
        self.valid[: self.used, self.end] = True
        return self.valid[: self.used, self.start : self.end + 1]

    def advance(self) -> None:
        """The step's column is written: it joins the window."""
        self.end += 1

    # -- rows leaving -------------------------------------------------------------
    def row_kv(self, slot: int) -> KV:
        """Slot ``slot``'s KV without padding: fresh contiguous tensors, in ``kv_dtype``."""
        columns = self.valid[slot, self.start : self.end].nonzero().squeeze(1) + self.start
        row = slice(slot, slot + 1)
        own = [
            (k[row].index_select(2, columns), v[row].index_select(2, columns))
            for k, v in zip(self.keys, self.values, strict=True)
        ]
        if self.prefix_kv is not None and bool(self.shared[slot]):
            own = [
                (torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2))
                for (pk, pv), (k, v) in zip(self.prefix_kv, own, strict=True)
            ]
        if self.dtype == self.kv_dtype:
            return own
        return [(k.to(self.kv_dtype), v.to(self.kv_dtype)) for k, v in own]

    def release(self, slots: Sequence[int]) -> None:
        """Free ``slots``; narrow the window to the columns the rows left still use."""
        if not slots:
            return
        index = torch.tensor(list(slots), device=self.valid.device)
        self.valid.index_fill_(0, index, False)
        self._free = sorted({*self._free, *slots})
        while self.used and self._free and self._free[-1] == self.used - 1:
            self._free.pop()  # free slots at the end leave the batch
            self.used -= 1
        self.start = self.end - self._live_width()

    def _live_width(self) -> int:
        """Columns from the leftmost one a live row uses to ``end``."""
        live = self.live()
        if not live:
            return 0
        rows = self.valid[: self.used, self.start : self.end]
        if len(live) != self.used:
            rows = rows.index_select(0, torch.tensor(live, device=rows.device))
        used = rows.any(0)
        if not bool(used.any()):
            return 0
        return self.width - int(used.int().argmax())

    def compact(self) -> list[int]:
        """Move the live rows into the first slots; the old slot of each new one.

        Inside the buffers, one row at a time in slot order: a row only moves
        down, into a slot that is free or whose row has already moved, so no
        row is overwritten before it is read. The slots past the live ones keep
        their (finite) old values until a row joins there.
        """
        live = self.live()
        width = self._live_width()
        begin = self.end - width
        for new, old in enumerate(live):
            if new == old:
                continue
            for buffer in (*self.keys, *self.values):
                buffer[new, :, begin : self.end] = buffer[old, :, begin : self.end]
            self.valid[new] = self.valid[old]
            self.shared[new] = self.shared[old]
        self.used, self._free = len(live), []
        self.start = begin
        self.moves += 1
        return live

    def _move_window(self, width: int) -> None:
        """Move the last ``width`` columns of every used slot to just after the left room.

        The window moves left by ``shift`` columns, in chunks of at most
        ``shift`` from the left, so a chunk's destination never overlaps a
        source still to be read. The columns right of the new end are written
        by the steps before any step reads them.
        """
        shift = self.end - width - self.left
        source = self.end - width
        for offset in range(0, width, shift):
            n = min(shift, width - offset)
            src = slice(source + offset, source + offset + n)
            dst = slice(self.left + offset, self.left + offset + n)
            for buffer in (*self.keys, *self.values):
                buffer[: self.used, :, dst] = buffer[: self.used, :, src]
            self.valid[: self.used, dst] = self.valid[: self.used, src]
        self.start, self.end = self.left, self.left + width
        self.valid[:, self.end :] = False
        self.moves += 1

    def _reallocate(self, slots: int, width: int, order: Sequence[int] | None = None) -> None:
        """New buffers: ``slots`` slots, a window of ``width`` columns, and spare room.

        The live rows are copied: to the same slots (``order`` None; the free
        ones stay free), or old slot ``order[i]`` to slot ``i`` (compaction).
        """
        live = self.live()
        if order is None:
            pairs, used, free = [(s, s) for s in live], self.used, list(self._free)
        else:
            pairs, used, free = [(s, i) for i, s in enumerate(order)], len(order), []
        old_keys, old_values, old_valid, old_shared = (
            self.keys,
            self.values,
            self.valid,
            self.shared,
        )
        old_end, kept = self.end, min(self._live_width(), width)
        like = [(k[:1], v[:1]) for k, v in zip(old_keys, old_values, strict=True)]
        self._allocate(like, max(slots, used), width)
        begin, end = old_end - kept, self.end
        runs = _pair_runs(pairs)
        for old, new in ((old_keys, self.keys), (old_values, self.values)):
            for src, dst in zip(old, new, strict=True):
                for first, stop, to in runs:
                    dst[to : to + stop - first, :, end - kept : end] = src[
                        first:stop, :, begin:old_end
                    ]
        for first, stop, to in runs:
            self.shared[to : to + stop - first] = old_shared[first:stop]
            self.valid[to : to + stop - first, end - kept : end] = old_valid[
                first:stop, begin:old_end
            ]
        self.start = end - kept
        self.used, self._free = used, free
        self.copies += 1


def _pair_runs(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(old, new)`` slot pairs as ``(start, stop, destination)`` runs of consecutive ones."""
    runs: list[tuple[int, int, int]] = []
    for old, new in pairs:
        if runs and runs[-1][1] == old and runs[-1][2] + old - runs[-1][0] == new:
            runs[-1] = (runs[-1][0], old + 1, runs[-1][2])
        else:
            runs.append((old, old + 1, new))
    return runs


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword ``model.forward`` takes its cache by: transformers 5 renamed
    ``past_key_values`` to ``cache``; accept both."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


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
