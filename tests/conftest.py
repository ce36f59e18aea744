"""Shared fixtures: the real SmolLM2 tokenizer, a local service and a tiny-random sampler."""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each of make test's workers gets one compute thread (and passes it on to
    # the commands it starts): make test's workers with two OpenMP threads each on a
    # 2-core machine spin against each other, and torch is not imported yet here.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The caches kept under ~/.cache (the sandbox's relocated layers, about 10 s to build for
# this venv; models converted from GGUF) stay put when a test points HOME at a temporary
# directory (the fake services, doctor, tracking): without this, each such test built
# them again, in every sandbox it started. Pinned before any test moves HOME; a test of
# the cache's location sets XDG_CACHE_HOME itself.
os.environ.setdefault("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))


SLOW_SECONDS = 20.0  # what a ``slow`` test without ``seconds=`` is taken to cost


def pytest_collection_modifyitems(config, items):
    """Files holding ``slow`` tests first, the costliest first (the sum of their tests'
    ``@pytest.mark.slow(seconds=...)``, measured under make test's workers; a module's
    ``pytestmark`` gives each test's share), so that
    with workers (``make test``: whole files per worker, handed out in collection
    order, ``--no-loadscope-reorder``) the longest files start at once instead of
    running alone at the end. (xdist's own order, by the number of tests in a file,
    put the files of two or three long tests last: on 2026-12-07 the suite's last
    seven minutes ran 3% of its tests.)"""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a serial run keeps pytest's order
    cost: dict[object, float] = {}
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker is not None:
            seconds = float(marker.kwargs.get("seconds", SLOW_SECONDS))
            cost[item.path] = cost.get(item.path, 0.0) + seconds
    items.sort(key=lambda item: -cost.get(item.path, 0.0))  # stable: order kept otherwise


@pytest.fixture(scope="session")
def smol_tokenizer():
    from retool.backends.local.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from retool.backends.local import LocalServiceClient

    # float32 on every host: the tests hold float32's contracts (test_dtype.py tests bf16)
    return LocalServiceClient(dtype="float32", checkpoint_root=tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def sampler(service):
    client = service.create_sampling_client(base_model="tiny-random")
    yield client
    client.close()
