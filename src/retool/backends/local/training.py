"""``LocalTrainingClient``: LoRA (or full) training of a causal LM with PyTorch.

The training client contract (``retool.types``) on one model, in four files:

* this one: the calls, their checks, the loss and the optimizer. One call of
  ``forward_backward`` pads its datums into one batch, computes their target
  logprobs and the loss (``losses.py``), and adds its gradients to the
  accumulated ones; ``optim_step`` applies AdamW with optional global-norm
  clipping and clears them: many micro-batches, one update.
* ``forward.py``: padding and the forward pass, with a prefix the datums
  share computed once, and the layers that recompute in the backward pass.
* ``snapshots.py``: sampling clients' weights (LoRA merged in), a closed
  client's model reused for the next one.
* ``checkpoints.py``: ``save_state`` / ``load_state`` directories (weights,
  optimizer, every RNG state), written atomically, so that a resumed run's
  next step is the one that would have happened without the interruption.

Every call runs in a short-lived worker thread (``threads.py``) under one
lock: a call sees the weights of the calls before it, never half an update.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from retool.backends.local import compiled
from retool.backends.local.checkpoints import (
    atomic_directory,
    read_state_meta,
    read_trainable,
    read_training_state,
    restore_rng,
    write_sampler_meta,
    write_state,
)
from retool.backends.local.forward import (
    PaddedBatch,
    flat_input,
    pad_batch,
    recompute_layers,
    target_logprobs,
)
from retool.backends.local.lora_fast import use_lean_lora_forward
from retool.backends.local.losses import (
    LOSS_NAMES,
    REQUIRED_INPUTS,
    SAMPLER_LOGPROBS,
    compute_loss,
)
from retool.backends.local.sampling import LocalSamplingClient
from retool.backends.local.snapshots import SnapshotPool
from retool.backends.local.threads import run_in_worker
from retool.errors import BackendError
from retool.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    Future,
    OptimStepOutput,
    SaveStateOutput,
    TensorData,
    Tokenizer,
)

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

DEFAULT_TARGET_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


@dataclass(frozen=True)
class LoadedState:
    """A ``save_state`` checkpoint as read (:meth:`LocalTrainingClient.read_checkpoint`)."""

    weights: dict[str, torch.Tensor]  # trainable weights by name, full tensors on the CPU
    training: dict[str, Any] | None  # optimizer and generator states; None: weights only
    steps: int  # optimizer steps taken (read with the training state, else 0)


@dataclass(frozen=True)
class LoraSpec:
    """How the LoRA adapter is shaped (``None`` on a client means full fine-tuning)."""

    rank: int  # adapter rank
    alpha: int  # scaling numerator: the update is (alpha / rank) * B @ A
    target_modules: tuple[str, ...]  # module names that get an adapter


class LocalTrainingClient:
    """Trainable weights and optimizer state of one model on this machine."""

    def __init__(
        self,
        model: PeftModel | PreTrainedModel,  # PEFT-wrapped for LoRA
        tokenizer: Tokenizer,  # an HF tokenizer: any class transformers loads for the model
        base_model: str,
        lora: LoraSpec | None,
        checkpoint_root: Path,
        max_context_tokens: int = 8192,
        gradient_checkpointing: bool = True,
        recompute_fraction: float = 0.1,
        logits_chunk_tokens: int = 1024,
        share_prefix: bool = True,
        autocast_dtype: torch.dtype | None = None,
        sampler_dtype: torch.dtype | None = None,
        compile_choice: compiled.CompileChoice | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.base_model = base_model
        self.lora = lora
        self.checkpoint_root = Path(checkpoint_root)
        self.max_context_tokens = max_context_tokens
        self.logits_chunk_tokens = logits_chunk_tokens  # rows x positions per logits chunk
        self.share_prefix = share_prefix  # compute the datums' common prefix once per call
        # bf16 training: the decoder under autocast, master weights and optimizer in float32,
        # the output head and log-softmax in float32 (chunked_target_logprobs).
        self.autocast_dtype = autocast_dtype
        self.sampler_dtype = sampler_dtype  # sampling snapshots' weight dtype (None: as trained)
        self.device = next(model.parameters()).device
        self.steps = 0  # optimizer steps taken
        self._lock = threading.Lock()
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._names = [n for n, p in model.named_parameters() if p.requires_grad]
        self._optimizer: torch.optim.AdamW | None = None
        self.snapshots = SnapshotPool(
            model, self._causal_lm(), self._names, self._lock, lora is None, sampler_dtype
        )
        if gradient_checkpointing:
            recompute_layers(self._causal_lm(), recompute_fraction)
        use_lean_lora_forward(self.model)
        self.model.train()
        # model.compile: fused element-wise kernels (compiled.py), built and tried here so a
        # failing compiler falls back to eager before any step, with the reason recorded.
        choice = compile_choice or compiled.CompileChoice("off", False, "not requested")
        self.compile = choice
        if choice.enabled:
            self.compile = run_in_worker(
                lambda: compiled.prepare(self._causal_lm(), choice, self._autocast, self.device)
            )

    # -- model plumbing -------------------------------------------------------
    def _autocast(self) -> torch.autocast:
        """The context every forward of this trainer runs in (bf16 training: enabled)."""
        return torch.autocast(
            self.device.type,
            dtype=self.autocast_dtype or torch.bfloat16,
            enabled=self.autocast_dtype is not None,
        )

    def _causal_lm(self) -> PreTrainedModel:
        """The HF causal LM under the PEFT wrapper (or the model itself)."""
        get_base_model = getattr(self.model, "get_base_model", None)
        lm = get_base_model() if get_base_model is not None else self.model
        return cast("PreTrainedModel", lm)  # PeftModel.get_base_model(): the model it wraps

    def _check(self, data: Sequence[Datum], loss_fn: str) -> None:
        """Refuse a call the loss or the context cannot take, naming the datum."""
        if loss_fn not in LOSS_NAMES:
            raise BackendError(
                f"unknown loss_fn {loss_fn!r}; choose one of {', '.join(LOSS_NAMES)}"
            )
        if not data:
            raise BackendError("forward_backward needs at least one datum")
        for i, datum in enumerate(data):
            n = datum.model_input.length
            if n == 0:
                raise BackendError(f"datum {i} has no tokens")
            if n > self.max_context_tokens:
                raise BackendError(
                    f"datum {i} has {n} tokens, more than max_context_tokens "
                    f"({self.max_context_tokens})"
                )
            for key in REQUIRED_INPUTS[loss_fn]:
                if key not in datum.loss_fn_inputs:
                    raise BackendError(
                        f"datum {i} lacks loss_fn_inputs[{key!r}] needed by {loss_fn}"
                    )

    def _logprobs(self, batch: PaddedBatch) -> torch.Tensor:
        """``[datums, width]`` target logprobs of ``batch`` (the sharded trainer runs them
        through its FSDP root, so that its parameters are gathered for the call)."""
        return target_logprobs(
            self._causal_lm(), batch, self.logits_chunk_tokens, self.share_prefix
        )

    def _run(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        config: Mapping[str, float] | None,
        backward: bool,
        loss_scale: float = 1.0,
    ) -> ForwardBackwardOutput:
        """One call on ``data``; ``loss_scale`` multiplies the loss before the backward pass
        (0: a rank with no datums of its own still takes part in the collectives)."""
        self._check(data, loss_fn)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        batch = pad_batch(data, pad, self.device)
        with torch.set_grad_enabled(backward):
            with self._autocast():
                logprobs = self._logprobs(batch)
            flat = logprobs[batch.mask.bool()]
            inputs = {
                key: flat_input(data, key, self.device)
                for key in REQUIRED_INPUTS[loss_fn]
                if key != "target_tokens"
            }
            if loss_fn != "cross_entropy" and all(
                SAMPLER_LOGPROBS in d.loss_fn_inputs for d in data
            ):
                inputs[SAMPLER_LOGPROBS] = flat_input(data, SAMPLER_LOGPROBS, self.device)
            segments = torch.repeat_interleave(
                torch.arange(len(data), device=self.device),
                torch.tensor(batch.lengths, device=self.device),
            )
            loss, metrics = compute_loss(loss_fn, flat, inputs, config, segments=segments)
            if backward:
                (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        per_datum = []
        offset = 0
        detached = flat.detach().cpu().numpy()
        for n in batch.lengths:
            per_datum.append({"logprobs": TensorData.from_numpy(detached[offset : offset + n])})
            offset += n
        return ForwardBackwardOutput(tuple(per_datum), metrics)

    # -- the contract ---------------------------------------------------------
    def _call(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        config: Mapping[str, float] | None,
        backward: bool,
    ) -> Future[ForwardBackwardOutput]:
        def run() -> ForwardBackwardOutput:
            with self._lock:
                return self._run(data, loss_fn, config, backward=backward)

        return Future.run(lambda: run_in_worker(run))

    def forward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
    ) -> Future[ForwardBackwardOutput]:
        """Per-datum logprobs and loss metrics, without gradients."""
        return self._call(data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
    ) -> Future[ForwardBackwardOutput]:
        """As ``forward``, and add this call's gradients to the accumulated ones."""
        return self._call(data, loss_fn, loss_fn_config, backward=True)

    def _ensure_optimizer(self, params: AdamParams) -> torch.optim.AdamW:
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(
                self._params,
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        for group in self._optimizer.param_groups:
            group.update(
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        return self._optimizer

    def optim_step(self, adam_params: AdamParams) -> Future[OptimStepOutput]:
        def run() -> OptimStepOutput:
            with self._lock:
                optimizer = self._ensure_optimizer(adam_params)
                limit = (
                    adam_params.grad_clip_norm if adam_params.grad_clip_norm > 0 else float("inf")
                )
                norm = self._clip_gradients(limit)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                self.steps += 1
                return OptimStepOutput(
                    {
                        "grad_norm": norm,
                        "learning_rate": adam_params.learning_rate,
                        "step": float(self.steps),
                    }
                )

        return Future.run(lambda: run_in_worker(run))

    def _clip_gradients(self, limit: float) -> float:
        """Clip the accumulated gradients to global norm ``limit``; their norm before."""
        grads = [p for p in self._params if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(grads, limit)) if grads else 0.0

    # -- checkpoints (checkpoints.py) -----------------------------------------
    writes_files = True  # False on a sharded trainer's ranks other than 0 (they only gather)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().clone() for n, p in zip(self._names, self._params, strict=True)}

    def optimizer_state(self) -> dict[str, Any] | None:
        """The optimizer's ``state_dict()`` (None before the first step)."""
        return self._optimizer.state_dict() if self._optimizer else None

    def save_state(self, name: str) -> Future[SaveStateOutput]:
        def run() -> SaveStateOutput:
            with self._lock:
                final = self.checkpoint_root / "state" / name
                trainable, optimizer = self.trainable_state(), self.optimizer_state()
                if not self.writes_files:
                    return SaveStateOutput(str(final))
                with atomic_directory(final) as tmp:
                    write_state(
                        tmp,
                        trainable,
                        optimizer,
                        {
                            "base_model": self.base_model,
                            "lora": asdict(self.lora) if self.lora else None,
                            "steps": self.steps,
                            "max_context_tokens": self.max_context_tokens,
                        },
                    )
                return SaveStateOutput(str(final))

        return Future.run(lambda: run_in_worker(run))

    def load_state(self, path: str) -> Future[None]:
        """Load the weights of a ``save_state`` checkpoint; the optimizer starts afresh.

        For starting a new phase from a checkpoint (RL from a cold-start SFT
        run). :meth:`load_state_with_optimizer` resumes an interrupted run.
        """
        return Future.run(lambda: run_in_worker(lambda: self._load(Path(path), False)))

    def load_state_with_optimizer(self, path: str) -> Future[None]:
        """Weights, optimizer moments, random generators and step counter."""
        return Future.run(lambda: run_in_worker(lambda: self._load(Path(path), True)))

    def _load(self, root: Path, with_optimizer: bool) -> None:
        with self._lock:
            self.apply_checkpoint(self.read_checkpoint(root, with_optimizer))

    def read_checkpoint(self, root: Path, with_optimizer: bool) -> LoadedState:
        """A ``save_state`` directory read and checked against this client (nothing changed)."""
        meta = read_state_meta(root)
        if meta["base_model"] != self.base_model:
            raise BackendError(
                f"{root}: checkpoint of {meta['base_model']!r}, this "
                f"client trains {self.base_model!r}"
            )
        weights = read_trainable(root)
        missing = set(self._names) - set(weights)
        if missing:
            raise BackendError(f"{root}: checkpoint lacks {sorted(missing)[:3]}...")
        if not with_optimizer:
            return LoadedState(weights, None, 0)
        return LoadedState(weights, read_training_state(root), int(meta["steps"]))

    def apply_checkpoint(self, loaded: LoadedState) -> None:
        """Put a read checkpoint in place: weights; with the optimizer, its moments, the
        random generators and the step counter."""
        with torch.no_grad():
            for name, param in zip(self._names, self._params, strict=True):
                param.copy_(loaded.weights[name].to(param.device, param.dtype))
        state = loaded.training
        if state is None:
            self._optimizer = None
            return
        if state["optimizer"] is not None:
            self._optimizer = torch.optim.AdamW(self._params)
            self._optimizer.load_state_dict(state["optimizer"])
        else:
            self._optimizer = None
        restore_rng(state)
        self.steps = loaded.steps

    # -- sampling (snapshots.py) ----------------------------------------------
    def save_weights_for_sampler(self, name: str, merge: bool = False) -> Future[SaveStateOutput]:
        """A PEFT adapter directory (or, with ``merge=True``, a full HF model directory)."""

        def run() -> SaveStateOutput:
            final = self.checkpoint_root / "sampler" / name
            merged = bool(merge or self.lora is None)
            with atomic_directory(final) as tmp:
                if merged:
                    self.snapshots.copy().save_pretrained(tmp, safe_serialization=True)
                    self.tokenizer.save_pretrained(tmp)
                else:
                    with self._lock:  # the pool's source: the trained model, or its full copy
                        source = cast("PeftModel", self.snapshots.model)
                        source.save_pretrained(str(tmp))
                write_sampler_meta(tmp, self.base_model, merged)
            return SaveStateOutput(str(final))

        return Future.run(lambda: run_in_worker(run))

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> LocalSamplingClient:
        if name is not None:
            self.save_weights_for_sampler(name).result()
        return LocalSamplingClient(
            run_in_worker(self.snapshots.take),
            self.tokenizer,
            max_context_tokens=self.max_context_tokens,
            name=name,
            on_close=self.snapshots.release,
        )

    def sampler_model(self) -> PeftModel | PreTrainedModel:
        """The full model a sampler outside this client reads the policy from (a vLLM
        engine exports and reloads it): the trained model itself in one process."""
        return self.model

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer
