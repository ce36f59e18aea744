"""The parts of the process group that need no group: torchrun's environment, the
split of a call's datums across ranks, and the merge of their metrics."""

from __future__ import annotations

import pytest

from retool.backends.local.distributed import merge_metrics, split_by_tokens, world
from retool.errors import ConfigError


def test_without_torchrun_one_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    me = world()
    assert (me.rank, me.size, me.distributed, me.driver) == (0, 1, False, True)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not world().distributed


@pytest.mark.parametrize(
    "env", [{"WORLD_SIZE": "two"}, {"WORLD_SIZE": "2", "RANK": "2"}, {"WORLD_SIZE": "0"}]
)
def test_a_broken_torchrun_environment_is_one_error(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError):
        world()


def test_split_balances_tokens_keeps_order_and_loses_nothing():
    lengths = [30, 5, 5, 5, 5, 5, 5, 20]
    parts = split_by_tokens(lengths, 2)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(p == sorted(p) for p in parts)
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= 5
    assert split_by_tokens(lengths, 2) == parts  # every rank computes the same split
    assert split_by_tokens([7], 3) == [[0], [], []]  # fewer datums than ranks


def test_metrics_merge_as_one_process_computes_them():
    parts = [
        {"loss:sum": 2.0, "loss_tokens": 3.0, "clip_fraction": 1 / 3, "ratio_max": 0.9},
        {"loss:sum": -1.0, "loss_tokens": 1.0, "clip_fraction": 1.0, "ratio_max": 0.7},
        {"loss:sum": 0.0, "loss_tokens": 0.0, "clip_fraction": 0.0, "ratio_max": 1.0},
    ]
    merged = merge_metrics(parts)
    assert merged["loss:sum"] == 1.0 and merged["loss_tokens"] == 4.0
    assert merged["clip_fraction"] == pytest.approx(2 / 4)  # by tokens, not by rank
    # A rank without loss tokens reports the neutral 1.0: not a maximum of the others'.
    assert merged["ratio_max"] == 0.9
    assert merge_metrics([{"loss_tokens": 0.0, "approx_kl": 0.0}] * 2)["approx_kl"] == 0.0
