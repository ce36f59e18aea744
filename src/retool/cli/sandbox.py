"""``retool sandbox``: run one snippet, check isolation, benchmark."""

from __future__ import annotations

import argparse
import json
import sys

from retool.errors import ConfigError
from retool.protocol.sanitize import escape_control


def _say(text: str, end: str = "\n") -> None:
    """Print to the terminal with control characters escaped (no ESC/CR tricks)."""
    print(escape_control(text), end=end)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sandbox",
        help="run code in the sandbox, check, benchmark",
        description="The isolated Python executor used for tool calls.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    run = verbs.add_parser(
        "exec",
        help="run one snippet (a file, or - for stdin)",
        description="Run one Python snippet in the sandbox and print what "
        "the model would see (or the full result with --json).",
    )
    run.add_argument("file", nargs="?", default="-", help="a .py file, or - for stdin")
    run.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    run.add_argument("--memory-mb", type=int, default=1024, help="memory cap (default 1024)")
    run.add_argument("--isolation", default="auto", choices=["auto", "strict", "none"])
    run.add_argument("--json", action="store_true", help="print the ExecResult as JSON")
    run.set_defaults(handler=_exec)

    check = verbs.add_parser(
        "check",
        help="show the isolation level reached here",
        description="Start the sandbox and report its isolation level and "
        "what is missing for full isolation.",
    )
    check.add_argument("--isolation", default="auto", choices=["auto", "strict", "none"])
    check.set_defaults(handler=_check)

    bench = verbs.add_parser(
        "bench",
        help="latency/throughput against fresh python -c",
        description="Time snippets under fresh `python -c` and the sandbox.",
    )
    bench.add_argument("--n", type=int, default=30, help="calls per measurement (default 30)")
    bench.add_argument("--workers", type=int, default=2, help="parallel workers (default 2)")
    bench.set_defaults(handler=_bench)


def _exec(args: argparse.Namespace) -> int:
    from retool.sandbox import LocalSandbox, format_tool_content

    if args.file == "-":
        code = sys.stdin.read()
    else:
        try:
            with open(args.file, encoding="utf-8") as handle:
                code = handle.read()
        except OSError as exc:
            raise ConfigError(f"{args.file}: cannot read ({exc.strerror})") from None
    with LocalSandbox(
        timeout=args.timeout, memory_mb=args.memory_mb, max_workers=1, isolation=args.isolation
    ) as sandbox:
        result = sandbox.run(code)
    if args.json:
        print(json.dumps(result.to_dict()))  # json.dumps escapes control characters
    else:
        _say(format_tool_content(result, args.timeout), end="")
    return 0 if result.ok else 1


def _check(args: argparse.Namespace) -> int:
    from retool.sandbox import IsolationLevel, LocalSandbox

    with LocalSandbox(max_workers=1, isolation=args.isolation) as sandbox:
        level = sandbox.isolation_level
        degraded = sandbox.degraded
        probe = sandbox.run(
            "import socket, os\ntry:\n    socket.create_connection(('1.1.1.1', 80),"
            " timeout=1)\n    print('network: reachable')\nexcept OSError:\n"
            "    print('network: none')\nprint('uid:', os.getuid())"
        )
    _say(f"isolation level: {level}")
    _say(f"preloaded: {', '.join(sandbox.preloaded) or 'nothing (fresh interpreter per call)'}")
    for line in probe.stdout.strip().splitlines():
        _say(f"probe {line}")
    if level == IsolationLevel.FULL:
        _say(
            "full isolation: mount, PID, IPC, UTS and network namespaces; read-only root; "
            "private /tmp and /dev/shm; unprivileged uid or no capabilities; no_new_privs; "
            "seccomp; a cgroup per call (memory, processes, kill); rlimits"
        )
    for item in sandbox.missing:
        _say(f"missing: {item}")
    if degraded:
        _say("degraded: calls run without some isolation layers (see missing)")
    return 0 if level == IsolationLevel.FULL else 1


def _bench(args: argparse.Namespace) -> int:
    from retool.sandbox.bench import run_bench

    if args.n <= 0 or args.workers <= 0:
        raise ConfigError("--n and --workers must be >= 1")
    run_bench(n=args.n, workers=args.workers)
    return 0
