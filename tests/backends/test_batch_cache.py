"""The sampling engine's slot batch cache (kv.py) against a plain per-row reference.

Random joins, decode steps, releases and compactions; after every operation
each live slot's real columns, read through the same window a decode step
reads, must be exactly that row's keys/values in order, and every column of
the window must be finite (a NaN under a zero attention weight would survive).
"""

from __future__ import annotations

import random

import pytest
import torch

from retool.backends.local.kv import BatchCache

LAYERS, HEADS, DIM = 2, 2, 3


def _kv(length: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (
            torch.randn(1, HEADS, length, DIM, generator=generator),
            torch.randn(1, HEADS, length, DIM, generator=generator),
        )
        for _ in range(LAYERS)
    ]


def _tokens(kv, start: int = 1000) -> list[int]:
    return list(range(start, start + kv[0][0].shape[2]))


def _check(batch: BatchCache, rows: dict[int, list[list[tuple[torch.Tensor, torch.Tensor]]]]):
    """Every live slot holds exactly its reference row, seen through the step's window
    (after the shared prefix, for a row that shares it)."""
    assert sorted(rows) == batch.live()
    window = batch.valid[: batch.used, batch.start : batch.end]
    skip = len(batch.prefix_tokens)
    for layer in range(LAYERS):
        keys = batch.layers[layer].keys
        values = batch.layers[layer].values
        assert keys.shape[:3] == (batch.used, HEADS, batch.width)
        assert torch.isfinite(keys).all() and torch.isfinite(values).all()
        for slot, columns in rows.items():
            real = window[slot].nonzero().squeeze(1)
            want_k = torch.cat([c[layer][0] for c in columns], dim=2)[0]
            want_v = torch.cat([c[layer][1] for c in columns], dim=2)[0]
            first = skip if bool(batch.shared[slot]) else 0
            assert torch.equal(keys[slot][:, real], want_k[:, first:])
            assert torch.equal(values[slot][:, real], want_v[:, first:])
            # right-aligned: a row's real columns end at the window's end
            assert int(real[-1]) == batch.width - 1
            assert len(real) == want_k.shape[1] - first
            row_kv = batch.row_kv(slot)
            assert torch.equal(row_kv[layer][0][0], want_k)
            assert torch.equal(row_kv[layer][1][0], want_v)


def _step(batch: BatchCache, rows, generator: torch.Generator) -> None:
    mask = batch.step_mask()
    assert mask.shape == (batch.used, batch.width + 1)
    assert mask[:, -1].all()  # the step's own column is real for every slot
    new = [
        (
            torch.randn(batch.used, HEADS, 1, DIM, generator=generator),
            torch.randn(batch.used, HEADS, 1, DIM, generator=generator),
        )
        for _ in range(LAYERS)
    ]
    for layer, (k, v) in enumerate(new):
        keys, values = batch.layers[layer].update(k, v)
        assert keys.shape[2] == values.shape[2] == mask.shape[1]
    batch.advance()
    for slot, columns in rows.items():
        columns.append([(k[slot : slot + 1], v[slot : slot + 1]) for k, v in new])


def _churn(
    batch: BatchCache, rng: random.Random, generator, make_groups, on_add=None, rows=None
) -> None:
    """Random joins, steps, releases and compactions, each checked against the reference;
    ``rows``: the reference of the rows already in the batch."""
    rows = {} if rows is None else rows
    for _ in range(60):
        action = rng.random()
        if action < 0.25 or not rows:
            groups = make_groups()
            for (kv, _, tokens), taken in zip(groups, batch.add(groups), strict=True):
                for slot in taken:
                    assert slot not in rows
                    if on_add is not None:
                        on_add(slot, tokens)
                    rows[slot] = [kv]
        elif action < 0.45:
            gone = rng.sample(sorted(rows), rng.randint(1, len(rows)))
            batch.release(gone)
            for slot in gone:
                del rows[slot]
        elif action < 0.5:
            order = batch.compact()
            rows = {new: rows[old] for new, old in enumerate(order)}
        else:
            _step(batch, rows, generator)
        if rows:
            _check(batch, rows)


@pytest.mark.parametrize("seed", range(12))
def test_random_joins_steps_and_releases_match_the_reference(seed):
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    first = _kv(rng.randint(1, 20), generator)
    batch = BatchCache(first, slots=2, width=first[0][0].shape[2], left=4, spare=6)

    def groups():
        out = []
        for _ in range(2):
            kv = _kv(rng.randint(1, 40), generator)
            out.append((kv, rng.randint(1, 3), _tokens(kv)))
        return out

    _churn(batch, rng, generator, groups)


def test_a_row_joins_a_free_slot_without_a_copy():
    generator = torch.Generator().manual_seed(0)
    kv = _kv(10, generator)
    batch = BatchCache(kv, slots=4, width=10, left=8, spare=16)
    (slots,) = batch.add([(kv, 4, _tokens(kv))])
    rows = {s: [kv] for s in slots}
    for _ in range(3):
        _step(batch, rows, generator)
    batch.release([1])
    del rows[1]
    copies = batch.copies
    longer = _kv(batch.width + 5, generator)  # longer than every row: the window widens left
    (taken,) = batch.add([(longer, 1, _tokens(longer))])
    assert taken == [1] and batch.copies == copies
    rows[1] = [longer]
    _check(batch, rows)
    # the rows that reached furthest left are gone: the window narrows (no copy)
    batch.release([1])
    del rows[1]
    assert batch.width == 13 and batch.copies == copies
    _check(batch, rows)


