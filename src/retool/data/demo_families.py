"""The demo dataset's problem families: how each draws its numbers and the phrasings that ask it.

Seven families (:data:`FAMILIES`), each with two variants (a product of two
numbers and of three; a digit sum of a power and of a product; ...). A variant
draws its numbers (:class:`Draw`: the template fields, the exact answer, a
reference solution as code, a plausible first try that fails and the sentence
naming its fix) and owns its phrasings: ``templates``, of which every fourth
(:func:`is_held_out`) belongs to the held-out ``paraphrase`` split only, and
``extra``, training-only phrasings used by the ``varied`` split alone.
:mod:`retool.data.demo` turns these into splits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

HELD_OUT_EVERY = 4  # template j of a variant is held out when j % 4 == 3


def is_held_out(index: int) -> bool:
    """Whether template ``index`` of a variant belongs to the paraphrase split."""
    return index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


@dataclass(frozen=True)
class Draw:
    """The numbers of one problem, ready for any template of its variant."""

    fields: Mapping[str, str]  # template placeholders
    answer: int
    solution: str
    first_try: str
    repair: str
    key: tuple[int, ...]  # the numbers: two draws with one key are the same problem


@dataclass(frozen=True)
class Variant:
    name: str
    draw: Callable[[random.Random], Draw]
    templates: tuple[str, ...]
    # Training-only phrasings (the ``varied`` split's, see the module docstring): never
    # held out and never used by train/dev/test, so those splits stay as measured.
    extra: tuple[str, ...] = ()

    def training_phrasings(self) -> list[tuple[str, str]]:
        """``(label, template)`` of every phrasing training may use: the variant's
        non-held-out templates (``"<variant>/<j>"``) and its extras (``"<variant>/x<i>"``)."""
        return [
            (f"{self.name}/{j}", text)
            for j, text in enumerate(self.templates)
            if not is_held_out(j)
        ] + [(f"{self.name}/x{i}", text) for i, text in enumerate(self.extra)]


@dataclass(frozen=True)
class Family:
    name: str
    variants: tuple[Variant, ...]

    def templates(self, held_out: bool) -> list[tuple[Variant, int]]:
        """``(variant, template index)`` of the held-out or of the training phrasings."""
        return [
            (variant, j)
            for variant in self.variants
            for j in range(len(variant.templates))
            if is_held_out(j) == held_out
        ]


# -- numbers as text -------------------------------------------------------------------

_ONES = (
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"),
    *("eighteen", "nineteen"),
)
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def words(n: int) -> str:
    """``n`` (0-99) in words, hyphenated: ``42`` -> ``forty-two``."""
    if not 0 <= n < 100:
        raise ValueError(f"words() covers 0-99, got {n}")
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")


def ordinal(n: int) -> str:
    """``123`` -> ``123rd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _sep(n: int) -> str:
    return f"{n:,}"


def _primes_below(n: int) -> int:
    if n < 3:
        return 0
    sieve = bytearray([1]) * n
    sieve[0:2] = b"\x00\x00"
    for p in range(2, math.isqrt(n - 1) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(sieve[p * p :: p]))
    return sum(sieve)


def _digit_sum(n: int) -> int:
    return sum(int(d) for d in str(n))


def _in_base(value: int, base: int) -> str:
    digits = []
    while value:
        value, d = divmod(value, base)
        digits.append(str(d))
    return "".join(reversed(digits)) or "0"


_NO_MATH = "I forgot to import math; here it is with the import."
_NO_SYMPY = "I forgot to import sympy; here it is with the import."


# -- product ------------------------------------------------------------------------


def _product2(rng: random.Random) -> Draw:
    a, b = rng.randint(10**5, 10**7), rng.randint(10**5, 10**7)
    return Draw(
        {"a": str(a), "b": str(b), "a_sep": _sep(a), "b_sep": _sep(b)},
        a * b,
        f"print({a} * {b})",
        f"print(math.prod([{a}, {b}]))",
        "math was never imported, and a plain multiplication does it anyway.",
        (a, b),
    )


