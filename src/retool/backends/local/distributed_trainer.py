"""The local trainer sharded over a torchrun group with FSDP2: every call collective.

``distributed.py`` owns the group; this module owns the model on it.

**Sharding** (:func:`shard`, the recipe of prime-rl, verl and SkyRL): the
adapter (PEFT) is applied first, then ``fully_shard`` on each decoder layer
(the model's ``_no_split_modules`` classes), then on the root; the optimizer
is created after, on the sharded parameters (DTensors). The root is a small
module around the model whose ``forward`` is the trainer's whole logprob
computation (:class:`_LogprobRoot`): the trainer reads the output head's
weight directly and calls the decoder, not the causal LM's ``forward``, so
the root's own parameters (embeddings, final norm, head) are gathered by
calling it. Parameters stay float32 (one dtype per shard group, verl#3470);
on GPUs a bf16 trainer computes through ``MixedPrecisionPolicy(param_dtype=
bf16, reduce_dtype=fp32)``, on CPU through the one-process trainer's autocast.
The initial weights are rank 0's (broadcast before sharding), so a LoRA
adapter drawn without a seed is the same on every rank.

**The same collectives on every rank.** FSDP2 all-gathers a layer's weights
in each forward of it and reduce-scatters its gradient in the backward: every
rank must run each layer the same number of times. So a sharded trainer never
computes a prefix its datums share once (that path runs the decoder twice,
and only where a rank's datums share one); the layers it recomputes are the
same on every rank.

**The same update as one process.** Each ``forward``/``forward_backward``
call reaches every rank with all its datums; each rank takes its share
(``distributed.split_by_tokens``) and computes the built-in loss, a SUM over
its datums (the contract: the loop pre-scales advantages by the step's global
counts). FSDP2 would average the gradients over ranks: the divide factor is
set to 1, so the reduce-scatter sums them and the gradient is the one of one
process on all the datums. A rank with no datum of its own runs datum 0 with
its loss times 0, so that it still takes part in the collectives. Per-datum
logprobs come back to rank 0 in the call's order; metrics merge by what they
mean (``distributed.merge_metrics``). The global gradient norm (clipping) is
computed over the shards and reduced.

**Weights out.** ``trainable_state`` gathers each trainable weight to a full
tensor on every rank (``DTensor.full_tensor``, in parameter order: every rank
takes part, rank 0 keeps them); names are the unwrapped model's, as
``named_parameters`` gives them before and after ``fully_shard`` (TRL#4589).
The optimizer state is gathered the same way into the one-process layout
(parameter indices, full moments), so ``save_state`` writes exactly the files
of a one-process run: the checkpoint loads in one process, and a resume at
any world size reshards it (:meth:`ShardedTrainingClient.apply_checkpoint`).
Rank 0 keeps a full, unsharded copy of the model (its *shadow*): sampler
snapshots and saved sampler weights come from it after each gather, so the
snapshot pool and PEFT's ``save_pretrained`` work on plain tensors
(``merge_adapter`` on DTensors fails, TRL#4550). A vLLM engine beside rank 0
exports and reloads the same copy (:meth:`DriverTrainingClient.sampler_model`,
a gather first). The cost: one full model on rank 0 besides its shard.

**One driver.** Rank 0's client is a :class:`DriverTrainingClient`: each call
is checked there first (so a mistake is one error on rank 0, no rank
started), then broadcast and executed by every rank (``service.serve_calls``).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from retool.backends.local import distributed
from retool.backends.local.checkpoints import restore_rng
from retool.backends.local.compiled import CompileChoice
from retool.backends.local.forward import PaddedBatch, target_logprobs
from retool.backends.local.sampling import LocalSamplingClient
from retool.backends.local.snapshots import SnapshotPool
from retool.backends.local.threads import run_in_worker
from retool.backends.local.training import LoadedState, LocalTrainingClient, LoraSpec
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

    from retool.backends.local.service import LocalServiceClient

NOT_COMPILED = CompileChoice("off", False, "not with a sharded trainer")


class _LogprobRoot(torch.nn.Module):
    """FSDP2's root: its ``forward`` is the trainer's target-logprob computation."""

    def __init__(self, model: torch.nn.Module, lm: Callable[[], PreTrainedModel]) -> None:
        super().__init__()
        self.model = model  # the trained model (PEFT-wrapped for LoRA): its parameters
        self._lm = lm  # the causal LM inside it (a function: not a second registration)

    def forward(self, batch: PaddedBatch, chunk_tokens: int, share_prefix: bool) -> torch.Tensor:
        # A copy, not a view of the logits buffer: FSDP hooks its backward on this tensor.
        return target_logprobs(self._lm(), batch, chunk_tokens, share_prefix).clone()


def shard(
    model: torch.nn.Module, lm: PreTrainedModel, device: torch.device, bf16: bool
) -> _LogprobRoot:
    """``fully_shard`` each decoder layer of ``lm``, then the root around ``model``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layer_classes = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [m for m in lm.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"{type(lm).__name__}: no decoder layers (_no_split_modules) to shard")
    options: dict[str, Any] = {"mesh": distributed.mesh(device.type)}
    if bf16 and device.type == "cuda":
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    units = []
    for layer in layers:
        units.append(fully_shard(layer, **options))
    root = _LogprobRoot(model, lambda: lm)
    units.append(fully_shard(root, **options))
    for unit in units:
        # The losses are sums over datums: the gradient of a call is the sum over ranks.
        # Plain SUM reductions: gloo has no PREMUL_SUM (what a factor would use).
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return root


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole on every rank (a plain tensor as is), on the CPU."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().cpu().clone()


