"""Fixtures for the remote adapters: a fake tokenizer, fake services behind the SDKs."""

from __future__ import annotations

import sys

import pytest

from tests.backends.remote.fakes import install_transport, make_tokenizer_dir


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture
def fake_pytrio(monkeypatch, tmp_path, tokenizer_dir):
    """A fake PyTRIO service, and the SDK logged in to it as `trio login` would."""
    pytrio = pytest.importorskip("pytrio")
    from pytrio.config.config import auth_state, configuration

    from tests.backends.remote.fake_pytrio import API_KEY, FakePytrio

    fake = FakePytrio(model_id=str(tokenizer_dir))
    install_transport(monkeypatch, fake)
    monkeypatch.setattr(auth_state, "api_key", API_KEY)
    monkeypatch.setattr(auth_state, "config_error", None)
    monkeypatch.setattr(configuration, "home", str(tmp_path / "home"))
    monkeypatch.setattr(configuration, "retry_initial_delay_seconds", 0.01)
    monkeypatch.setattr(configuration, "retry_jitter_ratio", 0.0)
    monkeypatch.setattr(configuration, "log_level", "ERROR")
    monkeypatch.delenv("PYTRIO_API_KEY", raising=False)
    # The SDK loads tokenizers with ModelScope when it can and falls back to
    # transformers (pytrio/model/tokenizer.py); importing ModelScope takes seconds.
    monkeypatch.setitem(sys.modules, "modelscope", None)
    pytrio.configure_observability(enabled=False)
    yield fake
    pytrio.configure_observability(enabled=True)


@pytest.fixture
def fake_tinker(monkeypatch, tmp_path, tokenizer_dir):
    """A fake Tinker service, and TINKER_API_KEY set for it."""
    pytest.importorskip("tinker")
    from tests.backends.remote.fake_tinker import API_KEY, FakeTinker

    fake = FakeTinker(base_model=str(tokenizer_dir))
    install_transport(monkeypatch, fake)
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINKER_CREDENTIAL_CMD", raising=False)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    # `tinker.RestClient()` shares one session-less holder per process (tinker/lib/
    # internal_client_holder.py: sessionless_holder_cache); each test's fake needs its own.
    from tinker.lib.internal_client_holder import sessionless_holder_cache

    monkeypatch.setattr(sessionless_holder_cache, "_holders", {})
    yield fake
