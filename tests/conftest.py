"""Shared fixtures: the real SmolLM2 tokenizer, loaded once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smol_tokenizer():
    from retool.backends.local.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")
