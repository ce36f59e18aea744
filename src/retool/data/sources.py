"""Dataset specs as users write them: ``demo``, ``demo:<split>`` or a file path.

``demo`` alone is the bundled demo *test* split (the held-out one used for
evaluation); ``demo:train``, ``demo:dev``, ``demo:paraphrase`` (held-out
phrasings) and ``demo:varied`` (train's problems asked more ways) name the others.
Anything else is
a ``.jsonl`` / ``.parquet`` file read by :func:`load_examples`.
"""

from __future__ import annotations

from retool.data.demo import demo_examples
from retool.data.examples import MathExample, load_examples
from retool.errors import ConfigError


def load_dataset(spec: str) -> list[MathExample]:
    """The examples ``spec`` names (see the module docstring)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"a dataset is demo, demo:SPLIT or a file path, got {spec!r}")
    if spec == "demo" or spec.startswith("demo:"):
        split = spec.partition(":")[2] or "test"
        return demo_examples(split)
    return load_examples(spec)