def _product3(rng: random.Random) -> Draw:
    a, b, c = (rng.randint(10**3, 10**5) for _ in range(3))
    return Draw(
        {"a": str(a), "b": str(b), "c": str(c), "a_sep": _sep(a), "b_sep": _sep(b)}
        | {"c_sep": _sep(c)},
        a * b * c,
        f"import math\nprint(math.prod([{a}, {b}, {c}]))",
        f"print(math.prod([{a}, {b}, {c}]))",
        _NO_MATH,
        (a, b, c),
    )


PRODUCT = Family(
    "product",
    (
        Variant(
            "product",
            _product2,
            (
                "What is {a} \\times {b}? Give the exact integer.",
                "Compute the product of {a_sep} and {b_sep}.",
                "Multiply {a} by {b}. What do you get?",
                "A warehouse holds {a_sep} crates with {b_sep} bolts in each crate. "
                "How many bolts are there in total?",
                "Find ${a} \\cdot {b}$ exactly.",
                "What number do you get when {b} is multiplied by {a}?",
                "Each of {a_sep} boxes contains {b_sep} beads. How many beads are there "
                "altogether?",
                "Evaluate the product ${a} \\times {b}$ and give the result as an integer.",
            ),
            extra=(
                "Evaluate ${a} \\times {b}$ as an exact integer.",
                "A factory turns out {b_sep} bolts every day. How many bolts does it produce in "
                "{a_sep} days?",
                "An orchard is planted in {a} rows with {b} trees in every row. How many trees "
                "grow in the orchard?",
                "Calculate {a} times {b}.",
                "Suppose $x = {a}$ and $y = {b}$. Find the value of $xy$.",
            ),
        ),
        Variant(
            "product3",
            _product3,
            (
                "What is ${a} \\times {b} \\times {c}$? Give the exact integer.",
                "Compute the product of {a_sep}, {b_sep} and {c_sep}.",
                "A crate holds {a} boxes, each box holds {b} packs and each pack holds {c} "
                "sheets. How many sheets does the crate hold?",
                "Multiply together {a}, {b} and {c}. What is the result?",
            ),
            extra=(
                "Evaluate the product ${a} \\cdot {b} \\cdot {c}$.",
                "A warehouse has {a_sep} pallets; each pallet carries {b_sep} cartons, and each "
                "carton holds {c_sep} cans. How many cans are in the warehouse?",
                "A solid block is built from unit cubes and measures {a} by {b} by {c} cubes. How"
                " many unit cubes does it contain?",
                "Multiply {a}, {b} and {c} together.",
                "A bus makes {a} trips, carries {b} passengers on every trip, and each passenger "
                "pays a fare of {c} cents. How many cents are collected in total?",
            ),
        ),
    ),
)


# -- modular powers -------------------------------------------------------------------


def _modpow(rng: random.Random) -> Draw:
    b, e, m = rng.randint(2, 999), rng.randint(100, 10**6), rng.randint(10**3, 10**6)
    return Draw(
        {"b": str(b), "e": str(e), "m": str(m), "e_sep": _sep(e), "m_sep": _sep(m)},
        pow(b, e, m),
        f"print(pow({b}, {e}, {m}))",
        f"import math\nprint(int(math.pow({b}, {e})) % {m})",
        "math.pow works with floats, which overflow; the built-in pow takes the modulus "
        "as a third argument and stays exact.",
        (b, e, m),
    )


