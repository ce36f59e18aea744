"""The statistics of an evaluation: unbiased pass@k, bootstrap intervals, a paired test.

Why these choices:

* **The unit of resampling is the problem, not the sample.** The N samples of
  one problem are strongly correlated (they share its difficulty); a benchmark
  of 30 problems sampled 12 times holds 30 independent observations, not 360.
  A bootstrap over samples would report an interval several times too narrow.
  So every interval here resamples problems (with replacement) and recomputes
  the statistic from their per-problem values, or, where problems come in
  clusters (the phrasings that wrote them), whole clusters
  (:func:`clustered_paired_bootstrap_ci`).
* **pass@k uses the unbiased estimator** of Chen et al. (2021, "Codex"):
  with ``n`` samples of which ``c`` are correct,
  ``pass@k = 1 - C(n - c, k) / C(n, k)``, the probability that ``k`` samples
  drawn without replacement from the ``n`` include a correct one. The naive
  "any of the first k is correct" wastes the other samples and depends on their
  order. The ratio of binomials overflows floats for large ``n``; it is
  computed as the product ``prod_{i=n-c+1}^{n} (1 - k / i)``.
* **A comparison is paired.** Two checkpoints evaluated on the same problems
  differ far less than their two intervals suggest, because problem difficulty
  is shared. The paired bootstrap resamples problems and recomputes the mean
  of the per-problem differences ``d_i = p_B,i - p_A,i``; the sign-flip
  permutation test asks how often ``|mean(s_i d_i)|`` with random signs
  ``s_i = +-1`` (exchanging A and B within a problem, which is what "no
  difference" means) is at least the observed ``|mean(d_i)|``. With at most
  20 problems that differ, every sign assignment is enumerated (an exact
  p-value); beyond that, a seeded Monte Carlo sample with the ``(1 + hits) /
  (1 + draws)`` correction, which never reports 0.
* **Everything is seeded**: the same inputs always give the same interval and
  p-value, so two reports of one file agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retool.checks import check_number

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
EXACT_PERMUTATION_MAX = 20  # problems with a nonzero difference: 2**20 assignments at most
PERMUTATION_DRAWS = 20000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        check_number(f"pass_at_k {name}", value, integer=True)
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def k_values(n: int) -> list[int]:
    """``1, 2, 4, ...`` up to ``n``, and ``n`` itself."""
    ks = []
    k = 1
    while k < n:
        ks.append(k)
        k *= 2
    ks.append(n)
    return ks


def bootstrap_ci(
    values: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-problem ``values`` in ``[0, 1]``.

    Resamples the problems with replacement (see the module docstring). An
    empty input gives ``(0.0, 0.0)``; one problem gives a zero-width interval.

    Every problem at 0 (or every one at 1) is the case the percentile bootstrap
    gets wrong: each resample is the same, so it reports ``[0, 0]``, as if 0 of
    40 problems proved the rate is exactly zero. There the interval is the exact
    (Clopper-Pearson) one for ``m`` problems all failed, ``[0, 1 - (a/2)^(1/m)]``
    (all solved: ``[(a/2)^(1/m), 1]``), with ``a = 1 - level``: a value in
    ``[0, 1]`` whose mean is ``p`` varies at most as much as a coin with ``p``,
    so the bound holds for fractions of samples as well as for 0/1 outcomes.
    """
    data = _checked("bootstrap_ci", values, resamples, level)
    if data.size and (data.min() < 0.0 or data.max() > 1.0):
        raise ValueError("bootstrap_ci values must be per-problem fractions in [0, 1]")
    if data.size > 1 and (data.max() == 0.0 or data.min() == 1.0):
        bound = float(((1.0 - level) / 2.0) ** (1.0 / data.size))
        return (0.0, 1.0 - bound) if data.max() == 0.0 else (bound, 1.0)
    return _percentile_bootstrap(data, resamples, seed, level)


def _checked(name: str, values: Sequence[float], resamples: int, level: float) -> np.ndarray:
    check_number(f"{name} resamples", resamples, 1, 10**7, integer=True)
    check_number(f"{name} level", level, 0, 1, low_open=True)
    data = np.asarray(values, dtype=float)
    if not np.isfinite(data).all():
        raise ValueError(f"{name} values must be finite numbers (a nan or inf is a bug)")
    return data


