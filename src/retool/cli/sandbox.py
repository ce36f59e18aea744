"""``retool sandbox``: run one snippet, check isolation, benchmark.

Input is checked before the sandbox starts: the code is read in one bounded
read (``MAX_CODE_BYTES`` + 1 bytes, so a gigabyte on stdin costs nothing), must
be UTF-8 text without NUL bytes (the error names the file or stdin, the line
and the byte offset), and every number option is finite and in its range.

Ctrl-C and SIGTERM stop a command cleanly: the first one raises inside the
command (later ones only wait), the sandbox is closed (its calls, their
daemons, its server and its temporary directory are gone when ``close()``
returns), one line is printed and the exit status is 128 + the signal (130,
143).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable

from retool.checks import check_number
from retool.cli.common import add_number
from retool.errors import ConfigError
from retool.interrupts import StopOnce
from retool.protocol.sanitize import escape_control
from retool.sandbox import IsolationLevel, LocalSandbox, format_tool_content
from retool.sandbox.bench import run_bench
from retool.sandbox.limits import MAX_CODE_BYTES, MAX_TIMEOUT_S, MEMORY_MB_RANGE
from retool.sandbox.local import close_all

_UTF8_BOM = b"\xef\xbb\xbf"
_MAX_BENCH_N = 10_000
_MAX_BENCH_WORKERS = 64
_ISOLATION_HELP = (
    "auto: the strongest this machine allows; strict: refuse to run below full "
    "isolation; none: no namespaces (the basic level) (default: auto)"
)


def _say(text: str, end: str = "\n") -> None:
    """Print to the terminal with control characters escaped (no ESC/CR tricks).

    Flushed at once: a bench or check line is progress a reader (or a pipe) waits for.
    """
    print(escape_control(text), end=end, flush=True)


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
        description="Run one Python snippet in the sandbox and print what the model would "
        f"see (or the full result with --json). The code must be UTF-8 text of at most "
        f"{MAX_CODE_BYTES} bytes. Exit status: 0 if the snippet succeeded, 1 if it failed, "
        "2 for bad input, 130/143 when stopped by Ctrl-C/SIGTERM (the snippet and every "
        "process it started are killed first).",
    )
    run.add_argument(
        "file",
        nargs="?",
        default="-",
        help="a Python file, or - to read the code from stdin (default: -)",
    )
    add_number(
        run,
        "--timeout",
        low=0,
        high=MAX_TIMEOUT_S,
        low_open=True,
        integer=False,
        default=10.0,
        metavar="SECONDS",
        help="wall-clock limit of the snippet; at the limit it and every process it started "
        "are killed",
    )
    add_number(
        run,
        "--memory-mb",
        low=MEMORY_MB_RANGE[0],
        high=MEMORY_MB_RANGE[1],
        default=1024,
        metavar="MIB",
        help="memory the snippet may allocate on top of the preloaded interpreter (about "
        "140 MiB of address space with numpy and sympy): headroom, not a cap on the "
        "process's total",
    )
    run.add_argument(
        "--isolation", default="auto", choices=["auto", "strict", "none"], help=_ISOLATION_HELP
    )
    run.add_argument(
        "--json", action="store_true", help="print the whole ExecResult as JSON (default: off)"
    )
    run.set_defaults(handler=_exec)

    check = verbs.add_parser(
        "check",
        help="show the isolation level reached here",
        description="Start the sandbox and report its isolation level and "
        "what is missing for full isolation. Exit status 0 at full isolation, 1 below it.",
    )
    check.add_argument(
        "--isolation", default="auto", choices=["auto", "strict", "none"], help=_ISOLATION_HELP
    )
    check.set_defaults(handler=_check)

    bench = verbs.add_parser(
        "bench",
        help="latency/throughput against fresh python -c",
        description="Time snippets under fresh `python -c` and under the sandbox, at this "
        "machine's isolation level and at the basic level (isolation='none', for comparison), "
        "then the cost of each isolation layer. Prints each row as it is measured.",
    )
    add_number(
        bench, "--n", low=1, high=_MAX_BENCH_N, default=30, help="calls timed per measurement"
    )
    add_number(
        bench,
        "--workers",
        low=1,
        high=_MAX_BENCH_WORKERS,
        default=2,
        help="parallel calls in the throughput measurement, and workers of each sandbox",
    )
    bench.set_defaults(handler=_bench)


# -- reading the code ------------------------------------------------------------
def read_code(file: str) -> str:
    """The snippet in ``file`` (``-``: stdin), checked before any sandbox starts.

    One bounded read of ``MAX_CODE_BYTES + 1`` bytes: larger input is refused
    without reading the rest. Errors are :class:`ConfigError` naming the
    source, and for bad bytes the line and the byte offset.
    """
    if file == "-":
        source = "stdin"
        if sys.stdin is None:
            raise ConfigError("stdin is closed; pass the code as a file")
        if sys.stdin.isatty():
            print(
                "retool: reading the code from stdin; end it with Ctrl-D (or pass a file)",
                file=sys.stderr,
                flush=True,
            )
        data = sys.stdin.buffer.read(MAX_CODE_BYTES + 1)
    else:
        source = file
        try:
            with open(file, "rb") as handle:
                data = handle.read(MAX_CODE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_CODE_BYTES:
        raise ConfigError(
            f"{source}: the code is over {MAX_CODE_BYTES} bytes, the sandbox's limit "
            "(MAX_CODE_BYTES); pass a smaller snippet"
        )
    skip = len(_UTF8_BOM) if data.startswith(_UTF8_BOM) else 0
    try:
        code = data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = skip + exc.start
        raise ConfigError(
            f"{_where(source, data, offset)}: not UTF-8 text (byte 0x{data[offset]:02x}); "
            "save the code as UTF-8"
        ) from None
    if "\0" in code:
        raise ConfigError(
            f"{_where(source, data, data.index(0))}: a NUL byte, so not Python source "
            "(a binary or UTF-16 file?); save the code as UTF-8"
        )
    return code


def _where(source: str, data: bytes, offset: int) -> str:
    return f"{source}: line {data.count(10, 0, offset) + 1}, byte offset {offset}"


def _stoppable(work: Callable[[], int]) -> int:
    """Run ``work()``; on SIGINT/SIGTERM, stop it and exit 128 + the signal.

    Every sandbox of this process is closed (its calls, their daemons, its
    server and its temporary directory gone) before this returns, also one
    whose own ``close()`` the interrupt cut short.
    """
    status = 0
    with StopOnce() as signals:
        try:
            status = work()
        finally:
            signals.defer()
            close_all()
    if signals.signum is not None:
        name = signal.Signals(signals.signum).name
        print(f"retool: stopped by {name}; the sandbox and all it ran are gone", file=sys.stderr)
        return 128 + signals.signum
    return status


# -- the verbs ---------------------------------------------------------------------
def _exec(args: argparse.Namespace) -> int:
    check_number("--timeout (seconds)", args.timeout, 0, MAX_TIMEOUT_S, low_open=True)
    check_number("--memory-mb", args.memory_mb, *MEMORY_MB_RANGE, integer=True)
    timeout, memory_mb = args.timeout, args.memory_mb
    code = read_code(args.file)

    def work() -> int:
        with LocalSandbox(
            timeout=timeout, memory_mb=memory_mb, max_workers=1, isolation=args.isolation
        ) as sandbox:
            result = sandbox.run(code)
        if args.json:
            print(json.dumps(result.to_dict()))  # json.dumps escapes control characters
        else:
            _say(format_tool_content(result, timeout), end="")
        return 0 if result.ok else 1

    return _stoppable(work)


def _check(args: argparse.Namespace) -> int:
    def work() -> int:
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
        for layer in sandbox.layers:  # every layer in force, the server's own account
            _say(f"layer: {layer}")
        for item in sandbox.missing:
            _say(f"missing: {item}")
        if degraded:
            _say("degraded: calls run without some isolation layers (see missing)")
        return 0 if level == IsolationLevel.FULL else 1

    return _stoppable(work)


def _bench(args: argparse.Namespace) -> int:
    check_number("--n", args.n, 1, _MAX_BENCH_N, integer=True)
    check_number("--workers", args.workers, 1, _MAX_BENCH_WORKERS, integer=True)
    n, workers = args.n, args.workers

    def work() -> int:
        run_bench(n=n, workers=workers, log=_say)
        return 0

    return _stoppable(work)
