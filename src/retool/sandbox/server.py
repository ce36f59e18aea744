"""The fork server: a clean interpreter that forks one isolated child per call.

Process tree, and why each level exists::

    trainer (LocalSandbox)        holds secrets; never forks model code; holds the
    │                             only write end of the server's stdin (the lifeline)
    └─ server                     ``python -I -S``, empty environment, its own cwd,
       │                          only explicit import paths; imports ``preload``
       │                          once; owns an empty network namespace
       ├─ reaper                  waits for the lifeline (or the server) to end, then
       │                          kills the instance's cgroup whole and removes it
       └─ zygote (per connection)  forks calls; never receives a request or a result,
          │                        so calls cannot find earlier calls' data in memory
          ├─ handler               serves the connection; runs the calls the zygote
          │                        prepared; the supervisor's timer and facts live here
          └─ B: PID 1 (per call)   cloned into a new PID namespace; trusted init:
             │                     new mount/IPC/UTS namespaces, the call's cgroup, a
             │                     fresh keyring, a bubblewrap-style root; reports C's
             │                     wait status on a pipe only B holds
             └─ C: the call        unprivileged uid (or no capabilities), pdeathsig,
                                   no_new_privs, seccomp, rlimits; then runs the code

B and C are forked *before* the code arrives (two per handler), so
namespace, cgroup and mount set-up are off the critical path. When the call
ends or times out, the handler kills its cgroup (every process, whatever its
parentage) and B's PID namespace goes with B. Nothing the call can write is
read as a fact: the exit status is C's wait status as B saw it, "did the code
start" is one byte C sends B before running any code and then closes, memory
kills come from the cgroup's OOM counter, timeouts from the handler's timer.
stdout/stderr go to files, never pipes, and only the tail is read.

Without namespaces (some containers) the same tree runs with rlimits, seccomp,
Landlock (read-only OS paths, writes only in the scratch dir), an empty
environment, a scratch cwd, a dedicated uid when root, and the call's cgroup
(or process group and uid) killed after each call: the ``basic`` level.

One module a job: ``wire`` (the framing between trainer and server),
``rootfs`` (a call's root), ``call`` (B and C), ``zygote``, ``handler``,
``neutral`` (the neutral paths), ``uids`` (a root server's uid blocks),
``layers`` (what ``retool sandbox check`` shows), ``boot`` (the lines that
start an interpreter in the copy). This one starts the server (the reaper,
its namespaces, the re-exec at neutral paths, the probe of the level) and
serves connections. All of them are copied into the server's runtime package
(``runtime_copy.RUNTIME_MODULES``) and import nothing else of ours.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import sys
from typing import Any

from . import call, cgroups, landlock, linux, seccomp
from .boot import SERVER_BOOT
from .call import BASIC, FULL, close_all_except
from .handler import STOP, Handler
from .layers import (
    CALL_LAYERS,
    NEUTRAL_LAYER,
    RELOCATED_LAYER,
    call_layers,
    relocated_layer,
    supervision_layers,
)
from .neutral import NEUTRAL_CGROUP, neutral_calls_dir, neutral_layout
from .uids import UID_BLOCK, claim_uid_block, kill_uids
from .wire import unix_socket_path, write_all
from .zygote import Prepared, Zygote


def enter_server_namespaces() -> list[str]:
    """Give the server an empty network namespace; returns what is missing."""
    missing: list[str] = []
    try:
        if os.geteuid() == 0:
            linux.unshare(linux.CLONE_NEWNET)
        else:
            uid, gid = os.geteuid(), os.getegid()
            linux.unshare(linux.CLONE_NEWUSER | linux.CLONE_NEWNET)
            with open("/proc/self/setgroups", "w") as handle:
                handle.write("deny")
            with open("/proc/self/uid_map", "w") as handle:
                handle.write(f"0 {uid} 1")
            with open("/proc/self/gid_map", "w") as handle:
                handle.write(f"0 {gid} 1")
    except OSError as exc:
        missing.append(f"user/network namespaces ({exc.strerror})")
    return missing


def _world_reachable(path: str) -> bool:
    """Whether every directory above ``path`` may be searched by any uid."""
    path = os.path.realpath(path)
    while path != "/":
        path = os.path.dirname(path)
        try:
            if not os.stat(path).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _run_reaper(
    group: cgroups.Group | None,
    server_pid: int,
    alive_r: int,
    workdir: str,
    trainer_pidfd: int | None,
    uids: tuple[int, int] | None = None,
    held: tuple[int, ...] = (),
) -> None:
    """The reaper: once the trainer (lifeline, fd 0) or the server is gone, kill the
    instance's cgroup whole (every call, daemons included), remove it and the
    server's directory. Without a killable cgroup, a root server's calls are
    found by their uids (``uids``: this instance's block, whose lock it keeps
    until then). It keeps the ``held`` descriptors open until it exits: the
    client's "gone" pipe (its proof that all of it is over) and the uid lock."""
    try:
        watched = [0, alive_r] + ([] if trainer_pidfd is None else [trainer_pidfd])
        close_all_except(*watched, *held)
        with contextlib.suppress(OSError):
            os.setsid()
        while True:
            readable = select.select(watched, [], [])[0]
            if trainer_pidfd in readable:  # the trainer exited (even if a child of
                break  # its own still holds the lifeline's write end)
            if any(not os.read(fd, 4096) for fd in readable):
                break
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server_pid, signal.SIGKILL)
        if group is not None:
            group.kill_and_remove(within=5.0)
        if uids is not None and (group is None or not group.killable):
            kill_uids(*uids)
        shutil.rmtree(workdir, ignore_errors=True)
    finally:
        os._exit(0)