def test_the_buffers_grow_when_slots_or_columns_run_out():
    generator = torch.Generator().manual_seed(1)
    kv = _kv(5, generator)
    batch = BatchCache(kv, slots=1, width=5, left=0, spare=2)
    (slots,) = batch.add([(kv, 1, _tokens(kv))])
    rows = {slots[0]: [kv]}
    for _ in range(5):  # past the spare columns: one copy every 2 steps at most
        _step(batch, rows, generator)
    assert batch.copies >= 1
    _check(batch, rows)
    more = _kv(30, generator)  # more slots and a longer row than the left room allows
    (taken,) = batch.add([(more, 3, _tokens(more))])
    for slot in taken:
        rows[slot] = [more]
    assert batch.slots >= 4
    _check(batch, rows)


def test_rows_sharing_the_prefix_hold_only_what_follows_it():
    """A batch with a shared prefix: rows whose tokens start with it store the rest; a
    row that does not (or is no longer than it) stores all of its tokens; ``row_kv``
    gives back every row's whole KV, and the step reports which slots share it."""
    generator = torch.Generator().manual_seed(2)
    prefix = _kv(6, generator)
    prefix_tokens = list(range(500, 506))

    def with_prefix(extra: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        tail = _kv(extra, generator)
        return [
            (torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2))
            for (pk, pv), (k, v) in zip(prefix, tail, strict=True)
        ]

    rng = random.Random(2)
    batch = BatchCache(prefix, slots=2, width=4, left=3, spare=5, prefix=(prefix_tokens, prefix))

    def groups():
        out = []
        for kind in range(3):
            if kind == 0:
                kv = with_prefix(rng.randint(1, 12))
                tokens = prefix_tokens + list(range(kv[0][0].shape[2] - 6))
            elif kind == 1:  # another first token
                kv = _kv(rng.randint(1, 18), generator)
                tokens = [9, *range(kv[0][0].shape[2] - 1)]
            else:  # exactly the prefix: nothing would follow it, so it is not shared
                kv, tokens = with_prefix(0), list(prefix_tokens)
            out.append((kv, rng.randint(1, 2), tokens))
        return out

    def joined(slot, tokens):
        assert bool(batch.shared[slot]) == (len(tokens) > 6 and tokens[0] == 500)
        step_prefix = batch.step_prefix()
        assert step_prefix is not None and step_prefix[1].shape == (batch.used,)

    _churn(batch, rng, generator, groups, joined)


def test_compaction_and_a_full_window_stay_inside_the_buffers():
    """Compacting moves the live rows down in the same buffers, and a window that reaches
    the right end moves back left when that frees enough columns: no new buffers."""
    generator = torch.Generator().manual_seed(3)
    batch = BatchCache(_kv(4, generator), slots=8, width=12, left=4, spare=6)
    rows = {}
    for length in (12, 3, 7, 5, 9, 2):
        kv = _kv(length, generator)
        ((slot,),) = batch.add([(kv, 1, _tokens(kv))])
        rows[slot] = [kv]
    _check(batch, rows)
    buffers = batch.keys[0].data_ptr()
    batch.release([0, 2, 3])  # the longest row goes: the window narrows
    for slot in (0, 2, 3):
        del rows[slot]
    order = batch.compact()
    assert order == [1, 4, 5] and batch.used == 3
    rows = {new: rows[old] for new, old in enumerate(order)}
    _check(batch, rows)
    for _ in range(7):  # past the right end; the live rows are short, so room on the left
        _step(batch, rows, generator)
        _check(batch, rows)
    assert (batch.copies, batch.moves) == (0, 2)
    assert batch.keys[0].data_ptr() == buffers
    # a window as wide as the buffers allow leaves no room to move: new buffers
    for _ in range(batch.capacity):
        _step(batch, rows, generator)
    assert batch.copies >= 1
    _check(batch, rows)


def test_a_prefix_set_after_the_batch_began_is_shared_by_the_rows_that_join_later():
    """A batch created from one prompt has no shared prefix; once one is set, rows already
    in it keep all their columns, and rows joining with a prompt that starts with it
    store only what follows it; every row reads back whole."""
    generator = torch.Generator().manual_seed(5)
    prefix = _kv(6, generator)
    prefix_tokens = list(range(500, 506))

    def with_prefix(extra: int):
        tail = _kv(extra, generator)
        return [
            (torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2))
            for (pk, pv), (k, v) in zip(prefix, tail, strict=True)
        ]

    first = with_prefix(5)
    first_tokens = prefix_tokens + list(range(5))
    batch = BatchCache(first, slots=2, width=11, left=3, spare=4)
    assert batch.step_prefix() is None
    (slots,) = batch.add([(first, 2, first_tokens)])
    rows = {s: [first] for s in slots}
    _step(batch, rows, generator)
    batch.set_prefix(prefix_tokens, first)
    assert batch.step_prefix() is not None
    assert not bool(batch.shared[: batch.used].any())  # the rows already in keep their columns
    _check(batch, rows)
    with pytest.raises(ValueError, match="already has a shared prefix"):
        batch.set_prefix(prefix_tokens, first)
    rng = random.Random(5)

    def groups():
        kv = with_prefix(rng.randint(1, 10))
        other = _kv(rng.randint(1, 14), generator)
        return [
            (kv, rng.randint(1, 2), prefix_tokens + list(range(kv[0][0].shape[2] - 6))),
            (other, 1, [9, *range(other[0][0].shape[2] - 1)]),
            (with_prefix(0), 1, list(prefix_tokens)),  # exactly the prefix: not shared
        ]

    def joined(slot, tokens):
        assert bool(batch.shared[slot]) == (tokens[0] == 500 and len(tokens) > 6)

    _churn(batch, rng, generator, groups, joined, rows)
