"""Deterministic, epoch-reshuffled batches of examples.

The reference shuffled the dataset once and wrapped around with a modulo, so
every epoch saw the same order. Here the examples form one stream of epochs,
each a fresh permutation, and batch ``s`` is the ``s``-th chunk of that stream:
a pure function of ``(seed, s)``, so a resumed run sees exactly the batches it
would have seen. Every example is used once per epoch. Where a batch straddles
two epochs, the new epoch's permutation puts the questions the batch already
holds after the others, so a batch repeats a question only when the dataset is
smaller than the batch.

Dynamic sampling (``rollout.dynamic_sampling``) draws extra questions for a
step from :func:`reserve_indices`: a permutation of the questions not in the
step's batch, drawn afresh for every step from ``(seed, step)`` alone. The
reserve never takes from the batch stream, so every step's batch is the same
whether dynamic sampling is on or off and however many extras earlier steps
used, and a resumed run needs nothing recorded to find its questions again.
The price: an extra question may come round again as a batch question (or as
another step's extra) within the same epoch.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import TypeVar

from retool.checks import check_number
from retool.errors import ConfigError

T = TypeVar("T")


def _shuffled(num_items: int, seed: int, epoch: int) -> list[int]:
    order = list(range(num_items))
    random.Random(f"retool-batches:{seed}:{epoch}").shuffle(order)
    return order


@functools.lru_cache(maxsize=8)
def epoch_order(num_items: int, batch_size: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The order in which ``epoch`` visits ``range(num_items)``.

    An epoch's order depends on the previous one only where a batch straddles
    them; epochs that start on a batch boundary are independent, and one of
    those lies at most ``batch_size`` epochs back, which bounds the work.
    """
    first = epoch
    while first > 0 and (first * num_items) % batch_size:
        first -= 1
    order = _shuffled(num_items, seed, first)
    for current in range(first + 1, epoch + 1):
        spill = (current * num_items) % batch_size  # straddling batch's items from the last epoch
        held = set(order[num_items - min(spill, num_items) :])
        fresh = _shuffled(num_items, seed, current)
        head = [i for i in fresh if i not in held][: batch_size - spill]
        taken = set(head)
        order = head + [i for i in fresh if i not in taken]
    return tuple(order)


def batch_indices(num_items: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Indices of the examples in batch ``step`` (0-based)."""
    check_number("num_items", num_items, integer=True)
    if num_items <= 0:
        raise ConfigError("cannot draw batches from an empty dataset")
    check_number("batch_size", batch_size, 1, integer=True)
    check_number("step", step, 0, integer=True)
    check_number("seed", seed, integer=True)
    chosen: list[int] = []
    position = step * batch_size
    while len(chosen) < batch_size:
        epoch, offset = divmod(position, num_items)
        order = epoch_order(num_items, batch_size, seed, epoch)
        take = order[offset : offset + batch_size - len(chosen)]
        chosen.extend(take)
        position += len(take)
    return chosen


def take_batch(items: Sequence[T], batch_size: int, step: int, seed: int) -> list[T]:
    """The examples of batch ``step``; see :func:`batch_indices`."""
    return [items[i] for i in batch_indices(len(items), batch_size, step, seed)]


def reserve_indices(num_items: int, batch_size: int, count: int, step: int, seed: int) -> list[int]:
    """Indices of ``count`` extra questions for batch ``step`` (0-based); see the docstring.

    They exclude the batch's own questions and repeat one only when fewer than
    ``count`` others exist (the order then starts over).
    """
    check_number("count", count, 0, integer=True)
    base = set(batch_indices(num_items, batch_size, step, seed))
    others = [i for i in range(num_items) if i not in base] or list(range(num_items))
    random.Random(f"retool-reserve:{seed}:{step}").shuffle(others)
    chosen: list[int] = []
    while len(chosen) < count:
        chosen.extend(others[: count - len(chosen)])
    return chosen


def take_reserve(items: Sequence[T], batch_size: int, count: int, step: int, seed: int) -> list[T]:
    """The extra questions of batch ``step``; see :func:`reserve_indices`."""
    return [items[i] for i in reserve_indices(len(items), batch_size, count, step, seed)]