def probe_full(
    workdir: str,
    real_root: bool,
    uid_base: int,
    boot_path: str,
    use_seccomp: bool,
    off: frozenset[str] = frozenset(),
    calls_dir: str | None = None,
) -> str | None:
    """Run one call at the full level; the error text if it does not work."""
    zygote = Zygote(
        0,
        FULL,
        workdir,
        False,
        real_root,
        uid_base,
        None,
        256,
        boot_path,
        use_seccomp,
        off=off,
        calls_dir=calls_dir,
    )
    left, right = socket.socketpair()
    handler = Handler(left, right, FULL)
    try:
        info, fds = zygote.prepare()
        code_w, done_r, pidfd = fds
        prepared = Prepared(
            info["pid_b"],
            code_w,
            done_r,
            pidfd,
            info["out_path"],
            info["err_path"],
            None,
            None,
            None,
        )
        reply = handler.run(
            prepared,
            {"code": "print(6 * 7)", "timeout": 20, "memory_mb": 256, "max_output_bytes": 4096},
        )
        handler._finished.put(STOP)
        handler._clean()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info["pid_b"], 0)
    except (OSError, RuntimeError) as exc:
        return str(exc)
    finally:
        left.close()
        right.close()
    if reply["stdout"].strip() != "42":
        return (reply["stderr"].strip().splitlines() or ["no output"])[-1]
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="retool.sandbox.server")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--isolation", default="auto", choices=["auto", "strict", "none"])
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--boot-path", default="")
    parser.add_argument("--disable", default="", help="layers off, for benchmarks only")
    parser.add_argument("--gone-fd", type=int, default=-1, help="held open until all is gone")
    parser.add_argument("--resume", default="", help="state after the neutral re-exec")
    parser.add_argument("--layer-cache", default="", help="where relocated layers are kept")
    args = parser.parse_args(argv)
    disabled = set(filter(None, args.disable.split(",")))
    # Calls are forked from here: none of them may read our arguments (the work
    # directory, the import path) from /proc/<pid>/cmdline.
    linux.hide_command_line("retool-sandbox")
    sys.orig_argv[:] = sys.argv[:] = ["retool-sandbox"]  # Python's own copies too
    state = json.loads(args.resume) if args.resume else _host_side(args, disabled)
    _serve(args, disabled, state)