def _modpow_sum(rng: random.Random) -> Draw:
    b, c = rng.randint(2, 999), rng.randint(2, 999)
    e, f = rng.randint(100, 10**5), rng.randint(100, 10**5)
    m = rng.randint(10**3, 10**6)
    return Draw(
        {"b": str(b), "c": str(c), "e": str(e), "f": str(f), "m": str(m)},
        (pow(b, e, m) + pow(c, f, m)) % m,
        f"print((pow({b}, {e}, {m}) + pow({c}, {f}, {m})) % {m})",
        f"print((powmod({b}, {e}, {m}) + powmod({c}, {f}, {m})) % {m})",
        "Python has no powmod; the built-in pow takes the modulus as a third argument.",
        (b, e, c, f, m),
    )


MODPOW = Family(
    "modpow",
    (
        Variant(
            "modpow",
            _modpow,
            (
                "What is the remainder when ${b}^{{{e}}}$ is divided by {m}? Give the exact "
                "integer.",
                "Compute ${b}^{{{e}}} \\bmod {m}$.",
                "Find {b} to the power {e_sep}, modulo {m_sep}.",
                "What remainder is left after dividing {b} raised to the power of {e} by {m_sep}?",
                "Let $N = {b}^{{{e}}}$. What is $N \\bmod {m}$?",
                "What is {b}**{e} mod {m}? Give the remainder as an integer.",
                "A counter starts at 1 and is multiplied by {b} a total of {e} times; after "
                "each step only the remainder modulo {m} is kept. What number does it show "
                "at the end?",
                "Determine the value of ${b}^{{{e}}}$ modulo ${m}$.",
            ),
            extra=(
                "Evaluate ${b}^{{{e}}} \\pmod{{{m}}}$, giving the least non-negative residue.",
                "Raise {b} to the power {e} and reduce the result modulo {m}.",
                "A bacterial culture starts as one cell and its size is multiplied by {b} every "
                "hour. The lab display only shows the count modulo {m_sep}. What does it show "
                "after {e_sep} hours?",
                "Find the integer $r$ with $0 \\le r < {m}$ such that $r \\equiv {b}^{{{e}}} "
                "\\pmod{{{m}}}$.",
                "A secret code is made by raising {b} to the power {e_sep} and keeping only the "
                "remainder after division by {m_sep}. What is the code?",
            ),
        ),
        Variant(
            "modpow_sum",
            _modpow_sum,
            (
                "What is the remainder when ${b}^{{{e}}} + {c}^{{{f}}}$ is divided by {m}?",
                "Compute $({b}^{{{e}}} + {c}^{{{f}}}) \\bmod {m}$.",
                "Find the sum of {b} to the power {e} and {c} to the power {f}, modulo {m}.",
                "Add ${b}^{{{e}}}$ and ${c}^{{{f}}}$, then divide by {m}. What is the remainder?",
            ),
            extra=(
                "Find the least non-negative residue of ${b}^{{{e}}} + {c}^{{{f}}}$ modulo {m}.",
                "Reduce {b}**{e} + {c}**{f} modulo {m}.",
                "A lock's combination is found by adding {b} to the power {e} and {c} to the "
                "power {f}, then taking the remainder on division by {m}. What is the "
                "combination?",
                "A circular dial has {m} positions labelled 0, 1, 2, and so on. Starting at 0, it"
                " is turned forward {b}^{e} steps and then another {c}^{f} steps. At which "
                "position does it stop?",
                "Let $A = {b}^{{{e}}}$ and $B = {c}^{{{f}}}$. What is $(A + B) \\bmod {m}$?",
            ),
        ),
    ),
)


# -- digit sums -----------------------------------------------------------------------


def _digit_sum_power(rng: random.Random) -> Draw:
    b, e = rng.randint(2, 9), rng.randint(50, 400)
    return Draw(
        {"b": str(b), "e": str(e), "b_word": words(b), "e_ord": ordinal(e)},
        _digit_sum(b**e),
        f"print(sum(int(d) for d in str({b}**{e})))",
        f"print(sum(str({b}**{e})))",
        "sum needs numbers, not characters: each digit has to go through int first.",
        (b, e),
    )