class ShardedTrainingClient(LocalTrainingClient):
    """One rank's part of a sharded trainer; every public call is collective."""

    def __init__(
        self,
        root: _LogprobRoot,
        shadow: PeftModel | PreTrainedModel | None,
        **options: Any,
    ) -> None:
        """``root``: the sharded model (:func:`shard`); ``shadow``: rank 0's unsharded copy
        (None on the other ranks); ``options``: :class:`LocalTrainingClient`'s."""
        options["compile_choice"] = NOT_COMPILED
        # Every rank must issue the same collectives in the same order: the shared-prefix
        # path runs the decoder twice, and only on a rank whose datums share a prefix.
        options["share_prefix"] = False
        super().__init__(model=cast("PeftModel | PreTrainedModel", root.model), **options)
        self.root = root
        self.world = distributed.world()
        self.writes_files = self.world.driver
        self.shadow = shadow
        if shadow is not None:
            lm = getattr(shadow, "get_base_model", lambda: shadow)()
            self.snapshots = SnapshotPool(
                shadow, lm, self._names, self._lock, self.lora is None, self.sampler_dtype
            )

    # -- the forward pass: through the FSDP root -------------------------------
    def _logprobs(self, batch: PaddedBatch) -> torch.Tensor:
        return cast(torch.Tensor, self.root(batch, self.logits_chunk_tokens, self.share_prefix))

    def _run(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        config: Mapping[str, float] | None,
        backward: bool,
        loss_scale: float = 1.0,
    ) -> ForwardBackwardOutput:
        """This rank's share of ``data``; rank 0 gets the whole call's output."""
        self._check(data, loss_fn)
        parts = distributed.split_by_tokens([d.model_input.length for d in data], self.world.size)
        own = parts[self.world.rank]
        mine: tuple[list[Any], dict[str, float] | None]
        if own:
            out = super()._run([data[i] for i in own], loss_fn, config, backward, loss_scale)
            mine = ([o["logprobs"].to_numpy() for o in out.loss_fn_outputs], out.metrics)
        else:  # nothing of its own: take part in the collectives, add nothing
            super()._run(data[:1], loss_fn, config, backward, 0.0)
            mine = ([], None)
        gathered = distributed.gather_to_driver(mine)
        if gathered is None:
            return ForwardBackwardOutput((), {})
        per_datum: list[dict[str, TensorData]] = [{} for _ in data]
        for indices, (arrays, _) in zip(parts, gathered, strict=True):
            for index, array in zip(indices, arrays, strict=True):
                per_datum[index] = {"logprobs": TensorData.from_numpy(array)}
        metrics = distributed.merge_metrics([m for _, m in gathered if m is not None])
        return ForwardBackwardOutput(tuple(per_datum), metrics)

    def _clip_gradients(self, limit: float) -> float:
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in self._params if p.grad is not None]
        if not grads:
            return 0.0
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(norm, DTensor):  # partial norms of the shards, reduced
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(
            [p for p in self._params if p.grad is not None], limit, norm
        )
        return float(norm)

    # -- weights and optimizer state, gathered and resharded --------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: _full(p) for n, p in zip(self._names, self._params, strict=True)}

    def optimizer_state(self) -> dict[str, Any] | None:
        if self._optimizer is None:
            return None
        state = self._optimizer.state_dict()  # parameter indices, as in one process
        state["state"] = {
            index: {key: _full(value) for key, value in moments.items()}
            for index, moments in sorted(state["state"].items())
        }
        return state

    def sync_shadow(self) -> None:
        """Gather the trainable weights; rank 0 writes them into its full copy."""
        weights = self.trainable_state()
        if self.shadow is None:
            return
        params = dict(self.shadow.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value.to(params[name].device, params[name].dtype))

    def sampler_model(self) -> PeftModel | PreTrainedModel:
        """Rank 0's full copy as of its last :meth:`sync_shadow` (the driver's
        :meth:`DriverTrainingClient.sampler_model` gathers first); never the shard."""
        if self.shadow is None:
            raise BackendError(f"rank {self.world.rank} holds a shard, not the full model")
        return self.shadow

    def apply_checkpoint(self, loaded: LoadedState | None) -> None:  # type: ignore[override]
        """Rank 0's read checkpoint (None on the others) scattered to every rank's shards."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        def shard_of(param: torch.Tensor, full: torch.Tensor | None) -> torch.Tensor:
            if not isinstance(param, DTensor):
                return full if full is not None else param.detach().clone()
            if full is None:  # its content comes from rank 0
                full = torch.empty(param.shape, dtype=param.dtype, device=param.device)
            full = full.to(param.device, param.dtype)
            return distribute_tensor(full, param.device_mesh, param.placements).to_local()

        with torch.no_grad():
            for name, param in zip(self._names, self._params, strict=True):
                full = loaded.weights[name] if loaded is not None else None
                local = shard_of(param, full)
                cast(Any, param).to_local().copy_(local)
        # The optimizer part: its layout first (small), then each moment scattered.
        skeleton = None
        if loaded is not None:
            optimizer = loaded.training["optimizer"] if loaded.training else None
            skeleton = {
                "training": loaded.training is not None,
                "steps": loaded.steps,
                "optimizer": None
                if optimizer is None
                else {
                    "param_groups": optimizer["param_groups"],
                    "state": {
                        index: {k: (None if v.dim() > 0 else v) for k, v in moments.items()}
                        for index, moments in optimizer["state"].items()
                    },
                },
            }
        skeleton = distributed.broadcast_object(skeleton)
        if not skeleton["training"]:
            self._optimizer = None
            return
        if skeleton["optimizer"] is None:
            self._optimizer = None
        else:
            full_state = loaded.training["optimizer"]["state"] if loaded and loaded.training else {}
            state: dict[int, dict[str, Any]] = {}
            for index, moments in sorted(skeleton["optimizer"]["state"].items()):
                param = self._params[index]
                state[index] = {}
                for key, value in moments.items():
                    if value is not None:  # a scalar (the step count): as is
                        state[index][key] = value
                        continue
                    full = full_state[index][key] if full_state else None
                    local = shard_of(param, full)
                    state[index][key] = (
                        DTensor.from_local(local, param.device_mesh, param.placements)
                        if isinstance(param, DTensor)
                        else local
                    )
            self._optimizer = torch.optim.AdamW(self._params)
            self._optimizer.load_state_dict(
                {"state": state, "param_groups": skeleton["optimizer"]["param_groups"]}
            )
        if loaded is not None and loaded.training is not None:
            restore_rng(loaded.training)  # the driver's generators (the others draw none)
        self.steps = int(skeleton["steps"])

    # -- every call, in the driver's order (see DriverTrainingClient) -----------
    def collective(self, method: str, *args: Any) -> Any:
        """Run one broadcast call: ``method`` of :data:`COLLECTIVE_CALLS` on this rank."""
        if method not in COLLECTIVE_CALLS:
            raise ValueError(f"not a collective call: {method!r}")
        if method == "forward":
            return self.forward(*args).result()
        if method == "forward_backward":
            return self.forward_backward(*args).result()
        if method == "optim_step":
            return self.optim_step(*args).result()
        if method == "save_state":
            return self.save_state(*args).result()
        if method == "sync_shadow":
            return run_in_worker(self._locked(self.sync_shadow))
        if method == "load":
            return run_in_worker(self._locked(lambda: self.apply_checkpoint(*args)))
        raise AssertionError(method)

    def _locked(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with self._lock:
                return fn()

        return run


COLLECTIVE_CALLS = frozenset(
    {"forward", "forward_backward", "optim_step", "save_state", "sync_shadow", "load"}
)


class DriverTrainingClient:
    """Rank 0's training client: each call checked here, broadcast, run by every rank.

    The contract of ``retool.types.TrainingClient``; attributes the session
    reads (``max_context_tokens``, ``compile``, ``steps``...) are the local
    client's. Calls are serialised by one lock from broadcast to result, so
    every rank runs them in the same order.
    """

    def __init__(self, local: ShardedTrainingClient, key: int) -> None:
        self.local = local
        self.key = key  # the serving ranks' name for their part of this client
        self._order = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)

    def _collective(self, method: str, *args: Any) -> Any:
        with self._order:
            return _announced(
                ("call", self.key, method, args), self.local.collective, method, *args
            )

    def _future(self, method: str, *args: Any) -> Future[Any]:
        return Future.run(lambda: self._collective(method, *args))

    def forward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
    ) -> Future[ForwardBackwardOutput]:
        return self._checked(data, loss_fn, "forward", loss_fn_config)

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None = None
    ) -> Future[ForwardBackwardOutput]:
        return self._checked(data, loss_fn, "forward_backward", loss_fn_config)

    def _checked(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        method: str,
        config: Mapping[str, float] | None,
    ) -> Future[ForwardBackwardOutput]:
        try:
            self.local._check(data, loss_fn)  # refused here: no rank has started
        except Exception as exc:
            return Future.failed(exc)
        return self._future(method, list(data), loss_fn, dict(config) if config else None)

    def optim_step(self, adam_params: AdamParams) -> Future[OptimStepOutput]:
        return self._future("optim_step", adam_params)

    def save_state(self, name: str) -> Future[SaveStateOutput]:
        return self._future("save_state", name)

    def load_state(self, path: str) -> Future[None]:
        return self._load(Path(path), False)

    def load_state_with_optimizer(self, path: str) -> Future[None]:
        return self._load(Path(path), True)

    def _load(self, root: Path, with_optimizer: bool) -> Future[None]:
        try:  # read and checked on rank 0 first: a damaged checkpoint starts no collective
            loaded = run_in_worker(lambda: self.local.read_checkpoint(root, with_optimizer))
        except Exception as exc:
            return Future.failed(exc)
        with self._order:
            call = ("call", self.key, "load", (None,))
            return Future.run(lambda: _announced(call, self.local.collective, "load", loaded))

    def save_weights_for_sampler(self, name: str, merge: bool = False) -> Future[SaveStateOutput]:
        """Every rank gathers the weights into rank 0's full copy, which writes them."""
        try:
            self._collective("sync_shadow")
        except Exception as exc:
            return Future.failed(exc)
        return self.local.save_weights_for_sampler(name, merge)

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> LocalSamplingClient:
        self._collective("sync_shadow")
        return self.local.save_weights_and_get_sampling_client(name)

    def sampler_model(self) -> PeftModel | PreTrainedModel:
        """Every rank gathers the weights into rank 0's full copy, which is returned
        (the in-process vLLM engine exports and reloads it)."""
        self._collective("sync_shadow")
        return self.local.sampler_model()

    def get_tokenizer(self) -> Tokenizer:
        return self.local.get_tokenizer()


