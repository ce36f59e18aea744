"""``LocalServiceClient``: the embedded backend's entry point.

The same calls a remote training service answers (``create_lora_training_client``,
``create_sampling_client``...), served in-process on CPU or one GPU, so rollout
and training code never know which backend they talk to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from retool.backends.local.allocator import release_large_blocks_to_os
from retool.backends.local.checkpoints import read_state_meta
from retool.backends.local.compiled import REQUESTS as COMPILE_REQUESTS
from retool.backends.local.compiled import CompileChoice, resolve_compile
from retool.backends.local.distributed import world
from retool.backends.local.dtype import (
    ModelShapes,
    Numerics,
    Workload,
    frozen_in_bfloat16,
    resolve_numerics,
    time_model_decode,
)
from retool.backends.local.models import load_model, load_tokenizer
from retool.backends.local.sampling import LocalSamplingClient
from retool.backends.local.threads import run_in_worker
from retool.backends.local.training import (
    DEFAULT_TARGET_MODULES,
    LocalTrainingClient,
    LoraSpec,
)
from retool.errors import BackendError, ConfigError

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LocalServiceClient:
    """Creates training and sampling clients backed by PyTorch on this machine."""

    def __init__(
        self,
        device: str = "auto",
        dtype: str = "auto",
        checkpoint_root: str | Path = "runs/checkpoints",
        max_context_tokens: int = 8192,
        gradient_checkpointing: bool = True,
        workload: Workload | None = None,
        numerics: Numerics | None = None,
        compile: str = "auto",
    ) -> None:
        """``dtype``: ``auto`` measures per role (:mod:`.dtype`) at ``workload``'s rows when the
        first model loads; ``numerics`` pins an earlier choice (a resumed run keeps its own).
        ``compile``: ``auto`` | ``on`` | ``off``, the trainer's fused element-wise kernels
        (:mod:`.compiled`), decided from the trainer's dtype once it is known."""
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu or cuda, got {device!r}")
        if dtype != "auto" and dtype not in _DTYPES:
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
        if (
            numerics is not None
            and dtype != "auto"
            and (numerics.sampler, numerics.trainer)
            != (
                dtype,
                dtype,
            )
        ):
            raise ConfigError(
                f"model.dtype = {dtype!r} differs from the run's recorded numerics "
                f"({numerics.summary()}); keep the run's dtype or start a new run"
            )
        if compile not in COMPILE_REQUESTS:
            raise ConfigError(
                f"compile must be one of {', '.join(COMPILE_REQUESTS)}, got {compile!r}"
            )
        if max_context_tokens <= 0:
            raise ConfigError(f"max_context_tokens must be > 0, got {max_context_tokens}")
        # What another rank of a torchrun group needs to build this service's twin.
        self.options: dict[str, Any] = {
            "device": device,
            "dtype": dtype,
            "checkpoint_root": str(checkpoint_root),
            "max_context_tokens": max_context_tokens,
            "gradient_checkpointing": gradient_checkpointing,
            "workload": workload,
            "compile": compile,
        }
        self.world = world()
        if self.world.distributed and device.startswith("cuda"):
            device = f"cuda:{self.world.local_rank}"  # one GPU per rank (torchrun's LOCAL_RANK)
        self.device = torch.device(device)
        self.requested_dtype = dtype
        # Weights load in float32 (the trainer's master copy) unless float16 is asked for.
        self.dtype = torch.float16 if dtype == "float16" else torch.float32
        self.workload = workload or Workload()
        if numerics is not None and not {numerics.sampler, numerics.trainer} <= set(_DTYPES):
            raise ConfigError(
                f"numerics: sampler {numerics.sampler!r}, trainer {numerics.trainer!r}; each "
                f"must be one of {', '.join(_DTYPES)}"
            )
        self.numerics: Numerics | None = numerics  # resolved when the first model loads
        self.requested_compile = compile
        self.compile: CompileChoice | None = None  # resolved with the numerics
        self.checkpoint_root = Path(checkpoint_root)
        self.max_context_tokens = max_context_tokens
        self.gradient_checkpointing = gradient_checkpointing
        if self.device.type == "cpu":
            release_large_blocks_to_os()  # see allocator.py: 3x lower peak RSS in training

    def _model(self, base_model: str, seed: int | None) -> PreTrainedModel:
        model = run_in_worker(
            lambda: load_model(base_model, dtype=self.dtype, seed=seed or 0).to(self.device)
        )
        self.resolve_numerics(model)
        return model

    def resolve_numerics(self, model: PreTrainedModel) -> Numerics:
        """The per-role dtypes (measured once, on the first model, for ``auto``)."""
        if self.numerics is None:
            device = str(self.device)
            self.numerics = run_in_worker(
                lambda: resolve_numerics(
                    self.requested_dtype,
                    ModelShapes.from_config(model.config),
                    self.workload,
                    device=device,
                    sampler_timer=time_model_decode(model, device),
                )
            )
        if self.compile is None:
            self.compile = resolve_compile(
                self.requested_compile, self.numerics.trainer, str(self.device)
            )
            if self.requested_compile == "on" and not self.compile.enabled:
                raise ConfigError(self.compile.reason + "; set model.compile = off or auto")
        return self.numerics

    def _role_dtypes(self) -> tuple[Any, Any]:
        """(trainer autocast dtype or None, sampler weight dtype)."""
        assert self.numerics is not None
        autocast = torch.bfloat16 if self.numerics.trainer == "bfloat16" else None
        return autocast, _DTYPES[self.numerics.sampler]

    def trainer_options(self, base_model: str) -> dict[str, Any]:
        """The keyword arguments of a training client of ``base_model`` but its model and
        adapter shape."""
        autocast, sampler_dtype = self._role_dtypes()
        return {
            "tokenizer": load_tokenizer(base_model),
            "base_model": base_model,
            "checkpoint_root": self.checkpoint_root,
            "max_context_tokens": self.max_context_tokens,
            "gradient_checkpointing": self.gradient_checkpointing,
            "autocast_dtype": autocast,
            "sampler_dtype": sampler_dtype,
            "compile_choice": self.compile,
        }

    def _trainer(
        self,
        model: PeftModel | PreTrainedModel,
        base_model: str,
        lora: LoraSpec | None,
        seed: int | None,
    ) -> LocalTrainingClient:
        if self.world.distributed:  # under torchrun: every rank holds a shard (FSDP2)
            from retool.backends.local.distributed_trainer import sharded_trainer

            return sharded_trainer(self, model, lora, seed, self.trainer_options(base_model))
        return LocalTrainingClient(model=model, lora=lora, **self.trainer_options(base_model))

    def build_model(
        self, base_model: str, lora: LoraSpec | None, seed: int | None
    ) -> PeftModel | PreTrainedModel:
        """The model a training client trains: with a new LoRA adapter (``lora``), or with
        every weight trainable (``None``)."""
        model = self._model(base_model, seed)
        if lora is None:
            for parameter in model.parameters():
                parameter.requires_grad_(True)
            return model
        from peft import LoraConfig, get_peft_model

        if seed is not None:
            torch.manual_seed(seed)  # the adapter's initial A matrices
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            target_modules=list(lora.target_modules),
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        peft_model = run_in_worker(lambda: get_peft_model(model, config))
        # A sharded trainer keeps the frozen base in float32: FSDP2 wants one dtype per
        # shard group (verl#3470); on GPUs its MixedPrecisionPolicy computes in bf16.
        if self._role_dtypes()[0] is not None and not self.world.distributed:
            frozen_in_bfloat16(peft_model)
        return peft_model

    def _sampler_weights(self, model: PreTrainedModel) -> PreTrainedModel:
        return model.to(self._role_dtypes()[1])

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        alpha: int | None = None,
        target_modules: tuple[str, ...] | None = None,
    ) -> LocalTrainingClient:
        """A client that trains a LoRA adapter (attention and MLP projections by default)."""
        if rank <= 0:
            raise ConfigError(f"LoRA rank must be >= 1, got {rank}")
        spec = LoraSpec(
            rank=rank,
            alpha=alpha or rank,
            target_modules=tuple(target_modules or DEFAULT_TARGET_MODULES),
        )
        return self._trainer(self.build_model(base_model, spec, seed), base_model, spec, seed)

    def create_training_client(
        self, base_model: str, full: bool = True, seed: int | None = None
    ) -> LocalTrainingClient:
        """A client that trains every weight (small models only)."""
        if not full:
            return self.create_lora_training_client(base_model, seed=seed)
        return self._trainer(self.build_model(base_model, None, seed), base_model, None, seed)

    def _client_for_state(self, path: str | Path) -> LocalTrainingClient:
        meta = read_state_meta(Path(path))
        base_model, lora = state_fields(meta, Path(path) / "retool_state.json")
        if lora is None:
            return self.create_training_client(base_model)
        return self.create_lora_training_client(
            base_model, rank=lora.rank, alpha=lora.alpha, target_modules=lora.target_modules
        )

    def create_training_client_from_state(self, path: str | Path) -> LocalTrainingClient:
        """A training client with the weights of a ``save_state`` checkpoint, fresh optimizer."""
        client = self._client_for_state(path)
        client.load_state(str(path)).result()
        return client

    def create_training_client_from_state_with_optimizer(
        self, path: str | Path
    ) -> LocalTrainingClient:
        """Resume: weights, optimizer state, random generators and step counter."""
        client = self._client_for_state(path)
        client.load_state_with_optimizer(str(path)).result()
        return client

    def close(self) -> None:
        """Nothing to end: the models live in this process (a service's session would end here)."""

    def create_sampling_client(
        self, model_path: str | Path | None = None, base_model: str | None = None
    ) -> LocalSamplingClient:
        """Sample from saved sampler weights (adapter or merged) or from a base model."""
        if model_path is None:
            if base_model is None:
                raise ConfigError("create_sampling_client needs model_path or base_model")
            return LocalSamplingClient(
                self._sampler_weights(self._model(base_model, None)),
                load_tokenizer(base_model),
                max_context_tokens=self.max_context_tokens,
            )
        root = Path(model_path)
        base, merged = read_sampler_info(root)
        from safetensors import SafetensorError

        try:
            if merged:
                model = run_in_worker(
                    lambda: load_model(str(root), dtype=self.dtype).to(self.device)
                )
                self.resolve_numerics(model)
            else:
                from peft import PeftModel

                base_weights = self._model(base, None)
                model = run_in_worker(
                    lambda: PeftModel.from_pretrained(base_weights, str(root)).merge_and_unload()
                )
        except SafetensorError as exc:  # a truncated or overwritten weights file
            raise BackendError(
                f"{root}: damaged weights file ({str(exc)[:120]}); use another checkpoint "
                "of the run (RUN@STEP) or save these weights again"
            ) from None
        return LocalSamplingClient(
            self._sampler_weights(model),
            load_tokenizer(base),
            max_context_tokens=self.max_context_tokens,
        )