def _digit_sum_product(rng: random.Random) -> Draw:
    a, b = rng.randint(10**5, 10**8), rng.randint(10**5, 10**8)
    return Draw(
        {"a": str(a), "b": str(b), "a_sep": _sep(a), "b_sep": _sep(b)},
        _digit_sum(a * b),
        f"print(sum(int(d) for d in str({a} * {b})))",
        f"print(sum(str({a} * {b})))",
        "sum needs numbers, not characters: each digit has to go through int first.",
        (a, b),
    )


DIGIT_SUM = Family(
    "digit_sum",
    (
        Variant(
            "digit_sum",
            _digit_sum_power,
            (
                "What is the sum of the decimal digits of ${b}^{{{e}}}$? Give the exact integer.",
                "Add up all the digits of {b}^{e}. What is the total?",
                "Write {b_word} to the power {e} out in full in base 10 and add its digits. "
                "What is the sum?",
                "Find the digit sum of ${b}^{{{e}}}$.",
                "Let $N = {b}^{{{e}}}$. Compute the sum of the digits of $N$.",
                "What do the digits of {b}**{e} add up to?",
                "A student writes down the number {b}^{e} in full and then adds its digits "
                "together. What total does she get?",
                "If you raise {b_word} to the {e_ord} power and sum the digits of the result, "
                "what do you get?",
            ),
            extra=(
                "Take the {e_ord} power of {b_word} and add together its decimal digits. What do "
                "you get?",
                "A calculator with an unlimited display computes {b} raised to the power {e}. If "
                "you add up every digit on the screen, what total do you get?",
                "A bookkeeper copies out the full decimal expansion of {b_word} to the {e_ord} "
                "power and then totals its digits. What sum does she find?",
                "Let $S$ denote the sum of the base-10 digits of ${b}^{{{e}}}$. Find $S$.",
            ),
        ),
        Variant(
            "digit_sum_product",
            _digit_sum_product,
            (
                "What is the sum of the decimal digits of ${a} \\times {b}$?",
                "Multiply {a} by {b} and add up the digits of the product. What is the sum?",
                "Compute the digit sum of the product of {a_sep} and {b_sep}.",
                "Take the product of {a} and {b}, then report the sum of its digits.",
            ),
            extra=(
                "A cashier multiplies {a_sep} by {b_sep} and then adds up the digits of the "
                "result as a check. What total does she get?",
                "A puzzle book asks readers to multiply {a} and {b}, then add together every "
                "digit of the answer. What number should readers end up with?",
                "If $P = {a} \\times {b}$, what is the sum of the decimal digits of $P$?",
            ),
        ),
    ),
)


# -- prime counts ---------------------------------------------------------------------


def _primes_below_n(rng: random.Random) -> Draw:
    n = rng.randint(1_000, 200_000)
    code = f"print(sympy.primepi({n} - 1))"
    return Draw(
        {"n": str(n), "n_sep": _sep(n), "n1": str(n - 1)},
        _primes_below(n),
        f"import sympy\n{code}",
        code,
        _NO_SYMPY,
        (n,),
    )


def _primes_between(rng: random.Random) -> Draw:
    a = rng.randint(1_000, 100_000)
    b = a + rng.randint(1_000, 100_000)
    code = f"print(sympy.primepi({b}) - sympy.primepi({a} - 1))"
    return Draw(
        {"a": str(a), "b": str(b), "a_sep": _sep(a), "b_sep": _sep(b)},
        _primes_below(b + 1) - _primes_below(a),
        f"import sympy\n{code}",
        code,
        _NO_SYMPY,
        (a, b),
    )


