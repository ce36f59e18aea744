"""The bundled demo dataset: problems a small model can't do in its head, phrased many ways.

Each problem is easy with a line or two of Python and hard without it: large
products, modular powers, digit sums, prime counts, gcd/lcm, base conversion
and small combinatorics. Answers are integers, computed by the generator
itself, and every problem carries a reference solution as code
(``DemoProblem.solution``) so that cold-start demonstrations can be built from
it, plus a plausible first attempt that fails (``DemoProblem.first_try``, e.g.
a missing import) and the sentence that names the fix (``DemoProblem.repair``),
so that demonstrations can also show an error read and corrected.

**Families, variants, templates** (:mod:`retool.data.demo_families`). Seven
families, each with two variants (a product of two numbers and of three; a digit sum of a power
and of a product; ...), each variant with its own phrasings (templates): at
least 8 per family, with different verbs and word order, plain text and
LaTeX, numbers with thousands separators or in words where that is natural
(small counts, bases, exponents), and a short word-problem framing. A
template is a :meth:`str.format` string over the variant's fields (``a``,
``a_sep`` = ``a`` with separators, ``k_word`` = ``k`` in words, ...).

**The split rule.** Template ``j`` of a variant (0-based, in the order written
here) is *held out* when ``j % 4 == 3``: every fourth phrasing of every
variant, so each variant keeps at least three phrasings for training and
gives at least one to the held-out split. Held-out templates are used only by
the ``paraphrase`` split; ``train``, ``dev`` and ``test`` use only the others
(``test``: new numbers, seen phrasings; ``paraphrase``: new numbers *and* new
phrasings). Nothing that trains or chooses settings may read ``test`` or
``paraphrase`` (``retool sft make-demos`` refuses both).

**The varied split.** ``varied`` is not drawn: it is the ``train`` split's
problems (the same numbers, answers and solutions), each rephrased by a
phrasing drawn uniformly from its variant's training phrasings *and* its
``extra`` ones (:func:`vary`, an RNG of its own). The extras were added on
2026-12-07 to test whether RL on more ways of asking transfers to phrasings it
never saw (issue 43); they were written without sight of the held-out
phrasings, are never held out and never used by ``train``, ``dev`` or
``test``, so every split measured before stays what it was.

**Purity.** The dataset is a pure function of its seed (:func:`generate_splits`;
:data:`DEMO_SEED` for the bundled one): one RNG draws the splits in the order
of :data:`SPLIT_SIZES`, problem ``i`` of a split comes from family ``i mod 7``
with a template drawn uniformly from the split's allowed ones, and a problem
whose numbers already occurred (in any split, under any phrasing) is drawn
again, so the splits share neither a question nor the mathematics behind one.
Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass

from retool.data.demo_families import (
    FAMILIES,
    HELD_OUT_EVERY,
    is_held_out,
    ordinal,
    words,
)
from retool.data.examples import MathExample
from retool.errors import ConfigError

__all__ = [
    "ALL_SPLITS",
    "DEMO_SEED",
    "FAMILIES",
    "HELD_OUT_EVERY",
    "HELD_OUT_SPLITS",
    "SPLITS",
    "SPLIT_SIZES",
    "VARIED",
    "DemoProblem",
    "demo_examples",
    "demo_problems",
    "generate_splits",
    "is_held_out",
    "ordinal",
    "vary",
    "words",
]

DEMO_SEED = 20250415  # fixed: changing it changes the dataset
# Drawn in this order from one RNG: a split's size changes only the splits after it.
# paraphrase is last and grew from 40 to 120 problems on 2026-12-06 (for the long run's
# interval, configs/demo-long.toml): its first 40, and every other split, are unchanged.
SPLIT_SIZES = {"train": 240, "dev": 40, "test": 40, "paraphrase": 120}
SPLITS = tuple(SPLIT_SIZES)
HELD_OUT_SPLITS = ("paraphrase",)  # drawn from the held-out templates only
# Derived, not drawn: the train split's problems rephrased from a wider pool (:func:`vary`).
VARIED = "varied"
ALL_SPLITS = (*SPLITS, VARIED)


@dataclass(frozen=True)
class DemoProblem:
    """A demo question with its integer answer, a Python solution and a failing first try."""

    id: str  # "demo-<split>-<index>"
    family: str  # problem family, e.g. "modpow"
    variant: str  # the family's variant, e.g. "modpow_sum"; also the data_source suffix
    template: str  # "<variant>/<index>": which phrasing wrote the question
    question: str  # problem statement
    answer: int  # exact integer answer
    solution: str  # Python code that prints ``answer``
    first_try: str  # plausible code that raises an error (a missing import, a wrong function)
    repair: str  # one sentence naming what went wrong with ``first_try`` and the fix
    fields: tuple[tuple[str, str], ...] = ()  # the template placeholders that wrote it

    def to_example(self) -> MathExample:
        return MathExample(
            id=self.id,
            question=self.question,
            answer=str(self.answer),
            data_source=f"demo/{self.variant}",
        )


def generate_splits(
    seed: int = DEMO_SEED, sizes: Mapping[str, int] = SPLIT_SIZES
) -> dict[str, list[DemoProblem]]:
    """Every drawn split, a pure function of ``seed`` and ``sizes`` (see the module
    docstring); the derived ``varied`` split is :func:`vary`'s.

    ``sizes`` exists so a test can show that growing a split keeps what came before it.
    """
    rng = random.Random(seed)
    seen: set[tuple[object, ...]] = set()
    splits: dict[str, list[DemoProblem]] = {}
    for name in SPLITS:
        problems: list[DemoProblem] = []
        while len(problems) < sizes[name]:
            family = FAMILIES[len(problems) % len(FAMILIES)]
            variant, j = rng.choice(family.templates(held_out=name in HELD_OUT_SPLITS))
            draw = variant.draw(rng)
            key = (variant.name, *draw.key)
            if key in seen:  # splits must not share a problem, however phrased
                continue
            seen.add(key)
            problems.append(
                DemoProblem(
                    id=f"demo-{name}-{len(problems):04d}",
                    family=family.name,
                    variant=variant.name,
                    template=f"{variant.name}/{j}",
                    question=variant.templates[j].format(**draw.fields),
                    answer=draw.answer,
                    solution=draw.solution,
                    first_try=draw.first_try,
                    repair=draw.repair,
                    fields=tuple(draw.fields.items()),
                )
            )
        splits[name] = problems
    return splits


def vary(problems: list[DemoProblem], seed: int = DEMO_SEED) -> list[DemoProblem]:
    """``problems`` (of a training split) each rephrased by one of its variant's training
    phrasings, extras included, drawn uniformly from an RNG of its own: the same numbers,
    answers and solutions, more ways of asking."""
    rng = random.Random(f"{seed}/varied")
    variants = {variant.name: variant for family in FAMILIES for variant in family.variants}
    varied = []
    for index, problem in enumerate(problems):
        variant = variants[problem.variant]
        label, text = rng.choice(variant.training_phrasings())
        varied.append(
            dataclasses.replace(
                problem,
                id=f"demo-{VARIED}-{index:04d}",
                template=label,
                question=text.format(**dict(problem.fields)),
            )
        )
    return varied


@functools.lru_cache(maxsize=1)
def _all_splits() -> dict[str, tuple[DemoProblem, ...]]:
    splits = generate_splits(DEMO_SEED)
    splits[VARIED] = vary(splits["train"], DEMO_SEED)
    return {name: tuple(problems) for name, problems in splits.items()}


def demo_problems(split: str = "train") -> list[DemoProblem]:
    """All problems of one split (``train``, ``dev``, ``test``, ``paraphrase`` or
    ``varied``), in order."""
    if split not in ALL_SPLITS:
        raise ConfigError(f"demo split must be one of {list(ALL_SPLITS)}, got {split!r}")
    return list(_all_splits()[split])


def demo_examples(split: str = "train") -> list[MathExample]:
    """The split as :class:`MathExample` values."""
    return [p.to_example() for p in demo_problems(split)]
