"""What isolates a call here, one line per layer: what ``retool sandbox check`` shows.

The server sends these lines in its ready line once it knows its level (beside
``missing``, what it could not set up), so that ``check`` shows what holds on
this machine rather than what the code could do. ``CALL_LAYERS`` also names
the per-call layers that ``--disable`` leaves out, one at a time, to measure
what each costs (``bench.py``).
"""

from __future__ import annotations

import os
from typing import Any

from . import cgroups
from .call import CALL_NICE, FULL
from .neutral import NEUTRAL_CALLS_DIR
from .rootfs import HOSTNAME, PROC_MASKS

NEUTRAL_LAYER = (
    "neutral paths: the interpreter at /opt/python, the runtime at /opt/runtime, "
    "site-packages at /opt/site (sys.path, __file__, /proc/self/exe, maps and "
    "mountinfo name no directory of the trainer's machine)"
)
RELOCATED_LAYER = (
    "relocated files: compiled files, build configuration and RUNPATHs rewritten for "
    "the neutral paths, the interpreter's own site-packages hidden (contents name no "
    "directory of the trainer's machine)"
)

# The per-call layers ``--disable`` can leave out one by one (benchmarks only), by name.
CALL_LAYERS = {
    "netns": "a network namespace per call (no socket names, pairs or ports shared)",
    "cgroupns": "a cgroup namespace per call (/proc/self/cgroup shows /)",
    "etc": "a minimal /etc (loader cache, time zone, a passwd naming no host user)",
    "timens": "a time namespace per call (monotonic and boot-time clocks, and sysinfo's "
    "uptime, start near 0: no host uptime)",
    "procmask": "host facts in /proc masked (" + ", ".join(p[6:] for p in PROC_MASKS) + ")",
}


def call_layers(
    level: str,
    off: frozenset[str] = frozenset(),
    *,
    real_root: bool = True,
    use_seccomp: bool = True,
    cgroup: bool = True,
    landlock_abi: int = 0,
    neutral: bool = False,
) -> list[str]:
    """What isolates each call at ``level``, one line per layer (``retool sandbox check``)."""
    common = [
        "an empty environment, its own working directory, no trainer module importable",
        "a uid of its own per call" if real_root else "every capability dropped",
        "no_new_privs; rlimits (address space, file size, open files, CPU)",
    ]
    if use_seccomp:
        common.append(
            "seccomp filter (namespaces, mounts, keyrings, bpf, ptrace, non-INET sockets, sysinfo, "
            "fallocate flags)"
        )
    if cgroup:
        common.append("a cgroup per call (memory, processes, killed whole after the call)")
    if level != FULL:
        return common + ([f"Landlock (ABI {landlock_abi})"] if landlock_abi else [])
    layers = [
        *common,
        "PID namespace per call (its init reports the exit status)",
        "mount namespace per call: read-only root of the OS, the interpreter and "
        "site-packages; private /tmp and /dev/shm; fresh /proc; five /dev nodes",
        f"IPC namespace per call; UTS namespace per call (host name {HOSTNAME!r})",
        "install metadata naming the checkout masked (.pth, __editable__, direct_url.json)",
        "the server's arguments hidden from /proc/<pid>/cmdline; output files opened "
        f"through {NEUTRAL_CALLS_DIR} (so /proc/self/fd names no host directory)",
    ]
    layers += [text for name, text in CALL_LAYERS.items() if name not in off]
    return layers + ([NEUTRAL_LAYER] if neutral else [])


def relocated_layer(facts: dict[str, Any]) -> str:
    """The layer's line for ``retool sandbox check``, with what the refresh did."""
    line = f"{RELOCATED_LAYER}; {facts['files']} other files rewritten"
    if facts.get("rewritten"):
        line += f"; this start rewrote {facts['rewritten']} (cached for the next)"
    return line


def supervision_layers(group: cgroups.Group | None, level: str, real_root: bool) -> list[str]:
    """What holds the call's CPU, init, helpers and verdicts here (for ``check``)."""
    nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + CALL_NICE)
    if group is not None and group.cpu_bounded:
        cpu = (
            f"cpu: cgroup (all calls weigh one nice-0 process, cpu.shares "
            f"{cgroups.INSTANCE_CPU_SHARES}; each call at most {cgroups.CALL_CPUS} CPU); "
            f"SCHED_OTHER, nice {nice}"
        )
    else:
        cpu = (
            f"cpu: fallback (no cpu cgroup): SCHED_OTHER, nice {nice}, all calls in the "
            "server's session (one autogroup, one nice-0 process's weight), RLIMIT_CPU, "
            "the process cap"
        )
    if level == FULL:
        reach = "PID 1 of its namespace (no signal from the call)"
    elif real_root:
        reach = "another uid than its call"
    else:
        reach = "Landlock's signal scope"
    return [
        cpu,
        f"init: non-dumpable (no /proc/<pid>/fd or mem for the call), {reach}",
        "helpers: the address-space pin starts after every limit, with stdio only",
        "verdicts: timeout, memory and output only from the timer, the OOM counter "
        "and the output's allocated size",
    ]