PRIME_COUNT = Family(
    "prime_count",
    (
        Variant(
            "prime_count",
            _primes_below_n,
            (
                "How many prime numbers are less than {n}? Give the exact integer.",
                "Count the primes $p$ with $p < {n}$.",
                "How many primes are there below {n_sep}?",
                "What is the number of primes smaller than {n_sep}?",
                "Compute $\\pi({n1})$, the number of primes less than or equal to {n1}.",
                "Find how many of the integers from 1 to {n1} are prime.",
                "A sieve marks every prime number below {n}. How many numbers does it mark?",
                "Determine the count of prime numbers under {n}.",
            ),
            extra=(
                "Determine the number of primes $p$ satisfying $2 \\le p \\le {n1}$.",
                "Count the prime numbers smaller than {n_sep}.",
                "A collector wants one postage stamp for every prime number below {n}. How many "
                "stamps does she need?",
                "Raffle tickets are numbered 1 through {n1}, and a prize goes to every ticket "
                "whose number is prime. How many tickets win a prize?",
                "Of all the positive integers under {n}, how many are primes?",
            ),
        ),
        Variant(
            "prime_count_between",
            _primes_between,
            (
                "How many prime numbers are there between {a} and {b}, inclusive?",
                "Count the primes $p$ with ${a} \\le p \\le {b}$.",
                "How many of the integers from {a_sep} to {b_sep} (both included) are prime?",
                "Find the number of primes in the closed interval $[{a}, {b}]$.",
            ),
            extra=(
                "Count the primes from {a} to {b}, endpoints included.",
                "House numbers on a long street run from {a_sep} to {b_sep}, every number used "
                "once. How many of these house numbers are prime?",
                "Race bibs are numbered consecutively from {a} up to and including {b}. A bib is "
                "lucky if its number is prime. How many lucky bibs are there?",
                "Including both endpoints, how many primes lie between {a_sep} and {b_sep}?",
            ),
        ),
    ),
)


# -- gcd and lcm ----------------------------------------------------------------------


def _pair_with_common_factor(rng: random.Random) -> tuple[int, int]:
    common = rng.randint(2, 500)
    return common * rng.randint(100, 5000), common * rng.randint(100, 5000)


def _gcd(rng: random.Random) -> Draw:
    a, b = _pair_with_common_factor(rng)
    return Draw(
        {"a": str(a), "b": str(b), "a_sep": _sep(a), "b_sep": _sep(b)},
        math.gcd(a, b),
        f"import math\nprint(math.gcd({a}, {b}))",
        f"print(math.gcd({a}, {b}))",
        _NO_MATH,
        (0, a, b),
    )


def _lcm(rng: random.Random) -> Draw:
    a, b = _pair_with_common_factor(rng)
    return Draw(
        {"a": str(a), "b": str(b), "a_sep": _sep(a), "b_sep": _sep(b)},
        math.lcm(a, b),
        f"import math\nprint(math.lcm({a}, {b}))",
        f"print(math.lcm({a}, {b}))",
        _NO_MATH,
        (1, a, b),
    )


GCD_LCM = Family(
    "gcd_lcm",
    (
        Variant(
            "gcd",
            _gcd,
            (
                "What is the greatest common divisor of {a} and {b}? Give the exact integer.",
                "Compute $\\gcd({a}, {b})$.",
                "Find the largest integer that divides both {a_sep} and {b_sep}.",
                "What is the highest common factor of {a} and {b}?",
                "Two ropes are {a} cm and {b} cm long. They are cut into pieces of one equal "
                "whole-number length with nothing left over. What is the longest possible "
                "piece, in cm?",
                "Determine $\\operatorname{{gcd}}({b}, {a})$.",
            ),
            extra=(
                "Give the GCD of {a_sep} and {b_sep}.",
                "A baker shares {a} cookies and {b} muffins among identical gift bags, with "
                "nothing left over. What is the greatest number of bags she can fill?",
                "A floor measuring {a} cm by {b} cm is to be covered exactly by identical square "
                "tiles with whole-centimetre sides, without cutting. What is the largest possible"
                " tile side, in cm?",
                "Let $d$ be the largest positive integer with $d \\mid {a}$ and $d \\mid {b}$. What"
                " is $d$?",
            ),
        ),
        Variant(
            "lcm",
            _lcm,
            (
                "What is the least common multiple of {a} and {b}? Give the exact integer.",
                "Compute $\\operatorname{{lcm}}({a}, {b})$.",
                "Find the smallest positive integer that is a multiple of both {a_sep} and "
                "{b_sep}.",
                "What is the lowest common multiple of {a} and {b}?",
                "Two lights blink every {a} seconds and every {b} seconds, and they just "
                "blinked together. After how many seconds will they next blink together?",
                "Determine the LCM of {b} and {a}.",
            ),
            extra=(
                "What is the smallest positive integer $N$ such that ${a} \\mid N$ and ${b} \\mid "
                "N$?",
                "Two buses leave a depot together; one returns every {a} minutes and the other "
                "every {b} minutes. After how many minutes are both back at the depot together "
                "for the first time?",
                "Hot dogs come in packs of {a} and buns in packs of {b}. What is the smallest "
                "positive number of hot dogs you can buy so that you can also buy exactly as many"
                " buns?",
            ),
        ),
    ),
)