def _damaged_meta(path: Path, why: str) -> BackendError:
    return BackendError(
        f"{path}: {why}; the checkpoint is damaged: use an earlier one (remove its line from "
        "checkpoints.jsonl) or start a new run"
    )


def state_fields(meta: dict[str, Any], path: Path) -> tuple[str, LoraSpec | None]:
    """``retool_state.json``'s model and adapter, each checked for what ``save_state`` writes.

    The file is in a run directory a user may edit: a field of the wrong type
    (a list for ``base_model``, ``"8"`` for a rank) is one error naming the file
    and the field, never a ``KeyError`` or a model silently loaded as ``"['x']"``.
    """
    base_model, lora, steps = meta.get("base_model"), meta.get("lora"), meta.get("steps")
    if not isinstance(base_model, str) or not base_model.strip():
        raise _damaged_meta(path, f"'base_model' must be a model name, got {base_model!r:.60}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise _damaged_meta(path, f"'steps' must be an integer >= 0, got {steps!r:.60}")
    if "lora" not in meta:
        raise _damaged_meta(path, "no 'lora' field (null for full fine-tuning)")
    if lora is None:
        return base_model, None
    if not isinstance(lora, dict):
        raise _damaged_meta(path, f"'lora' must be an object or null, got {lora!r:.60}")
    for key in ("rank", "alpha"):
        value = lora.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _damaged_meta(path, f"'lora.{key}' must be an integer >= 1, got {value!r:.60}")
    modules = lora.get("target_modules")
    if (
        not isinstance(modules, list)
        or not modules
        or not all(isinstance(m, str) and m for m in modules)
    ):
        raise _damaged_meta(
            path, f"'lora.target_modules' must be a list of module names, got {modules!r:.60}"
        )
    return base_model, LoraSpec(lora["rank"], lora["alpha"], tuple(modules))


def read_sampler_info(root: Path) -> tuple[str, bool]:
    """``retool_sampler.json`` of saved sampler weights: (base model, merged), checked.

    Read before the weights load (``retool eval`` and ``retool rollout`` call it
    first, so a damaged file is their one error line, not one after "loading").
    """
    info_path = Path(root) / "retool_sampler.json"
    if not info_path.exists():
        raise BackendError(f"{root}: not a sampler checkpoint (no retool_sampler.json)")
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # not JSON, not UTF-8, a directory, a huge integer
        raise BackendError(
            f"{info_path}: not a valid sampler description ({type(exc).__name__}: "
            f"{str(exc)[:120]}); save the weights again with save_weights_for_sampler"
        ) from None
    why = ""
    if not isinstance(info, dict):
        why = f"not a JSON object ({type(info).__name__})"
    elif not isinstance(info.get("base_model"), str) or not info["base_model"].strip():
        why = f"'base_model' must be a model name, got {info.get('base_model')!r:.60}"
    elif not isinstance(info.get("merged"), bool):
        why = f"'merged' must be true or false, got {info.get('merged')!r:.60}"
    if why:
        raise BackendError(
            f"{info_path}: not a valid sampler description ({why}); save the weights again "
            "with save_weights_for_sampler"
        )
    return info["base_model"], info["merged"]


def serve_calls() -> None:
    """A rank other than 0 of a torchrun job: build the driver's trainers (its twins of
    this service) and run their calls until the driver exits (``distributed_trainer.py``)."""
    from retool.backends.local import distributed
    from retool.backends.local.distributed_trainer import ShardedTrainingClient

    trainers: dict[int, ShardedTrainingClient] = {}
    while True:
        call = distributed.receive()
        if call[0] == "exit":
            return
        if call[0] == "build":
            _, key, service_options, base_model, lora, seed = call
            service = LocalServiceClient(**service_options)
            model = service.build_model(base_model, lora, seed)
            trainers[key] = cast(
                ShardedTrainingClient, service._trainer(model, base_model, lora, seed)
            )
            continue
        _, key, method, args = call
        trainers[key].collective(method, *args)
