"""Fixtures for the remote adapters: a fake tokenizer, fake services behind the SDKs."""

from __future__ import annotations

import pytest

from tests.backends.remote.fakes import make_tokenizer_dir


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture
def fake_pytrio(monkeypatch, tmp_path, tokenizer_dir):
    """A fake PyTRIO service, and the SDK logged in to it as `trio login` would."""
    pytrio = pytest.importorskip("pytrio")
    from tests.backends.remote.fake_pytrio import use_fake_pytrio

    fake = use_fake_pytrio(monkeypatch, tmp_path / "home", tokenizer_dir)
    pytrio.configure_observability(enabled=False)
    yield fake
    pytrio.configure_observability(enabled=True)


@pytest.fixture
def fake_tinker(monkeypatch, tmp_path, tokenizer_dir):
    """A fake Tinker service, and TINKER_API_KEY set for it."""
    pytest.importorskip("tinker")
    from tests.backends.remote.fake_tinker import use_fake_tinker

    return use_fake_tinker(monkeypatch, tmp_path / "home", tokenizer_dir)