# -- base conversion ------------------------------------------------------------------


def _base_to_decimal(rng: random.Random) -> Draw:
    base = rng.choice([2, 3, 5, 7, 8])
    value = rng.randint(10**4, 10**6)
    written = _in_base(value, base)
    return Draw(
        {"w": written, "base": str(base), "base_word": words(base)},
        value,
        f"print(int('{written}', {base}))",
        f"print(int({written}, {base}))",
        "int() needs the digits as a string when a base is given.",
        (0, base, value),
    )


def _base_from_decimal(rng: random.Random) -> Draw:
    base = rng.choice([2, 3, 5, 7, 8, 9])
    value = rng.randint(10**3, 10**5)
    loop = (
        f"n, digits = {value}, ''\nwhile n:\n    n, d = divmod(n, {base})\n"
        "    digits = str(d) + digits\nprint(digits)"
    )
    return Draw(
        {"v": str(value), "v_sep": _sep(value), "base": str(base), "base_word": words(base)},
        int(_in_base(value, base)),
        loop,
        f"print(base_repr({value}, {base}))",
        "Python has no built-in base_repr; repeated divmod by the base gives the digits.",
        (1, base, value),
    )


BASE_CONVERSION = Family(
    "base_conversion",
    (
        Variant(
            "base_to_decimal",
            _base_to_decimal,
            (
                "The number ${w}_{{{base}}}$ is written in base {base}. What is its value in "
                "base 10? Give the exact integer.",
                "Convert {w} from base {base} to base 10.",
                "What is the decimal value of the base-{base} numeral {w}?",
                "Express ${w}_{{{base}}}$ as a decimal number.",
                "In base {base_word}, a number is written {w}. What is it in ordinary decimal "
                "notation?",
                "Interpret the digits {w} as a number in base {base} and give its value in "
                "decimal.",
                "A machine displays numbers in base {base}. It shows {w}. What decimal number "
                "is that?",
                "Find the base-ten value of {w} read in base {base_word}.",
            ),
            extra=(
                "Express the base-{base} number ${w}_{{{base}}}$ in base ten.",
                "Turn {w} (base {base}) into decimal.",
                "An old odometer counts in base {base_word} and currently reads {w}. What is that"
                " reading in our usual decimal system?",
                "A scribe records the size of a herd as {w}, using a base-{base} number system. "
                "How many animals are in the herd, written in base 10?",
                "Reading {w} as a base-{base} numeral, what integer does it represent? Answer in "
                "decimal.",
            ),
        ),
        Variant(
            "base_from_decimal",
            _base_from_decimal,
            (
                "Write {v} in base {base}. Give the digits as one number.",
                "What is the base-{base} representation of {v_sep}? Give its digits as one number.",
                "Convert the decimal number {v} to base {base_word}; answer with the digits as "
                "one number.",
                "Express {v} in base {base} and give the resulting string of digits as one number.",
            ),
            extra=(
                "Convert {v_sep} to base {base}. Answer with the digit string as a single number.",
                "A computer stores numbers in base {base_word}. How does it write the decimal "
                "number {v}? Give the digits as one number.",
                "Aliens who count in base {base} see a pile of {v_sep} pebbles. What numeral do "
                "they write for it? Give its digits as one number.",
                "Rewrite {v} using base-{base} digits. What digit string results, read as one "
                "number?",
            ),
        ),
    ),
)


