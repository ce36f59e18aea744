"""No path of the trainer's machine visible to a call.

The attack is ``neutral_scenarios.ATTACK``: it searches sys.path, sys.prefix &
co., modules' files, code objects, /proc/self and its init's, the environment,
tracebacks and the call's memory for the trainer's checkout, virtual
environment, interpreter installation, home directory and host name. It runs
for a root and a non-root trainer (``trainers.py``), in a fork server and in
fresh mode; with the neutral-paths layer switched off the same attack finds
the paths, so the search itself is shown to see what it looks for.
"""

from __future__ import annotations

import pytest

from retool.sandbox.bench import _without

from . import neutral_scenarios
from .helpers import ROOT
from .trainers import scenario_results

MODULE = "neutral_scenarios"


@pytest.fixture(scope="module")
def results(trainer):
    return scenario_results(trainer, MODULE)


@pytest.mark.parametrize("mode", ["forked", "fresh"])
def test_a_call_finds_no_path_of_the_trainer(results, mode):
    facts = results[mode]
    assert "scenario_error" not in facts, facts
    if facts["level"] != "full":
        pytest.skip(f"no full isolation for this trainer here: {facts['missing']}")
    assert facts["ok"], (facts["error"], facts["stderr"])
    assert len(facts["needles"]) >= 2, facts["needles"]  # at least the checkout and host
    assert facts["hits"] == {}, facts["hits"]
    assert all(p.startswith("/opt/") for p in facts["sys_path"]), facts["sys_path"]
    assert facts["executable"].startswith("/opt/python/"), facts["executable"]
    assert any(line.startswith("neutral paths: ") for line in facts["layers"]), facts["layers"]
    if mode == "forked":  # the files are searched once, by the fork server's call
        assert facts["read"] > 1 << 20, facts["read"]  # it read what it searched
    if not (facts["trainer_prefix"] + "/").startswith("/usr/"):  # the OS's Python: no layer
        assert any(x.startswith("relocated files") for x in facts["layers"]), facts["layers"]


def _attack_without(layer: str) -> dict:
    """The attack against a root trainer's sandbox with ``layer`` switched off."""
    with _without(layer)(
        timeout=60, memory_mb=1024, max_workers=1, preload=("math",), max_output_bytes=65536
    ) as sandbox:
        facts = neutral_scenarios.attack(sandbox, files="first")
    if facts["level"] != "full":
        pytest.skip("no full isolation here")
    return facts


def _needle(where: str) -> int:
    """The needle number of a raw-memory hit: ``raw memory [heap] (needle 3)``."""
    return int(where.rsplit("(needle ", 1)[1].rstrip(")"))


@pytest.mark.skipif(not ROOT, reason="the comparison runs in the root trainer's process")
def test_without_the_layer_the_same_attack_finds_the_paths():
    facts = _attack_without("neutral")
    assert any("neutral paths" in line and "(disabled)" in line for line in facts["missing"])
    found = set(facts["hits"])
    for where in ("sys.path", "/proc/self/exe", "/proc/self/maps", "/proc/self/mountinfo"):
        assert where in found, sorted(found)
    # The instance's cgroup directories, last among the memory needles: the server
    # holds their host paths when it has no neutral layout to bind them into.
    first = len(facts["needles_in_bytes"]) - len(facts["cgroups"])
    cgroup_hits = [w for w in found if w.startswith("raw memory ") and _needle(w) >= first]
    assert cgroup_hits or not facts["cgroups"], sorted(found)


@pytest.mark.skipif(not ROOT, reason="the comparison runs in the root trainer's process")
def test_without_relocated_files_the_contents_and_memory_name_the_trainer():
    """The same attack with the relocated layers off: compiled files name the
    virtual environment, and the interpreter (its files, and so the server's memory
    every call inherits) names its installation; with them on, nothing does."""
    facts = _attack_without("relocate")
    assert any(line.startswith("relocated files") for line in facts["missing"]), facts["missing"]
    assert not any(line.startswith("relocated files") for line in facts["layers"])
    found = set(facts["hits"])
    assert any(where.startswith("file /opt/python/") for where in found), sorted(found)
    assert any(where.startswith("raw memory /opt/python/") for where in found), sorted(found)
    if any(p.startswith("/opt/site") for p in facts["sys_path"]):
        assert any(w.startswith("file /opt/site") and w.endswith(".pyc") for w in found)
