"""``[sampler]``: which engine samples the rollouts, and its vLLM settings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from retool.config.fields import check_range
from retool.errors import ConfigError


@dataclass(frozen=True)
class SamplerConfig:
    """Which engine samples the rollouts (:mod:`retool.backends.vllm`); the trainer is
    ``model.backend``'s either way.

    ``engine = "local"`` (default) samples with the local backend's own sampler
    from a frozen copy of the trainer's weights. ``"vllm"`` samples with vLLM
    (the ``vllm`` extra): in this process when ``urls`` is empty, else from
    ``vllm serve`` endpoints at ``urls``. ``"auto"`` picks vLLM where it is
    installed and measured faster on this host, ours elsewhere
    (:mod:`retool.backends.vllm.choice`: the rule, its measurements), and
    prints and records the choice. After each optimizer step the trainer's
    weights reach the engine by ``sync``: ``lora`` publishes the adapter
    under a new id (``policy-step-N``), ``merged`` writes the merged weights
    into the engine in place. Every sample carries the policy version the
    engine used, and the rollout refuses one that is not the step's.
    ``retool eval`` reads ``engine``, ``dtype``, ``enforce_eager``,
    ``max_model_len``, ``kv_cache_gb``, ``gpu_memory_utilization`` and
    ``threads_bind`` (fixed weights: no ``sync``; in process: no ``urls``).
    """

    engine: str = "local"  # local | vllm | auto
    dtype: str = "float32"  # vllm: float32 | bfloat16 | float16 (float32 keeps logprobs to 1e-4)
    sync: str = "merged"  # vllm: merged | lora (docs/measurements.md, "Facts the code cites")
    enforce_eager: bool = True  # vllm: no graph compilation (start-up ~17 s instead of ~67 s)
    max_model_len: int = 0  # vllm: longest prompt + completion; 0 = train.max_train_tokens
    kv_cache_gb: int = 1  # vllm on CPU: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE), [1, 1024]
    gpu_memory_utilization: float = 0.9  # vllm on a GPU: share of its memory, in (0, 1]
    threads_bind: str = "auto"  # vllm on CPU: VLLM_CPU_OMP_THREADS_BIND; auto = every core
    urls: str = ""  # vllm serve base URLs, comma-separated (http://host:port); "" = in-process

    def __post_init__(self) -> None:
        if self.engine not in ("local", "vllm", "auto"):
            raise ConfigError(f"sampler.engine must be local, vllm or auto; got {self.engine!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(
                f"sampler.dtype must be float32, bfloat16 or float16; got {self.dtype!r}"
            )
        if self.sync not in ("lora", "merged"):
            raise ConfigError(f"sampler.sync must be lora or merged; got {self.sync!r}")
        check_range("sampler", "max_model_len", self.max_model_len, 0, 2**24, integer=True)
        check_range("sampler", "kv_cache_gb", self.kv_cache_gb, 1, 1024, integer=True)
        check_range(
            "sampler",
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            0,
            1,
            integer=False,
            low_open=True,
        )
        if not re.fullmatch(
            r"auto|nobind|\d+(-\d+)?(,\d+(-\d+)?)*(\|\d+(-\d+)?(,\d+(-\d+)?)*)*", self.threads_bind
        ):
            raise ConfigError(
                'sampler.threads_bind must be "auto", "nobind" or CPU ids such as "0-1"; '
                f"got {self.threads_bind!r}"
            )
        if self.url_list and self.engine == "local":
            raise ConfigError(
                'sampler.urls names vllm serve endpoints, but sampler.engine = "local" samples '
                "with the local backend's own sampler and would ignore them: set "
                'sampler.engine = "vllm" (and sampler.sync = "lora") or sampler.urls = ""'
            )
        for url in self.url_list:
            _check_url(url)
        if self.engine == "vllm" and self.url_list and self.sync != "lora":
            raise ConfigError(
                'sampler.urls (vllm serve) syncs by adapter only: set sampler.sync = "lora" '
                '(sampler.sync = "merged" needs the in-process engine, sampler.urls = "")'
            )

    @property
    def url_list(self) -> tuple[str, ...]:
        """``urls`` split at commas, blanks dropped."""
        return tuple(u.strip() for u in self.urls.split(",") if u.strip())


def _check_url(url: str) -> None:
    """One ``sampler.urls`` entry: ``http(s)://host[:port][/path]``, with a host and a valid
    port (``http://[::1`` or ``http://h:99999`` is refused here, not by a traceback later)."""
    problem = ""
    if not re.fullmatch(r"https?://[^\s/,]+(/\S*)?", url):
        problem = "not an http(s) base URL"
    else:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:  # an unclosed [IPv6 bracket, a port out of range
            problem = str(exc)
        else:
            if not parts.hostname:
                problem = "no host"
            elif port == 0:
                problem = "port 0"
    if problem:
        raise ConfigError(
            "sampler.urls must be comma-separated http(s) base URLs of vllm serve "
            f"(http://127.0.0.1:8000); got {url!r} ({problem})"
        )