def _announced(call: tuple[Any, ...], run: Callable[..., Any], *args: Any) -> Any:
    """Rank 0: broadcast ``call``, then take its own part, ``run(*args)``, as one step.

    Both run in one worker thread (``threads.run_in_worker``), so a stop signal that
    reaches rank 0 meanwhile is raised only once its part is done: the serving ranks,
    which run every call they receive, never wait in a collective rank 0 has left, and
    the interrupt's own calls (the emergency checkpoint) find every rank at a call's
    boundary.
    """

    def step() -> Any:
        distributed.send(call)
        return run(*args)

    return run_in_worker(step)


_keys = iter(range(1, 1 << 62))


def sharded_trainer(
    service: LocalServiceClient,
    model: PeftModel | PreTrainedModel,
    lora: LoraSpec | None,
    seed: int | None,
    options: dict[str, Any],
) -> Any:
    """The training client of ``model`` on this rank: rank 0 announces it (the others
    build their own from the announcement, ``service.serve_calls``), then every rank shards
    its copy. Returns a :class:`DriverTrainingClient` on rank 0."""
    me = distributed.world()
    key = next(_keys)

    def build() -> ShardedTrainingClient:
        import torch.distributed as dist

        with torch.no_grad():  # rank 0's initial weights everywhere (a LoRA drawn unseeded)
            for param in model.parameters():
                if param.requires_grad:
                    dist.broadcast(param.data, src=0)
        shadow = None
        if me.driver:
            shadow = copy.deepcopy(model)
            shadow.requires_grad_(False)
        lm = cast("PreTrainedModel", getattr(model, "get_base_model", lambda: model)())
        root = shard(model, lm, service.device, options["autocast_dtype"] is not None)
        return ShardedTrainingClient(root, shadow, lora=lora, **options)

    if not me.driver:
        return run_in_worker(build)
    service_options = {**service.options, "numerics": service.numerics}
    call = ("build", key, service_options, options["base_model"], lora, seed)
    return DriverTrainingClient(_announced(call, build), key)
