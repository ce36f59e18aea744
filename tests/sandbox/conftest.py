import pytest

from retool.sandbox import LocalSandbox

from .helpers import ROOT
from .trainers import NonRootSandbox

SETTINGS = {"timeout": 3.0, "memory_mb": 512, "max_workers": 2, "max_output_bytes": 4096}


@pytest.fixture(scope="module")
def _own_sandbox():
    """The sandbox of this test process, the trainer as it is (root in CI)."""
    with LocalSandbox(**SETTINGS) as sb:
        yield sb


@pytest.fixture(scope="session")
def _nonroot_sandbox():
    """One for the session: its start (a nobody trainer importing numpy and sympy, its
    server preloading them) costs seconds, and calls share nothing anyway."""
    sandbox = NonRootSandbox(**SETTINGS)
    try:
        yield sandbox
    finally:
        sandbox.close()


@pytest.fixture(scope="module")
def sandbox(request):
    """This process's sandbox; with ``trainers.BOTH_TRAINERS``, a root's and a non-root's."""
    trainer = getattr(request, "param", "root" if ROOT else "nonroot")
    if trainer == "root" and not ROOT:
        pytest.skip("the root trainer needs a root test run")
    if trainer == "nonroot" and ROOT:
        return request.getfixturevalue("_nonroot_sandbox")
    return request.getfixturevalue("_own_sandbox")


@pytest.fixture(scope="module", params=["root", "nonroot"])
def trainer(request):
    """Which trainer runs the sandbox: ``root``, or ``nonroot`` (see ``trainers.py``)."""
    return request.param