def _host_side(args: argparse.Namespace, disabled: set[str]) -> dict[str, Any]:
    """Everything done before the server leaves the host's view: the reaper, the
    cgroup, the namespaces; then the re-exec at neutral paths (which does not
    return) where possible. The state the rest of ``main`` needs."""
    workdir = args.dir
    os.makedirs(os.path.join(workdir, "root"), exist_ok=True)
    os.makedirs(os.path.join(workdir, "calls"), mode=0o711, exist_ok=True)
    os.makedirs(os.path.join(workdir, "sock"), mode=0o700, exist_ok=True)
    real_root = os.geteuid() == 0
    missing: list[str] = []
    uid_base, _uid_lock = claim_uid_block(workdir) if real_root else (0, None)
    group, group_missing = cgroups.instance_group(
        f"retool-sandbox-{os.getpid()}", skip=("cpu",) if "cpu" in disabled else ()
    )
    if "cgroups" in disabled and group is not None:
        group.remove()
        group, group_missing = None, ["disabled"]
    if group is None or not group.killable:
        missing.append("a cgroup per call (" + "; ".join(group_missing) + ")")
    elif group_missing:
        missing.extend(group_missing)
    # The trainer's copy of where the instance's cgroup is (to kill it if the server
    # dies), sent now: after the neutral re-exec the server holds only /opt/cgroup paths.
    write_all(1, (json.dumps({"cgroup": None if group is None else group.dirs}) + "\n").encode())
    trainer_pidfd = None
    with contextlib.suppress(OSError):
        trainer_pidfd = os.pidfd_open(os.getppid())
    alive_r, alive_w = os.pipe()
    server_pid = os.getpid()
    uids = (uid_base, uid_base + UID_BLOCK) if real_root else None
    held = tuple(fd for fd in (args.gone_fd, _uid_lock) if fd is not None and fd >= 0)
    if os.fork() == 0:
        _run_reaper(group, server_pid, alive_r, workdir, trainer_pidfd, uids, held)
    os.close(alive_r)
    if args.gone_fd >= 0:
        os.close(args.gone_fd)  # the reaper's now: EOF for the client once it has exited
    if trainer_pidfd is not None:
        os.close(trainer_pidfd)
    if group is not None:
        with contextlib.suppress(OSError):
            cgroups.Group({k: v for k, v in group.dirs.items() if k == "v2"}).enter()
    state: dict[str, Any] = {
        "real_root": real_root,
        "uid_base": uid_base,
        "group": None if group is None else group.dirs,
        "alive_w": alive_w,
        "missing": missing,
        "namespaces": False,
        "calls_dir": None,
        "boot_path": args.boot_path,
        "neutral": False,
    }
    if args.isolation == "none":
        missing.append("namespaces (disabled: isolation='none')")
        return state
    ns_missing = enter_server_namespaces()
    missing += ns_missing
    if ns_missing:
        return state
    state["namespaces"] = True
    state["calls_dir"] = neutral_calls_dir(args.dir)
    if state["calls_dir"] is None or "neutral" in disabled:
        why = "disabled" if "neutral" in disabled else "no mount namespace for the server"
        missing.append(f"{NEUTRAL_LAYER} ({why})")
        return state
    try:
        executable, boot_path, libs, work, relocated = neutral_layout(
            args.dir,
            args.boot_path,
            userxattr=not (real_root and linux.initial_user_namespace()),
            relocated="relocate" not in disabled,
            cache=args.layer_cache or None,
            cgroup_dirs=None if group is None else group.dirs,
        )
    except OSError as exc:
        missing.append(f"{NEUTRAL_LAYER} ({exc.strerror or exc})")
        return state
    state.update(neutral=True, boot_path=boot_path, relocated=relocated)
    if group is not None:
        state["group"] = {key: f"{NEUTRAL_CGROUP}/{key}" for key in group.dirs}
    os.set_inheritable(alive_w, True)  # the reaper's sign that the server is alive
    argv = [executable, "-I", "-S", "-B", "-c", SERVER_BOOT, boot_path]
    argv += ["--dir", work, "--preload", args.preload, "--isolation", args.isolation]
    argv += ["--memory-mb", str(args.memory_mb), "--boot-path", boot_path]
    argv += ["--disable", args.disable, "--resume", json.dumps(state)]
    os.execve(executable, argv, {**os.environ, "LD_LIBRARY_PATH": libs})
    raise AssertionError("unreachable")  # pragma: no cover


