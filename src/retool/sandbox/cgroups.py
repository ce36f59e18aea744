"""Per-instance and per-call cgroups: a call is killed whole and its memory is capped.

Each sandbox instance owns one cgroup per hierarchy it can write (the v2
hierarchy for ``cgroup.kill``, v1 ``memory`` and ``pids`` for limits), created
below the cgroup the server starts in; each call gets a child of each. Killing
the call's v2 cgroup kills every process in it whatever their parentage,
session or namespace, and killing the instance's kills every call at once.
The v1 memory controller charges kernel memory (slab, tmpfs, memfd) to the
same counter as user memory, so one limit covers all of it.

CPU (the v1 ``cpu`` controller): the instance's group has ``cpu.shares``
``INSTANCE_CPU_SHARES`` (one nice-0 process: when the trainer and calls compete
for a core, all calls together get at most half of it, never more than the
trainer, however many processes they run; a lower weight starved calls into
their timeouts on a loaded machine) and each
call's group at most ``CALL_CPUS`` CPUs (``cpu.cfs_quota_us``) at an equal
share among calls, whatever number of processes or sessions it starts (in a
cpu cgroup other than the root, sessions are no autogroups). Where the
controller is not writable, :func:`instance_group` says so and the call's
nice value, single session and ``RLIMIT_CPU`` are what bound it (see
``call._lower_priority``).

Trusted code only: used by the server, its handlers and the reaper, never by
a call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

_KEYS = ("v2", "memory", "pids", "cpu")
INSTANCE_CPU_SHARES = 1024  # all calls of an instance together weigh one nice-0 process
CALL_CPUS = 1  # CPUs one call may use at most (its processes and threads together)
_CFS_PERIOD_US = 100_000


# What a call lacks without each v1 controller (what ``missing`` says on a v2-only host).
_V2_ONLY = {
    "memory": "a call's memory is bounded by RLIMIT_AS only, tmpfs and kernel memory not at all",
    "pids": "a call's processes are bounded by RLIMIT_NPROC only (a uid of its own)",
    "cpu": "a call's CPU is bounded by its nice value, one session and RLIMIT_CPU",
}


def _mounts() -> dict[str, str]:
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            fields, info = left.split(), right.split()
            if len(fields) < 5 or len(info) < 3:
                continue
            fstype, options = info[0], info[2].split(",")
            if fstype == "cgroup2":
                found.setdefault("v2", fields[4])
            elif fstype == "cgroup":
                for key in ("memory", "pids", "cpu"):
                    if key in options:
                        found.setdefault(key, fields[4])
    return found


def _own_paths() -> dict[str, str]:
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and not controllers:
                own["v2"] = path
            for key in ("memory", "pids", "cpu"):
                if key in controllers.split(","):
                    own[key] = path
    return own


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _procs(directory: str) -> list[int]:
    try:
        with open(os.path.join(directory, "cgroup.procs")) as handle:
            return [int(line) for line in handle if line.strip()]
    except OSError:
        return []


class Group:
    """One cgroup in each hierarchy we could write (any may be missing)."""

    def __init__(self, dirs: dict[str, str]) -> None:
        self.dirs = dirs

    @property
    def killable(self) -> bool:
        return "v2" in self.dirs

    def child(self, name: str, memory_bytes: int | None, max_procs: int | None) -> Group:
        """Create a child group with the given limits (raises OSError on failure)."""
        dirs = {key: os.path.join(parent, name) for key, parent in self.dirs.items()}
        for directory in dirs.values():
            os.mkdir(directory)
        group = Group(dirs)
        if max_procs is not None and "pids" in dirs:
            _write(os.path.join(dirs["pids"], "pids.max"), str(max_procs))
        if memory_bytes is not None:
            group.set_memory(memory_bytes)
        if "cpu" in dirs:
            _write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), str(_CFS_PERIOD_US))
            _write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(CALL_CPUS * _CFS_PERIOD_US))
        return group

    @property
    def cpu_bounded(self) -> bool:
        """Whether calls' CPU is bounded by a cgroup (shares and quota)."""
        return "cpu" in self.dirs

    def set_memory(self, memory_bytes: int) -> None:
        if "memory" in self.dirs:
            _write(os.path.join(self.dirs["memory"], "memory.limit_in_bytes"), str(memory_bytes))

    def enter(self, pid: int = 0) -> None:
        """Move ``pid`` (0: the caller) into every hierarchy of this group."""
        for directory in self.dirs.values():
            _write(os.path.join(directory, "cgroup.procs"), str(pid))

    def kill(self) -> None:
        """SIGKILL every process in the group and its descendants."""
        if "v2" in self.dirs:
            with contextlib.suppress(OSError):
                _write(os.path.join(self.dirs["v2"], "cgroup.kill"), "1")
                return
        for _ in range(5):  # v1 fallback: racy against forks, bounded by pids.max
            found = False
            for directory in self.dirs.values():
                for root, _subdirs, _files in os.walk(directory, topdown=False):
                    for pid in _procs(root):
                        found = True
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
            if not found:
                return

    def populated(self) -> bool:
        if "v2" in self.dirs:
            try:
                with open(os.path.join(self.dirs["v2"], "cgroup.events")) as handle:
                    for line in handle:
                        if line.startswith("populated "):
                            return line.split()[1] != "0"
            except OSError:
                return False
        return any(
            _procs(root)
            for directory in self.dirs.values()
            for root, _subdirs, _files in os.walk(directory)
        )

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of this group (memory limit hit)."""
        if "memory" not in self.dirs:
            return False
        try:
            with open(os.path.join(self.dirs["memory"], "memory.oom_control")) as handle:
                for line in handle:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1]) > 0
        except (OSError, ValueError):
            return False
        return False

    def remove(self) -> bool:
        """rmdir the group and its descendants; False if some are still busy."""
        done = True
        for directory in self.dirs.values():
            for root, _subdirs, _files in os.walk(directory, topdown=False):
                try:
                    os.rmdir(root)
                except FileNotFoundError:
                    continue
                except OSError:
                    done = False
        return done

    def kill_and_remove(self, within: float = 2.0) -> bool:
        deadline = time.monotonic() + within
        while True:
            self.kill()
            if not self.populated() and self.remove():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def instance_group(name: str, skip: tuple[str, ...] = ()) -> tuple[Group | None, list[str]]:
    """Create this instance's group below the caller's own cgroups.

    Returns the group (None if no hierarchy is writable) and what
    is missing. ``skip``: hierarchies left out (for measuring their cost).
    """
    missing: list[str] = []
    dirs: dict[str, str] = {}
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        return None, [f"cgroups ({exc.strerror})"]
    for key in _KEYS:
        if key in skip:
            missing.append(f"cgroup {key} (disabled)")
            continue
        if key not in mounts or key not in own:
            if key != "v2" and "v2" in mounts:  # a cgroup-v2-only host
                missing.append(
                    f"cgroup {key} (no v1 {key} hierarchy; its v2 controller is not used: "
                    + _V2_ONLY[key]
                    + ")"
                )
            else:
                missing.append(f"cgroup {key} hierarchy (not mounted)")
            continue
        directory = os.path.join(mounts[key] + own[key], name)
        try:
            os.mkdir(directory, 0o755)
        except OSError as exc:
            missing.append(f"cgroup {key} ({exc.strerror})")
            continue
        if key == "cpu":
            try:
                _write(os.path.join(directory, "cpu.shares"), str(INSTANCE_CPU_SHARES))
            except OSError as exc:
                os.rmdir(directory)
                missing.append(f"cgroup cpu ({exc.strerror})")
                continue
        dirs[key] = directory
    if not dirs:
        return None, missing
    return Group(dirs), missing