# -- combinatorics --------------------------------------------------------------------


def _binomial(rng: random.Random) -> Draw:
    n = rng.randint(20, 60)
    k = rng.randint(3, n // 2)
    return Draw(
        {"n": str(n), "k": str(k), "k_word": words(k)},
        math.comb(n, k),
        f"import math\nprint(math.comb({n}, {k}))",
        f"print(math.comb({n}, {k}))",
        _NO_MATH,
        (0, n, k),
    )


def _permutations(rng: random.Random) -> Draw:
    n = rng.randint(20, 60)
    m = rng.randint(4, 9)
    return Draw(
        {"n": str(n), "m": str(m), "m_word": words(m)},
        math.perm(n, m),
        f"import math\nprint(math.perm({n}, {m}))",
        f"print(math.perm({n}, {m}))",
        _NO_MATH,
        (1, n, m),
    )


COMBINATORICS = Family(
    "combinatorics",
    (
        Variant(
            "binomial",
            _binomial,
            (
                "In how many ways can a committee of {k} be chosen from {n} people?",
                "Compute $\\binom{{{n}}}{{{k}}}$.",
                "How many {k}-element subsets does a set with {n} elements have?",
                "A club of {n} members picks {k_word} of them to form a team. How many "
                "different teams are possible?",
                "What is {n} choose {k}? Give the exact integer.",
                "Find the number of ways to select {k_word} cards from {n} different cards "
                "when the order does not matter.",
            ),
            extra=(
                "Find $C({n}, {k})$, the number of combinations of {n} objects taken {k} at a "
                "time.",
                "A pizzeria offers {n} different toppings. How many different pizzas with exactly"
                " {k_word} distinct toppings can be ordered?",
                "A hiker wants to pack {k_word} of her {n} different snacks for a trip. How many "
                "different selections can she make?",
                "Count the combinations of {k} items from {n}.",
                "A lottery ticket requires picking {k} different numbers from 1 to {n}, in any "
                "order. How many distinct tickets are possible?",
            ),
        ),
        Variant(
            "permutations",
            _permutations,
            (
                "How many ordered arrangements of {m} distinct books can be made from a shelf "
                "of {n} distinct books?",
                "In how many ways can {m_word} of {n} people be seated in a row of {m_word} "
                "chairs?",
                "Compute the number of permutations $P({n}, {m})$.",
                "A race has {n} runners. In how many ways can the first {m_word} places be filled?",
                "How many ordered sequences of {m} different items can be chosen from {n} items?",
                "Find $\\frac{{{n}!}}{{({n}-{m})!}}$.",
            ),
            extra=(
                "A code is made of {m} different symbols chosen from an alphabet of {n} symbols, "
                "with no repeats and order mattering. How many codes are possible?",
                "Compute the falling factorial ${n}^{{\\underline{{{m}}}}} = "
                "{n}({n}-1)\\cdots({n}-{m}+1)$.",
                "Count the ordered selections of {m} from {n} distinct objects.",
                "A DJ has {n} distinct songs and wants to play {m_word} of them in sequence, none"
                " repeated. How many different playlists are possible?",
            ),
        ),
    ),
)


FAMILIES: tuple[Family, ...] = (
    PRODUCT,
    MODPOW,
    DIGIT_SUM,
    PRIME_COUNT,
    GCD_LCM,
    BASE_CONVERSION,
    COMBINATORICS,
)
