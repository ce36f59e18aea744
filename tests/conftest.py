"""Shared fixtures: the real SmolLM2 tokenizer, a local service and a tiny-random sampler."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smol_tokenizer():
    from retool.backends.local.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from retool.backends.local import LocalServiceClient

    return LocalServiceClient(checkpoint_root=tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def sampler(service):
    client = service.create_sampling_client(base_model="tiny-random")
    yield client
    client.close()
