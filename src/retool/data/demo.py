"""The bundled demo dataset: problems a small model can't do in its head.

Each problem is easy with one line of Python and hard without it: large
products, modular powers, digit sums of big powers, prime counts, gcd/lcm,
base conversion and small combinatorics. Answers are integers, computed by the
generator itself, and every problem carries the reference solution as code
(``DemoProblem.solution``) so that cold-start demonstrations can be built from
it.

The dataset is a pure function of its seed: :func:`demo_examples` regenerates
it identically on every machine, so nothing needs to be downloaded. The splits
are fixed by problem index; ``test`` is never used for training.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from retool.data.examples import MathExample
from retool.errors import ConfigError

DEMO_SEED = 20250415  # fixed: changing it changes the dataset
SPLIT_SIZES = {"train": 240, "dev": 40, "test": 40}
SPLITS = tuple(SPLIT_SIZES)


@dataclass(frozen=True)
class DemoProblem:
    """A demo question with its integer answer and a Python solution."""

    id: str  # "demo-<split>-<index>"
    family: str  # problem family, e.g. "modpow"
    question: str  # problem statement
    answer: int  # exact integer answer
    solution: str  # Python code that prints ``answer``

    def to_example(self) -> MathExample:
        return MathExample(
            id=self.id,
            question=self.question,
            answer=str(self.answer),
            data_source=f"demo/{self.family}",
        )


def _primes_below(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[0:2] = b"\x00\x00"
    for p in range(2, math.isqrt(n - 1) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(sieve[p * p :: p]))
    return sum(sieve)


def _product(rng: random.Random) -> tuple[str, str, int, str]:
    a, b = rng.randint(10**5, 10**7), rng.randint(10**5, 10**7)
    return ("product", f"What is {a} \\times {b}?", a * b, f"print({a} * {b})")


def _modpow(rng: random.Random) -> tuple[str, str, int, str]:
    base, exp, mod = rng.randint(2, 999), rng.randint(100, 10**6), rng.randint(10**3, 10**6)
    return (
        "modpow",
        f"What is the remainder when ${base}^{{{exp}}}$ is divided by {mod}?",
        pow(base, exp, mod),
        f"print(pow({base}, {exp}, {mod}))",
    )


def _digit_sum(rng: random.Random) -> tuple[str, str, int, str]:
    base, exp = rng.randint(2, 9), rng.randint(50, 400)
    return (
        "digit_sum",
        f"What is the sum of the decimal digits of ${base}^{{{exp}}}$?",
        sum(int(d) for d in str(base**exp)),
        f"print(sum(int(d) for d in str({base}**{exp})))",
    )


def _prime_count(rng: random.Random) -> tuple[str, str, int, str]:
    n = rng.randint(1_000, 200_000)
    code = f"import sympy\nprint(sympy.primepi({n} - 1))"
    return ("prime_count", f"How many prime numbers are less than {n}?", _primes_below(n), code)


def _gcd_lcm(rng: random.Random) -> tuple[str, str, int, str]:
    common = rng.randint(2, 500)
    a, b = common * rng.randint(100, 5000), common * rng.randint(100, 5000)
    if rng.random() < 0.5:
        return (
            "gcd",
            f"What is the greatest common divisor of {a} and {b}?",
            math.gcd(a, b),
            f"import math\nprint(math.gcd({a}, {b}))",
        )
    return (
        "lcm",
        f"What is the least common multiple of {a} and {b}?",
        math.lcm(a, b),
        f"import math\nprint(math.lcm({a}, {b}))",
    )


def _base_conversion(rng: random.Random) -> tuple[str, str, int, str]:
    base = rng.choice([2, 3, 5, 7, 8])
    value = rng.randint(10**4, 10**6)
    digits = []
    rest = value
    while rest:
        rest, d = divmod(rest, base)
        digits.append(str(d))
    written = "".join(reversed(digits))
    return (
        "base_conversion",
        f"The number ${written}_{{{base}}}$ is written in base {base}. "
        "What is its value in base 10?",
        value,
        f"print(int('{written}', {base}))",
    )


def _combinatorics(rng: random.Random) -> tuple[str, str, int, str]:
    n = rng.randint(20, 60)
    k = rng.randint(3, n // 2)
    if rng.random() < 0.5:
        return (
            "binomial",
            f"In how many ways can a committee of {k} be chosen from {n} people?",
            math.comb(n, k),
            f"import math\nprint(math.comb({n}, {k}))",
        )
    m = rng.randint(4, 9)
    return (
        "permutations",
        f"How many ordered arrangements of {m} distinct books can be made "
        f"from a shelf of {n} distinct books?",
        math.perm(n, m),
        f"import math\nprint(math.perm({n}, {m}))",
    )


FAMILIES: tuple[Callable[[random.Random], tuple[str, str, int, str]], ...] = (
    _product,
    _modpow,
    _digit_sum,
    _prime_count,
    _gcd_lcm,
    _base_conversion,
    _combinatorics,
)


def _generate_all() -> dict[str, list[DemoProblem]]:
    rng = random.Random(DEMO_SEED)
    seen: set[str] = set()
    splits: dict[str, list[DemoProblem]] = {}
    for name in SPLITS:
        problems: list[DemoProblem] = []
        while len(problems) < SPLIT_SIZES[name]:
            family_fn = FAMILIES[len(problems) % len(FAMILIES)]
            family, question, answer, solution = family_fn(rng)
            if question in seen:  # splits must not share a question
                continue
            seen.add(question)
            problems.append(
                DemoProblem(
                    id=f"demo-{name}-{len(problems):04d}",
                    family=family,
                    question=question + " Give the exact integer.",
                    answer=answer,
                    solution=solution,
                )
            )
        splits[name] = problems
    return splits


@functools.lru_cache(maxsize=1)
def _all_splits() -> dict[str, tuple[DemoProblem, ...]]:
    return {name: tuple(problems) for name, problems in _generate_all().items()}


def demo_problems(split: str = "train") -> list[DemoProblem]:
    """All problems of one split (``train``, ``dev`` or ``test``), in a fixed order."""
    if split not in SPLIT_SIZES:
        raise ConfigError(f"demo split must be one of {list(SPLITS)}, got {split!r}")
    return list(_all_splits()[split])


def demo_examples(split: str = "train") -> list[MathExample]:
    """The split as :class:`MathExample` values."""
    return [p.to_example() for p in demo_problems(split)]
