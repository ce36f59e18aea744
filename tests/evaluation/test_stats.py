"""The estimators against brute force, and the seeded resampling."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from retool.evaluation.stats import (
    bootstrap_ci,
    clustered_paired_bootstrap_ci,
    k_values,
    paired_bootstrap_ci,
    pass_at_k,
    sign_flip_p_value,
)


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of the n samples that contain a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 12])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 500) overflows a float; the product form does not.
    value = pass_at_k(1000, 3, 500)
    exact = 1 - math.comb(997, 500) / math.comb(1000, 500)
    assert value == pytest.approx(exact, rel=1e-9)
    assert pass_at_k(1000, 0, 1) == 0.0 and pass_at_k(1000, 1000, 7) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(2) == [1, 2]
    assert k_values(8) == [1, 2, 4, 8]
    assert k_values(12) == [1, 2, 4, 8, 12]


def test_bootstrap_ci_contains_the_mean_and_is_seeded():
    rng = random.Random(1)
    values = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(30)]
    mean = sum(values) / len(values)
    low, high = bootstrap_ci(values)
    assert low <= mean <= high and low < high
    assert bootstrap_ci(values) == (low, high)  # deterministic
    assert bootstrap_ci(values, seed=7) != (low, high)  # the seed is used
    # Roughly the normal interval: mean +- 1.96 * sd / sqrt(m).
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    half = 1.96 * sd / len(values) ** 0.5
    assert high - low == pytest.approx(2 * half, rel=0.25)
    assert bootstrap_ci([]) == (0.0, 0.0)
    assert bootstrap_ci([0.5]) == (0.5, 0.5)


def test_bootstrap_ci_at_the_boundary_is_the_exact_interval():
    """0 of 40 problems is not proof of a zero rate: the interval is Clopper-Pearson's."""
    low, high = bootstrap_ci([0.0] * 40)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 40))  # 8.8%
    assert 0.08 < high < 0.095
    low, high = bootstrap_ci([1.0] * 10)
    assert high == 1.0 and low == pytest.approx(0.025**0.1)  # 69%
    # One problem off the boundary: the bootstrap again, its interval no longer degenerate.
    low, high = bootstrap_ci([0.0] * 39 + [0.25])
    assert low == 0.0 and 0.0 < high < 0.1
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        bootstrap_ci([0.5, 2.0])


def _brute_sign_flip(d: list[float]) -> float:
    observed = abs(sum(d))
    hits = 0
    for signs in itertools.product([1, -1], repeat=len(d)):
        hits += abs(sum(s * x for s, x in zip(signs, d, strict=True))) >= observed - 1e-9
    return hits / 2 ** len(d)


def test_sign_flip_exact_matches_enumeration():
    rng = random.Random(3)
    for _ in range(5):
        d = [rng.choice([-0.5, -0.25, 0.0, 0.25, 0.5, 1.0]) for _ in range(9)]
        p, method = sign_flip_p_value(d)
        assert method == "exact"
        assert p == pytest.approx(_brute_sign_flip(d), abs=1e-12)


def test_sign_flip_extremes():
    p, method = sign_flip_p_value([0.25] * 8)  # B better on every problem
    assert method == "exact" and p == pytest.approx(2 / 2**8)
    assert sign_flip_p_value([0.0] * 10) == (1.0, "exact")  # identical
    assert sign_flip_p_value([]) == (1.0, "exact")
    p, method = sign_flip_p_value([0.5, -0.5] * 5)
    assert p == pytest.approx(1.0)
    # Beyond the exact limit: Monte Carlo, seeded, never 0.
    p, method = sign_flip_p_value([0.1] * 30)
    assert method == "monte_carlo" and 0 < p < 1e-3
    assert sign_flip_p_value([0.1, -0.2] * 15) == sign_flip_p_value([0.1, -0.2] * 15)


def test_resampling_clusters_widens_the_interval_when_a_cluster_moves_together():
    # 4 phrasings x 10 problems: RL gained on three and lost everything on one. Over 40
    # problems the gain looks sure; over 4 phrasings it is not.
    gains = [1.0, 1.0, 1.0, -1.0]
    a = [0.0 if g > 0 else 1.0 for g in gains for _ in range(10)]
    b = [1.0 if g > 0 else 0.0 for g in gains for _ in range(10)]
    clusters = [f"t{i}" for i in range(4) for _ in range(10)]
    by_problem = paired_bootstrap_ci(a, b)
    by_cluster = clustered_paired_bootstrap_ci(a, b, clusters)
    assert by_problem[0] > 0  # 30 of 40 problems up
    assert by_cluster[0] < 0 < 0.5 < by_cluster[1]  # 3 of 4 phrasings up: could be luck
    assert by_cluster[1] - by_cluster[0] > 2 * (by_problem[1] - by_problem[0])
    # problems each in a cluster of their own: the same kind of interval as over problems
    alone = clustered_paired_bootstrap_ci(a, b, [str(i) for i in range(40)])
    assert alone[0] > 0 and abs((alone[1] - alone[0]) - (by_problem[1] - by_problem[0])) < 0.1
    # one cluster: nothing to resample; the mean, weighted by cluster size
    assert clustered_paired_bootstrap_ci(a, b, ["t"] * 40) == (0.5, 0.5)
    assert clustered_paired_bootstrap_ci([], [], []) == (0.0, 0.0)
    with pytest.raises(ValueError, match="differ in length"):
        clustered_paired_bootstrap_ci(a, b, clusters[:3])


def test_paired_bootstrap_ci():
    a = [0.0, 0.5, 0.25, 1.0, 0.75]
    b = [0.25, 0.75, 0.5, 1.0, 1.0]
    low, high = paired_bootstrap_ci(a, b)
    assert 0 < low <= 0.2 <= high
    assert paired_bootstrap_ci(a, a) == (0.0, 0.0)
    with pytest.raises(ValueError):
        paired_bootstrap_ci(a, b[:3])