def _serve(args: argparse.Namespace, disabled: set[str], state: dict[str, Any]) -> None:
    """Probe the level, preload, report ready, and serve connections forever."""
    workdir = args.dir
    real_root, uid_base = bool(state["real_root"]), int(state["uid_base"])
    missing: list[str] = list(state["missing"])
    alive_w = int(state["alive_w"])
    os.set_inheritable(alive_w, False)
    off = frozenset(disabled & set(CALL_LAYERS))
    call.PIN = "pin" not in disabled
    group = None if state["group"] is None else cgroups.Group(state["group"])
    use_seccomp = "seccomp" not in disabled
    try:
        seccomp.build_program()
    except OSError as exc:
        missing.append(f"seccomp ({exc.strerror})")
        use_seccomp = False
    if "seccomp" in disabled:
        missing.append("seccomp (disabled)")
    level = BASIC
    calls_dir: str | None = state["calls_dir"]  # None: the host path
    if state["namespaces"]:
        error = probe_full(
            workdir, real_root, uid_base, state["boot_path"], use_seccomp, off, calls_dir
        )
        if error is None:
            level = FULL
        else:
            calls_dir = None
            missing.append(f"per-call mount/PID namespaces ({error})")
    args.boot_path = state["boot_path"]
    if not real_root and level == BASIC:
        missing.append("a dedicated uid (the server is not root, so calls share its uid)")
    if real_root and level == BASIC and not _world_reachable(sys.base_prefix):
        missing.append(
            f"an interpreter the sandbox uids can reach ({sys.base_prefix} is below a "
            "private directory: fresh mode and lazy standard-library imports fail)"
        )
    landlock_abi = landlock.abi_version() if "landlock" not in disabled else 0
    if level == BASIC and landlock_abi == 0:
        missing.append("Landlock (the call sees the host filesystem as its uid may)")
    if level == BASIC and not real_root and landlock_abi < 6:
        missing.append(
            "the call's init out of its reach (a non-root trainer's call shares its uid "
            "and can signal it without Landlock's signal scope, ABI 6)"
        )
    layers = supervision_layers(group, level, real_root)
    preloaded: list[str] = []
    fresh = True
    for name in filter(None, args.preload.split(",")):
        try:
            importlib.import_module(name)
            preloaded.append(name)
            fresh = False
        except Exception as exc:
            missing.append(f"preload {name} ({type(exc).__name__})")
    # What every call touches: import it once here, not once per call.
    for name in ("random", "traceback", *(["numpy.random"] if "numpy" in preloaded else [])):
        importlib.import_module(name)
    importlib.import_module(__package__ + ".autoprint")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with unix_socket_path(os.path.join(workdir, "sock", "server.sock")) as sock_path:
        listener.bind(sock_path)
        os.chmod(sock_path, 0o600)
    listener.listen(64)
    if level == FULL:
        missing += [f"{CALL_LAYERS[name]} (disabled)" for name in sorted(off)]
    call_layer_list = call_layers(
        level,
        off,
        real_root=real_root,
        use_seccomp=use_seccomp,
        cgroup=group is not None and group.killable,
        landlock_abi=landlock_abi,
        neutral=level == FULL and bool(state["neutral"]),
    )
    relocated = state.get("relocated") or {}
    if level == FULL and state["neutral"]:
        if "error" in relocated:
            missing.append(f"{RELOCATED_LAYER} ({relocated['error']})")
        else:
            call_layer_list.append(relocated_layer(relocated))
            if relocated.get("kept"):
                missing.append(
                    f"{RELOCATED_LAYER}, in part ({relocated['kept']} files still name a host "
                    "path: a prefix shorter than its neutral path, or a spelling not moved)"
                )
    ready = {
        "level": level,
        "layers": [*call_layer_list, *layers],  # then CPU, init, helpers, verdicts
        "missing": missing,
        "preloaded": preloaded,
        "pid": os.getpid(),
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):  # the reaper holds the lifeline; nobody below needs either
        os.dup2(null, fd)
    os.close(null)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # zygotes are reaped automatically
    index = 0
    while True:
        conn, _ = listener.accept()
        index += 1
        if os.fork() == 0:
            listener.close()
            os.close(alive_w)
            linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
            # SEQPACKET: one message per prepared call, never two run together.
            zygote_side, handler_side = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                if os.fork() == 0:  # the handler
                    zygote_side.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
                    try:
                        Handler(conn, handler_side, level).serve()
                    finally:
                        os._exit(0)
                conn.close()
                handler_side.close()
                Zygote(
                    index,
                    level,
                    workdir,
                    fresh,
                    real_root,
                    uid_base,
                    group,
                    args.memory_mb,
                    args.boot_path,
                    use_seccomp,
                    landlock_abi,
                    off,
                    calls_dir,
                ).serve(zygote_side)
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    main()
