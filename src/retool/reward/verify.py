"""Math equivalence with math-verify, bounded in time.

math-verify's own timeout uses ``signal.alarm``: it works only in the main
thread and cannot interrupt C code such as ``sympy`` evaluating ``2**10**10``.
So equivalence runs in worker processes (``python -m retool.reward._worker``,
JSON lines over pipes) that the caller kills when a check outlives its
deadline; the check then counts as "not equivalent" and as a timeout. Workers
start once (importing sympy costs about a second) and are reused; a killed
worker is replaced on the next call.

Memory is bounded too: a 14-character answer such as ``(x+1)^{10^{6}}`` makes
sympy reach a gigabyte in two seconds, well inside the deadline. Each worker
caps its own address space (``RLIMIT_AS``, :data:`MEMORY_LIMIT_MB` by default,
about eight times what a worker holds after its imports), so such a check
fails with ``MemoryError`` inside the worker (not equivalent) or kills the
worker. A check whose worker dies twice is answered, never raised: "not
equivalent" with ``Verdict.failed`` set (``EquivalenceChecker.failures`` and
the rollout's ``reward_failures`` count them). The answer is model text, and
no answer may stop a rollout.

Safety: the model's answer is parsed as LaTeX only. math-verify's plain
expression parser goes through ``sympy.parse_expr``, which calls ``eval``, and
model text must never reach ``eval`` outside the sandbox. Workers also start
with an empty environment, so they hold no secrets.

Plain integers on both sides are compared in-process: exact, and the common
case in integer-answer datasets.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from retool.checks import check_number
from retool.reward.arguments import check_text, check_timeout, check_workers, reference_text

_INT_RE = re.compile(r"^[+-]?\d{1,64}$")
_STARTUP_GRACE_S = 120.0  # a new worker's imports (about 1 s; more on a loaded machine)
MEMORY_LIMIT_MB = 512  # address space of one worker process (RLIMIT_AS), MiB
MIN_MEMORY_MB = 128  # below this a worker cannot import sympy and math-verify


@dataclass(frozen=True)
class Verdict:
    """Outcome of one equivalence check."""

    equivalent: bool  # math-verify judged the answers equal
    timed_out: bool = False  # the check was killed at its deadline
    error: str | None = None  # an exception raised inside math-verify, or why its worker died
    failed: bool = False  # the worker died twice on this check (memory limit, crash)


def _plain_int(text: str) -> int | None:
    stripped = text.strip().strip("$").strip()
    return int(stripped) if _INT_RE.match(stripped) else None


def equivalent_in_process(answer: str, reference: str) -> bool:
    """math-verify without any timeout: call only where a hang is acceptable."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    latex = LatexExtractionConfig(boxed_match_priority=0)
    gold = parse(
        f"${reference}$", extraction_config=[latex, ExprExtractionConfig()], parsing_timeout=None
    )
    pred = parse(f"\\boxed{{{answer}}}", extraction_config=[latex], parsing_timeout=None)
    if not gold or not pred:
        return " ".join(answer.split()) == " ".join(reference.split())
    return bool(verify(gold, pred, timeout_seconds=None))


