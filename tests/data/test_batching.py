from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retool.data.batching import batch_indices, epoch_order, reserve_indices
from retool.errors import ConfigError


def test_deterministic_given_seed():
    assert batch_indices(50, 8, 3, seed=1) == batch_indices(50, 8, 3, seed=1)
    assert batch_indices(50, 8, 3, seed=1) != batch_indices(50, 8, 3, seed=2)


def test_each_epoch_covers_everything_once_and_is_reshuffled():
    n, b = 20, 5  # epochs align with batches
    stream = [i for step in range(8) for i in batch_indices(n, b, step, seed=0)]
    first, second = stream[:20], stream[20:40]
    assert sorted(first) == list(range(n)) and sorted(second) == list(range(n))
    assert first != second


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), b=st.integers(1, 12), steps=st.integers(1, 15), seed=st.integers(0, 5))
def test_no_repeat_within_a_batch_while_unseen_remain(n, b, steps, seed):
    seen_per_epoch = Counter()
    for step in range(steps):
        batch = batch_indices(n, b, step, seed)
        assert len(batch) == b
        if b <= n:
            assert len(set(batch)) == b, (n, b, step, batch)
        seen_per_epoch.update(batch)
    # Over whole epochs every item appears equally often.
    total = steps * b
    full_epochs = total // n
    assert all(count >= full_epochs for count in (seen_per_epoch[i] for i in range(n)))


def test_epoch_order_is_a_permutation():
    assert sorted(epoch_order(13, 5, 0, 7)) == list(range(13))


def test_validation():
    with pytest.raises(ConfigError):
        batch_indices(0, 4, 0, 0)
    with pytest.raises(ConfigError):
        batch_indices(4, 0, 0, 0)


def test_a_steps_reserve_is_a_pure_function_outside_its_batch():
    for step in range(5):
        reserve = reserve_indices(20, 4, 6, step, seed=3)
        assert reserve == reserve_indices(20, 4, 6, step, seed=3)
        assert len(set(reserve)) == 6  # no repeat while others remain
        assert not set(reserve) & set(batch_indices(20, 4, step, seed=3))
    assert reserve_indices(20, 4, 6, 0, seed=3) != reserve_indices(20, 4, 6, 1, seed=3)
    # Fewer other questions than asked for: they come round again, in the same order.
    small = reserve_indices(5, 3, 5, 0, seed=1)
    assert len(set(small)) == 2 and small == small[:2] * 2 + small[:1]
    assert reserve_indices(4, 3, 0, 0, seed=1) == []
