"""Micro-batch packing: exact against brute force, never worse than the reference's FFD."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retool.training.packing import (
    PackingLimits,
    first_fit_decreasing,
    pack_micro_batches,
    padded_area,
)


@dataclass(frozen=True)
class Item:
    id: int
    num_tokens: int


@dataclass(frozen=True)
class Named:
    name: str
    num_tokens: int


@dataclass(frozen=True)
class Bare:
    num_tokens: object


def items_of(lengths: Sequence[int]) -> list[Item]:
    return [Item(i, n) for i, n in enumerate(lengths)]


def lengths_of(batches: list[list[Item]]) -> list[list[int]]:
    return [[item.num_tokens for item in batch] for batch in batches]


def check_valid(items: list[Item], batches: list[list[Item]], max_items: int, cap: int) -> None:
    """Every item exactly once (by identity), every batch non-empty and within both limits."""
    seen = [id(item) for batch in batches for item in batch]
    assert sorted(seen) == sorted(id(item) for item in items)
    for batch in batches:
        assert 1 <= len(batch) <= max_items
        assert len(batch) * max(item.num_tokens for item in batch) <= cap


def check_order(items: list[Item], batches: list[list[Item]]) -> None:
    """Longest first inside and across batches; equal lengths keep the input order."""
    flat = [item for batch in batches for item in batch]
    position = {id(item): i for i, item in enumerate(items)}
    assert [id(x) for x in flat] == [
        id(x) for x in sorted(items, key=lambda x: (-x.num_tokens, position[id(x)]))
    ]


def set_partitions(n: int) -> Iterator[list[list[int]]]:
    """All partitions of range(n) (restricted growth strings): Bell(n) of them."""
    if n == 0:
        yield []
        return

    def grow(i: int, blocks: list[list[int]]) -> Iterator[list[list[int]]]:
        if i == n:
            yield [list(b) for b in blocks]
            return
        for block in blocks:
            block.append(i)
            yield from grow(i + 1, blocks)
            block.pop()
        blocks.append([i])
        yield from grow(i + 1, blocks)
        blocks.pop()

    yield from grow(0, [])


def cost(batches: int, area: int, overhead: int | None) -> tuple[int, int]:
    """The objective of pack_micro_batches, as a pair compared lexicographically."""
    return (batches, area) if overhead is None else (area + overhead * batches, batches)


def cost_of(packing: list[list[Item]], overhead: int | None) -> tuple[int, int]:
    return cost(len(packing), padded_area(packing), overhead)


def brute_force_optimum(
    lengths: Sequence[int], max_items: int, cap: int, overhead: int | None = None
) -> tuple[int, int]:
    """Minimal cost over every feasible set partition."""
    limits = PackingLimits(max_items, cap)
    best: tuple[int, int] | None = None
    for partition in set_partitions(len(lengths)):
        maxima = [max(lengths[i] for i in block) for block in partition]
        if all(limits.fits(len(b), m) for b, m in zip(partition, maxima, strict=True)):
            area = sum(len(b) * m for b, m in zip(partition, maxima, strict=True))
            candidate = cost(len(partition), area, overhead)
            best = candidate if best is None or candidate < best else best
    assert best is not None
    return best


def branch_and_bound_optimum(
    lengths: Sequence[int], max_items: int, cap: int, overhead: int | None = None
) -> tuple[int, int]:
    """Minimal cost by exhaustive search with pruning (for n up to ~12).

    Independent of the contiguity argument: every item, longest first, goes into
    every open batch or a new one. Items come longest first, so a batch's area
    grows by exactly its first item's length per added item; both the batch
    count and the area only grow along a branch, so a branch whose cost already
    reaches the best is cut.
    """
    a = sorted(lengths, reverse=True)
    best = [cost_of(first_fit_decreasing(items_of(a), max_items, cap), overhead)]
    heads: list[int] = []
    sizes: list[int] = []

    def search(i: int, area: int) -> None:
        if cost(len(heads), area, overhead) >= best[0]:
            return
        if i == len(a):
            best[0] = cost(len(heads), area, overhead)
            return
        for k in range(len(heads)):
            if sizes[k] + 1 <= max_items and (sizes[k] + 1) * heads[k] <= cap:
                sizes[k] += 1
                search(i + 1, area + heads[k])
                sizes[k] -= 1
        heads.append(a[i])
        sizes.append(1)
        search(i + 1, area + a[i])
        heads.pop()
        sizes.pop()

    search(0, 0)
    return best[0]


def test_chapter_example_reaches_the_optimum_ffd_misses() -> None:
    lengths = [8000, 7800] + [3000] * 10
    items = items_of(lengths)
    ffd = first_fit_decreasing(items, max_items=32, max_padded_tokens=64_000)
    assert lengths_of(ffd) == [[8000, 7800] + [3000] * 6, [3000] * 4]
    assert padded_area(ffd) == 76_000

    ours = pack_micro_batches(items, max_items=32, max_padded_tokens=64_000)
    assert lengths_of(ours) == [[8000, 7800], [3000] * 10]
    assert padded_area(ours) == 46_000
    assert branch_and_bound_optimum(lengths, 32, 64_000) == (2, 46_000)

    # Padded area alone: padding 7800 up to 8000 costs 200 more than its own batch.
    alone = pack_micro_batches(items, batch_overhead_tokens=0)
    assert lengths_of(alone) == [[8000], [7800], [3000] * 10]
    assert padded_area(alone) == 45_800
    assert branch_and_bound_optimum(lengths, 32, 64_000, 0) == (45_800, 3)
    # An extra call priced above those 200 tokens brings the two long ones back together.
    assert lengths_of(pack_micro_batches(items, batch_overhead_tokens=201)) == lengths_of(ours)


def test_defaults_are_the_references_limits() -> None:
    # 8 items of 8000 tokens: 8 * 8000 = 64,000 fits one batch, 9 do not.
    assert len(pack_micro_batches(items_of([8000] * 8))) == 1
    assert len(pack_micro_batches(items_of([8000] * 9))) == 2
    # 33 tiny items: the item limit of 32 binds.
    assert [len(b) for b in pack_micro_batches(items_of([10] * 33))] == [32, 1]


def random_overhead(rng: random.Random) -> int | None:
    return rng.choice([None, None, 0, rng.randint(1, 3000)])


@pytest.mark.parametrize("seed", range(400))
def test_exact_against_brute_force_over_all_set_partitions(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(0, 8)
    if rng.random() < 0.3:  # many ties
        lengths = [rng.choice([1, 2, 3, 5, 8]) * 100 for _ in range(n)]
    else:
        lengths = [rng.randint(0, 5000) for _ in range(n)]
    longest = max(lengths, default=1)
    max_items = rng.randint(1, n + 1)
    cap = rng.randint(max(longest, 1), max(longest, 1) * rng.randint(1, n + 1))
    overhead = random_overhead(rng)
    items = items_of(lengths)

    ours = pack_micro_batches(items, max_items, cap, batch_overhead_tokens=overhead)
    check_valid(items, ours, max_items, cap)
    check_order(items, ours)
    assert cost_of(ours, overhead) == brute_force_optimum(lengths, max_items, cap, overhead)
    ffd = first_fit_decreasing(items, max_items, cap)
    check_valid(items, ffd, max_items, cap)
    assert cost_of(ours, overhead) <= cost_of(ffd, overhead)


def trajectory_lengths(rng: random.Random, n: int) -> list[int]:
    """Rollout-like lengths: prompt 300-600 plus 1-4 turns of completion and observation."""
    lengths = []
    for _ in range(n):
        turns = rng.randint(1, 4)
        total = rng.randint(300, 600)
        total += sum(rng.randint(50, 1024) for _ in range(turns))
        total += sum(rng.randint(20, 512) for _ in range(turns - 1))
        lengths.append(total)
    return lengths


@pytest.mark.parametrize("seed", range(30))
def test_within_two_percent_of_optimum_on_random_mixes(seed: int) -> None:
    # Ours is exact, so the 2% bound holds with equality; the
    # optimum here comes from a search that does not rely on contiguity.
    rng = random.Random(1000 + seed)
    lengths = trajectory_lengths(rng, rng.randint(9, 11))
    max_items, cap = rng.choice([(4, 8000), (3, 6000), (32, 8000), (5, 12_000)])
    overhead = random_overhead(rng)
    ours = pack_micro_batches(items_of(lengths), max_items, cap, batch_overhead_tokens=overhead)
    optimum = branch_and_bound_optimum(lengths, max_items, cap, overhead)
    assert cost_of(ours, overhead) == optimum
    optimal_area = optimum[1] if overhead is None else optimum[0] - overhead * optimum[1]
    assert padded_area(ours) <= 1.02 * optimal_area


@pytest.mark.parametrize("seed", range(20))
def test_never_worse_than_ffd_on_rollout_sized_batches(seed: int) -> None:
    rng = random.Random(seed)
    items = items_of(trajectory_lengths(rng, 64))
    ours = pack_micro_batches(items)
    ffd = first_fit_decreasing(items)
    check_valid(items, ours, 32, 64_000)
    check_valid(items, ffd, 32, 64_000)
    # No more calls than FFD (not one per trajectory), and no more padding.
    assert len(ours) <= len(ffd) <= 4
    assert padded_area(ours) <= padded_area(ffd)
    assert padded_area(ours) >= sum(item.num_tokens for item in items)
    alone = pack_micro_batches(items, batch_overhead_tokens=0)
    assert padded_area(alone) == sum(item.num_tokens for item in items)  # zero padding
    assert len(alone) > len(ours)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    max_items=st.integers(1, 40),
    cap=st.integers(1, 100_000),
    overhead=st.none() | st.integers(0, 100_000),
)
def test_property_partition_and_limits(
    data: st.DataObject, max_items: int, cap: int, overhead: int | None
) -> None:
    lengths = data.draw(st.lists(st.integers(0, cap), max_size=80))
    items = items_of(lengths)
    ours = pack_micro_batches(
        iter(items), max_items=max_items, max_padded_tokens=cap, batch_overhead_tokens=overhead
    )
    check_valid(items, ours, max_items, cap)
    check_order(items, ours)
    again = pack_micro_batches(items, max_items, cap, batch_overhead_tokens=overhead)
    assert [[id(x) for x in b] for b in again] == [[id(x) for x in b] for b in ours]
    ffd = first_fit_decreasing(items, max_items=max_items, max_padded_tokens=cap)
    check_valid(items, ffd, max_items, cap)
    assert cost_of(ours, overhead) <= cost_of(ffd, overhead)
    if overhead is None:
        assert len(ours) <= len(ffd)


def test_empty_input() -> None:
    assert pack_micro_batches([]) == []
    assert first_fit_decreasing([]) == []
    assert padded_area([]) == 0


def test_returns_the_same_objects_and_fewest_batches_among_equal_areas() -> None:
    items = items_of([1] * 100)
    batches = pack_micro_batches(items, max_items=32, max_padded_tokens=1000)
    assert [len(b) for b in batches] == [32, 32, 32, 4]
    assert all(x is y for x, y in zip((x for b in batches for x in b), items, strict=True))


def test_padded_area() -> None:
    assert padded_area([items_of([5, 3]), items_of([2])]) == 12


def test_item_too_long_is_named() -> None:
    with pytest.raises(ValueError, match=r"item 1 \(num_tokens=9000, id=1\)") as info:
        pack_micro_batches(items_of([100, 9000]), max_padded_tokens=8192)
    assert "max_padded_tokens=8192" in str(info.value)
    with pytest.raises(ValueError, match=r"item 0 \(num_tokens=70000, name='traj-7'\)"):
        pack_micro_batches([Named("traj-7", 70_000)])
    with pytest.raises(ValueError, match=r"item 0 \(num_tokens=65000\)"):
        first_fit_decreasing([Bare(65_000)])


@pytest.mark.parametrize("bad", [-1, 1.5, "10", None, True])
def test_bad_num_tokens(bad: object) -> None:
    with pytest.raises(ValueError, match=r"item 0 .*non-negative integer"):
        pack_micro_batches([Bare(bad)])


@pytest.mark.parametrize("pack", [pack_micro_batches, first_fit_decreasing])
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_items": 0}, "max_items"),
        ({"max_items": True}, "max_items"),
        ({"max_padded_tokens": 0}, "max_padded_tokens"),
        ({"max_padded_tokens": -5}, "max_padded_tokens"),
    ],
)
def test_bad_limits(pack, kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        pack(items_of([1]), **kwargs)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_overhead(bad: object) -> None:
    with pytest.raises(ValueError, match="batch_overhead_tokens"):
        pack_micro_batches(items_of([1]), batch_overhead_tokens=bad)  # type: ignore[arg-type]
