import pytest

from retool.sandbox import LocalSandbox


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(timeout=3.0, memory_mb=512, max_workers=2, max_output_bytes=4096) as sb:
        yield sb


@pytest.fixture(scope="module", params=["root", "nonroot"])
def trainer(request):
    """Which trainer runs the sandbox: ``root``, or ``nonroot`` (see ``trainers.py``)."""
    return request.param
