"""A call learns neither the host's uptime nor its process count.

CLOCK_BOOTTIME and CLOCK_MONOTONIC count from the host's boot: a time namespace
per call restarts both near 0 (and ``sysinfo``'s uptime with them).
``sysinfo`` also reports the host's process count, load averages and free
memory: seccomp refuses it (EPERM). Runs for a root and a non-root trainer
(``trainers.py``; the facts come from ``neutral_scenarios.clocks``). On a host
with only cgroup v2, ``missing`` names each v1 controller the sandbox uses for
limits (memory, pids, cpu), says its v2 controller is not used, and what bounds
a call instead.
"""

from __future__ import annotations

import pytest

from retool.sandbox import cgroups

from .trainers import scenario_results


def test_the_call_sees_neither_host_uptime_nor_sysinfo(trainer):
    facts = scenario_results(trainer, "neutral_scenarios")["clocks"]
    assert facts["ok"], facts
    if facts["level"] != "full":
        pytest.skip("no namespaces for this trainer here")
    if facts["host_uptime"] < 300:
        pytest.skip("the host booted too recently to tell its clocks from a call's")
    # A prepared call waits for its code at most a few calls' time; the host has
    # been up for at least 300 s.
    assert facts["boottime"] < 120 and facts["monotonic"] < 120, facts
    assert facts["sysinfo"] == [-1, "EPERM"], facts


def test_a_cgroup_v2_only_host_reports_the_v1_hierarchies_missing(tmp_path, monkeypatch):
    v2 = tmp_path / "unified"
    v2.mkdir()
    monkeypatch.setattr(cgroups, "_mounts", lambda: {"v2": str(v2)})
    monkeypatch.setattr(cgroups, "_own_paths", lambda: {"v2": "/"})
    group, missing = cgroups.instance_group("retool-sandbox-test")
    assert group is not None and set(group.dirs) == {"v2"}
    assert group.killable  # cgroup.kill: the call is still killed whole
    names = [line.split(" (")[0] for line in missing]
    assert names == ["cgroup memory", "cgroup pids", "cgroup cpu"], missing
    for key, line in zip(("memory", "pids", "cpu"), missing, strict=True):
        assert f"no v1 {key} hierarchy; its v2 controller is not used" in line, line
    assert "RLIMIT_AS" in missing[0] and "RLIMIT_NPROC" in missing[1], missing
