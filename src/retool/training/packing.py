"""Micro-batch packing by padded area: an exact dynamic program, not first-fit.

A training request pads every sequence of a micro-batch to the longest one, so
the cost proxy of a micro-batch ``B`` is its padded area
``len(B) * max(num_tokens of B)``. A micro-batch is feasible when
``len(B) <= max_items`` and its padded area is ``<= max_padded_tokens``.

The objective
-------------
Padded area alone is the wrong target: it is minimised by giving every item of
distinct length a micro-batch of its own (zero padding, 64 ``forward_backward``
calls for 64 trajectories instead of 3), which trades a little padding for many
round trips and small, inefficient batches. :func:`pack_micro_batches`
therefore minimises, exactly, the pair (number of micro-batches, padded area) in
that order: as few calls as the limits allow (never more than first-fit needs),
and the least padding among those. ``batch_overhead_tokens=c`` instead
minimises ``padded area + c * micro-batches`` (ties: fewer micro-batches), for a
caller who can price one extra call in padded tokens; ``c=0`` is pure padded
area.

Why not first-fit decreasing
----------------------------
The reference packs with first-fit decreasing (:func:`first_fit_decreasing`,
kept here for the benchmark and the tests): sort longest first, put each item
into the first batch that still fits. That fills batches quickly but pads short
items up to long ones: ``[8000, 7800, 3000 x 10]`` with the limits 32 / 64,000
becomes ``[8000, 7800, 3000 x 6]`` (64,000) + ``[3000 x 4]`` (12,000) = 76,000
padded tokens; ours gives ``[8000, 7800]`` + ``[3000 x 10]`` = 46,000, the same
two micro-batches. (With ``batch_overhead_tokens=0`` it gives ``[8000]`` +
``[7800]`` + ``[3000 x 10]`` = 45,800 in three.)

Contiguity (the exchange argument)
----------------------------------
Sort the lengths in descending order, ``a_1 >= a_2 >= ... >= a_n``. Some
optimal partition consists of *contiguous* runs of this order. Take any feasible
partition ``B_1, ..., B_m`` with maxima ``M_1 >= ... >= M_m`` and sizes
``s_1, ..., s_m``, and build the contiguous partition with the same sizes in
the same order: ``C_j`` holds positions ``p_j + 1 .. p_j + s_j`` where
``p_j = s_1 + ... + s_(j-1)``. Every item of ``B_j, ..., B_m`` is at most
``M_j``, and those are ``n - p_j`` items, so at most ``p_j`` items exceed
``M_j``; hence ``max(C_j) = a_(p_j + 1) <= M_j``. Each ``C_j`` has the size of
``B_j`` and a maximum no larger, so it is feasible (same count, area no larger);
the contiguous partition has the same number of batches and no more area. Any
objective that does not increase when the area decreases at a fixed number of
batches (both above) therefore has a contiguous optimum. The tests check this
against brute force over all set partitions of small inputs. (With arbitrary
item sizes, bin packing with a cardinality limit is NP-hard; what makes it easy
here is that a batch's load is its size times its maximum.)

The dynamic program
-------------------
Over the sorted lengths, ``best[i]`` is the smallest cost of packing the first
``i`` items; the last batch of such a packing is a run ``j+1 .. i`` of size
``i - j <= max_items`` whose maximum is ``a_(j+1)``, so
``best[i] = min over j of best[j] + cost(batch j+1 .. i)`` over the feasible
``j`` (the costs are pairs compared lexicographically and added per component,
so optimal substructure holds). Scanning ``j`` downwards from ``i - 1``, both
the size and the maximum grow, so the scan stops at the first run over
``max_padded_tokens``. Time is ``O(n log n + n * max_items)``, memory ``O(n)``:
well under a millisecond for a rollout of 64 trajectories, negligible next to
one ``forward_backward``.

Output order is deterministic: ties in length keep the input order, each batch
lists its items longest first, and batches come in descending order of their
longest item (ties among equal optima are broken by a fixed rule: the shortest
last batch wins).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = [
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_PADDED_TOKENS",
    "HasNumTokens",
    "PackingLimits",
    "first_fit_decreasing",
    "pack_micro_batches",
    "padded_area",
]

DEFAULT_MAX_ITEMS = 32
DEFAULT_MAX_PADDED_TOKENS = 64_000


class HasNumTokens(Protocol):
    """Anything with an integer ``num_tokens`` (a training datum, a test stub)."""

    @property
    def num_tokens(self) -> int: ...


T = TypeVar("T", bound=HasNumTokens)


@dataclass(frozen=True)
class PackingLimits:
    """The two capacity limits of one micro-batch, validated on construction."""

    max_items: int = DEFAULT_MAX_ITEMS
    max_padded_tokens: int = DEFAULT_MAX_PADDED_TOKENS

    def __post_init__(self) -> None:
        for name in ("max_items", "max_padded_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    def fits(self, size: int, longest: int) -> bool:
        """Whether ``size`` items padded to ``longest`` tokens fit one micro-batch."""
        return size <= self.max_items and size * longest <= self.max_padded_tokens


def padded_area(batches: Iterable[Sequence[HasNumTokens]]) -> int:
    """Total padded area: the sum over batches of ``len(batch) * longest item``."""
    return sum(len(b) * max(item.num_tokens for item in b) for b in batches if len(b) > 0)


def _describe(index: int, item: object, num_tokens: object) -> str:
    label = f"item {index} (num_tokens={num_tokens!r}"
    for attr in ("id", "name"):
        if hasattr(item, attr):
            label += f", {attr}={getattr(item, attr)!r}"
    return label + ")"


def _lengths(items: Sequence[HasNumTokens], limits: PackingLimits) -> list[int]:
    """The validated ``num_tokens`` of every item, in input order."""
    lengths = []
    for index, item in enumerate(items):
        n = getattr(item, "num_tokens", None)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(
                f"{_describe(index, item, n)}: num_tokens must be a non-negative integer"
            )
        if n > limits.max_padded_tokens:
            raise ValueError(
                f"{_describe(index, item, n)} does not fit one micro-batch on its own: "
                f"{n} tokens > max_padded_tokens={limits.max_padded_tokens}; "
                "raise max_padded_tokens or lower the context limit"
            )
        lengths.append(n)
    return lengths


def _descending_order(lengths: Sequence[int]) -> list[int]:
    """Indices by descending length; equal lengths keep their input order."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def pack_micro_batches(
    items: Iterable[T],
    max_items: int = DEFAULT_MAX_ITEMS,
    max_padded_tokens: int = DEFAULT_MAX_PADDED_TOKENS,
    *,
    batch_overhead_tokens: int | None = None,
) -> list[list[T]]:
    """Split ``items`` into micro-batches with the least padding, exactly.

    Every item appears in exactly one micro-batch; each micro-batch holds at
    most ``max_items`` items and ``len(batch) * longest <= max_padded_tokens``.
    By default the result has the fewest micro-batches the limits allow and,
    among those, the least total padded area. With ``batch_overhead_tokens=c``
    it minimises ``padded area + c * micro-batches`` instead (ties: fewer
    micro-batches); ``c=0`` minimises the padded area alone. See the module
    docstring for why the dynamic program is exact.

    Raises :class:`ValueError` for a limit below 1, a negative overhead, or
    naming the item (index, ``num_tokens``, and its ``id``/``name`` when it has
    one) whose length is not a non-negative integer or alone exceeds
    ``max_padded_tokens``.
    """
    limits = PackingLimits(max_items, max_padded_tokens)
    overhead = batch_overhead_tokens
    if overhead is not None and (
        isinstance(overhead, bool) or not isinstance(overhead, int) or overhead < 0
    ):
        raise ValueError(f"batch_overhead_tokens must be None or an integer >= 0, got {overhead!r}")
    items = list(items)
    lengths = _lengths(items, limits)
    order = _descending_order(lengths)
    a = [lengths[i] for i in order]
    n = len(a)

    # best[i] = (primary, secondary) cost of the first i sorted items: (batches,
    # area) by default, (area + overhead * batches, batches) with an overhead.
    # cut[i] = start of the last batch. A single item always fits, so every
    # best[i] is reachable.
    best: list[tuple[int, int]] = [(0, 0)] * (n + 1)
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        chosen: tuple[int, int] | None = None
        chosen_j = i - 1
        for j in range(i - 1, max(i - limits.max_items, 0) - 1, -1):
            area = (i - j) * a[j]
            if area > limits.max_padded_tokens:
                break  # size and longest only grow as j decreases
            first, second = best[j]
            if overhead is None:
                candidate = (first + 1, second + area)
            else:
                candidate = (first + area + overhead, second + 1)
            if chosen is None or candidate < chosen:
                chosen, chosen_j = candidate, j
        assert chosen is not None  # a single item always fits
        best[i], cut[i] = chosen, chosen_j

    batches: list[list[T]] = []
    i = n
    while i > 0:
        j = cut[i]
        batches.append([items[order[k]] for k in range(j, i)])
        i = j
    batches.reverse()
    return batches


def first_fit_decreasing(
    items: Iterable[T],
    max_items: int = DEFAULT_MAX_ITEMS,
    max_padded_tokens: int = DEFAULT_MAX_PADDED_TOKENS,
) -> list[list[T]]:
    """The reference's packing: longest first, each into the first batch that fits.

    Kept as the baseline of the benchmark and the tests; same validation and
    same errors as :func:`pack_micro_batches`.
    """
    limits = PackingLimits(max_items, max_padded_tokens)
    items = list(items)
    lengths = _lengths(items, limits)
    batches: list[list[int]] = []  # indices; the first of each batch is its longest
    for index in _descending_order(lengths):
        for batch in batches:
            if limits.fits(len(batch) + 1, max(lengths[batch[0]], lengths[index])):
                batch.append(index)
                break
        else:
            batches.append([index])
    return [[items[i] for i in batch] for batch in batches]