class _Worker:
    """One ``python -m retool.reward._worker`` process."""

    def __init__(self, memory_mb: int) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0"}
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = src  # works from a source checkout as well as an install
        self.process = subprocess.Popen(
            [sys.executable, "-m", "retool.reward._worker", str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buffer = b""
        self.ready = False  # the worker printed its "ready" line (imports done)

    def alive(self) -> bool:
        return self.process.poll() is None

    def _read_line(self, timeout: float) -> list[object] | None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError("verifier process exited")
                self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(raw)

    def ask(self, answer: str, reference: str, timeout: float) -> tuple[str, object] | None:
        """Send one check; ``None`` when no answer came within ``timeout`` seconds.

        The deadline starts once the worker has finished its imports, so a cold
        worker does not eat into the check's own time.
        """
        assert self.process.stdin is not None
        if not self.ready:
            if self._read_line(_STARTUP_GRACE_S) != ["ready"]:
                raise EOFError("verifier process did not start")
            self.ready = True
        self.process.stdin.write((json.dumps([answer, reference]) + "\n").encode())
        self.process.stdin.flush()
        reply = self._read_line(timeout)
        if reply is None:
            return None
        if not isinstance(reply, list) or len(reply) != 2:
            raise ValueError(f"verifier process replied {reply!r:.80}")
        status, value = reply
        return str(status), value

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class EquivalenceChecker:
    """A pool of math-verify worker processes with a hard per-check deadline."""

    def __init__(
        self, timeout: float = 5.0, workers: int = 1, memory_mb: int = MEMORY_LIMIT_MB
    ) -> None:
        self.timeout = check_timeout("EquivalenceChecker timeout (seconds)", timeout)
        self.workers = check_workers("EquivalenceChecker workers", workers)
        check_number("EquivalenceChecker memory_mb", memory_mb, MIN_MEMORY_MB, integer=True)
        self.memory_mb = int(memory_mb)
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(workers):
            self._idle.put(None)  # a slot; its process starts on first use
        self._lock = threading.Lock()
        self.checks = 0  # checks sent to a worker process
        self.timeouts = 0  # checks killed at the deadline
        self.failures = 0  # checks whose worker died twice (scored not equivalent)
        self._closed = False

    def check(self, answer: str, reference: str | float, timeout: float | None = None) -> Verdict:
        """Whether ``answer`` equals ``reference``, decided within ``timeout`` seconds.

        ``reference`` may be a number; ``timeout`` defaults to the checker's own.
        Never raises on the answer: a worker that dies twice on it (its memory
        limit, a crash) gives a ``failed`` verdict, not equivalent.
        """
        check_text("EquivalenceChecker.check answer", answer, "the boxed answer")
        reference = reference_text("EquivalenceChecker.check reference", reference)
        if timeout is not None:
            timeout = check_timeout("EquivalenceChecker.check timeout (seconds)", timeout)
        timeout = self.timeout if timeout is None else timeout
        a, r = _plain_int(answer), _plain_int(reference)
        if a is not None and r is not None:
            return Verdict(a == r)
        if self._closed:
            raise RuntimeError("EquivalenceChecker is closed")
        worker = self._idle.get()
        try:
            for attempt in range(2):
                if worker is None or not worker.alive():
                    worker = _Worker(self.memory_mb)
                try:
                    reply = worker.ask(answer, reference, timeout)
                except (EOFError, OSError, ValueError) as exc:
                    worker.kill()
                    worker = None
                    if attempt == 1:
                        with self._lock:
                            self.failures += 1
                        why = f"the math-verify worker died twice on this answer: {exc}"
                        return Verdict(False, error=why, failed=True)
                    continue
                with self._lock:
                    self.checks += 1
                if reply is None:
                    worker.kill()
                    worker = None
                    with self._lock:
                        self.timeouts += 1
                    return Verdict(False, timed_out=True)
                status, value = reply
                if status == "ok":
                    return Verdict(bool(value))
                return Verdict(False, error=str(value))
            raise AssertionError("unreachable")
        finally:
            self._idle.put(worker)

    def check_many(
        self, pairs: Sequence[tuple[str, str]], timeout: float | None = None
    ) -> list[Verdict]:
        """Check many pairs using every worker in parallel; order is preserved."""
        if not pairs:
            return []
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(lambda p: self.check(p[0], p[1], timeout), pairs))

    def close(self) -> None:
        self._closed = True
        for _ in range(self.workers):
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                break
            if worker is not None:
                worker.kill()

    def __enter__(self) -> EquivalenceChecker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: EquivalenceChecker | None = None
_default_lock = threading.Lock()


def default_checker(workers: int = 1) -> EquivalenceChecker:
    """A process-wide checker, created on first use and closed at exit."""
    workers = check_workers("default_checker workers", workers)
    global _default
    with _default_lock:
        if _default is None or _default.workers < workers:
            if _default is not None:
                _default.close()
            _default = EquivalenceChecker(workers=workers)
            atexit.register(_default.close)
        return _default