def _percentile_bootstrap(
    data: np.ndarray, resamples: int, seed: int, level: float
) -> tuple[float, float]:
    """The percentile bootstrap interval of ``data.mean()``, resampling its entries."""
    if data.size == 0:
        return 0.0, 0.0
    tail = (1.0 - level) / 2.0
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // data.size)  # bounded memory for big benchmarks
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        picks = rng.integers(0, data.size, size=(stop - start, data.size))
        means[start:stop] = data[picks].mean(axis=1)
    return _bracketing(means, float(data.mean()), tail)


def _bracketing(means: np.ndarray, mean: float, tail: float) -> tuple[float, float]:
    """The ``tail``/``1 - tail`` quantiles of resampled ``means``, widened to hold ``mean``:
    a percentile interval of a mean always brackets it up to float error; make it exact."""
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return min(float(low), mean), max(float(high), mean)


def sign_flip_p_value(
    differences: Sequence[float],
    *,
    seed: int = BOOTSTRAP_SEED,
    draws: int = PERMUTATION_DRAWS,
    exact_max: int = EXACT_PERMUTATION_MAX,
) -> tuple[float, str]:
    """Two-sided paired sign-flip permutation p-value of ``mean(differences) == 0``.

    Returns ``(p, method)`` with ``method`` ``"exact"`` (every assignment of
    signs to the nonzero differences enumerated; zeros are unchanged by a
    flip) or ``"monte_carlo"``. No nonzero difference gives ``p = 1``.
    """
    data = np.asarray(differences, dtype=float)
    nonzero = data[data != 0.0]
    m = nonzero.size
    if m == 0:
        return 1.0, "exact"
    observed = abs(float(nonzero.sum()))
    tolerance = 1e-9 * max(1.0, observed)
    if m <= exact_max:
        hits = 0
        total = 1 << m
        block = 1 << min(m, 16)
        bits = np.arange(m)
        for start in range(0, total, block):
            codes = np.arange(start, start + block, dtype=np.int64)[:, None]
            signs = 1.0 - 2.0 * ((codes >> bits) & 1)
            sums = np.abs(signs @ nonzero)
            hits += int(np.count_nonzero(sums >= observed - tolerance))
        return hits / total, "exact"
    rng = np.random.default_rng(seed)
    hits = 0
    chunk = max(1, 2_000_000 // m)
    for start in range(0, draws, chunk):
        size = min(draws, start + chunk) - start
        signs = rng.choice(np.array([-1.0, 1.0]), size=(size, m))
        hits += int(np.count_nonzero(np.abs(signs @ nonzero) >= observed - tolerance))
    return (1 + hits) / (1 + draws), "monte_carlo"


def paired_bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Bootstrap interval of ``mean(b - a)``, resampling problems (pairs kept together)."""
    if len(a) != len(b):
        raise ValueError(f"paired values differ in length: {len(a)} and {len(b)}")
    differences = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    data = _checked("paired_bootstrap_ci", differences, resamples, level)
    return _percentile_bootstrap(data, resamples, seed, level)


def clustered_paired_bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    clusters: Sequence[str],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Bootstrap interval of ``mean(b - a)`` over problems, resampling whole clusters.

    Problems that share a cluster (a phrasing, a source) are not independent
    evidence about the population of clusters: 120 problems written by 19
    phrasings say less about unseen phrasings than 120 independent ones. Each
    resample draws as many clusters as there are, with replacement, and takes
    the mean difference over all their problems. One cluster gives a
    zero-width interval, as one problem does for :func:`paired_bootstrap_ci`.
    """
    if not len(a) == len(b) == len(clusters):
        raise ValueError(
            f"paired values and clusters differ in length: {len(a)}, {len(b)}, {len(clusters)}"
        )
    differences = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    data = _checked("clustered_paired_bootstrap_ci", differences, resamples, level)
    if data.size == 0:
        return 0.0, 0.0
    names = sorted(set(clusters))
    index = {name: i for i, name in enumerate(names)}
    members = np.array([index[c] for c in clusters])
    sums = np.bincount(members, weights=data, minlength=len(names))
    sizes = np.bincount(members, minlength=len(names)).astype(float)
    tail = (1.0 - level) / 2.0
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // len(names))  # bounded memory, as for problems
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        picks = rng.integers(0, len(names), size=(stop - start, len(names)))
        means[start:stop] = sums[picks].sum(axis=1) / sizes[picks].sum(axis=1)
    return _bracketing(means, float(data.mean()), tail)
