"""Which engine sampled an evaluation, as its results header records it.

A results file sampled by vLLM carries ``"sampler": {"engine": "vllm",
"dtype": ...}`` in its header; one sampled by ours carries no ``sampler``
(every file written before vLLM could evaluate stays resumable). The header
is compared on resume, so a file is never finished by the other engine: the
two draw different random streams from the same seeds, and a mixed file's
rows would not be one evaluation's.
"""

from __future__ import annotations

from typing import Any


def engine_settings(engine: str, dtype: str) -> dict[str, Any]:
    """The header entry for ``engine`` (``local`` | ``vllm``) computing in ``dtype``."""
    if engine == "vllm":
        return {"sampler": {"engine": "vllm", "dtype": dtype}}
    return {}
