"""``[model]``: which model and backend train, checked against the services' limits.

The LoRA ranks PyTRIO and Tinker accept come from :mod:`retool.limits`, where
their service clients read them too: the config imports no backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from retool.checks import check_device
from retool.config.fields import check_range
from retool.errors import ConfigError
from retool.limits import check_pytrio_rank, check_tinker_rank

LOSS_REDUCTIONS = ("auto", "sum", "active_token_mean", "advantage_token_mean")


@dataclass(frozen=True)
class ModelConfig:
    """Which model and backend to train.

    ``backend = "local"`` trains on this machine; ``"pytrio"`` and ``"tinker"``
    on those training services through their SDKs (the ``pytrio`` / ``tinker``
    extras; :mod:`retool.backends.remote`). The services train LoRA adapters
    only: ``lora_rank`` in [4, 64] on PyTRIO (its SDK refuses other ranks before
    any request), >= 1 on Tinker; ``base_model`` is the service's model name
    (``"Qwen/Qwen3-8B"``); ``device``, ``dtype`` and ``compile`` (:mod:`retool.backends.
    local.compiled`) are the local backend's.

    ``loss_reduction`` says how the service reduces the per-token losses of
    one ``forward_backward`` call. Our contract is their *sum*
    (:mod:`retool.types`); for a service that divides by a count, the adapter
    multiplies the advantages (cross-entropy: the weights) by that same count,
    which gives the same update for the same advantages on every backend:

    * ``sum``: the service sums; advantages are sent unchanged. The local
      backend sums, and so does Tinker: its SDK relies on "Backend CE is
      L = sum(-logprobs * weights)" and sums ``loss:sum`` over chunks
      (tinker/lib/public_interfaces/training_client.py: ``_compute_custom_loss``;
      tinker/lib/chunked_fwdbwd_helpers.py).
    * ``active_token_mean``: divides by the call's ``total_active_tokens``:
      positions whose target is not -100 (every position of our datums, prompt
      and observation positions included), for cross-entropy only those with a
      non-zero weight.
    * ``advantage_token_mean``: divides by ``total_advantage_tokens``, the
      positions with a non-zero advantage (cross-entropy: as above).
    * ``auto`` (default): ``sum`` on local and Tinker, ``active_token_mean`` on
      PyTRIO.

    Why ``active_token_mean`` for PyTRIO: its service code is not public and
    was unreachable when the adapter was written, so this rests on the SDK
    (``pytrio`` 0.2.9). Every chunk of a call carries the whole call's
    ``total_samples``, ``total_active_tokens`` and ``total_advantage_tokens``,
    documented as the global normalisation the trainer uses to compute the
    equivalent full-batch gradient (pytrio/protocol/actor/events/trainer/
    forward.py: ``GradientAccumulationSpec``); advantage tokens are "the
    separate denominator for DRO and similar normalisation modes", with
    zero-advantage labels counted as active (pytrio/client/training_batch.py:
    ``plan_training_batch``); the SDK's ``forward_backward_custom`` promises
    only the same gradient *direction* as the user's loss (pytrio/client/
    training.py); and results report ``loss_mean = loss_sum / token_count``.
    So a policy loss is divided by the active tokens. Should PyTRIO document
    another reduction, set the matching value here: nothing else changes.
    """

    base_model: str = "smollm2-135m-instruct"  # alias, .gguf file, HF directory or service name
    backend: str = "local"  # local | pytrio | tinker
    lora_rank: int = 32  # LoRA rank, in [0, 4096]; 0 trains all weights (local backend only)
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | float32 | bfloat16
    compile: str = "auto"  # auto | on | off: fused element-wise kernels for the local trainer
    loss_reduction: str = "auto"  # auto | sum | active_token_mean | advantage_token_mean

    def __post_init__(self) -> None:
        if self.backend not in {"local", "pytrio", "tinker"}:
            raise ConfigError(
                f"model.backend must be one of local, pytrio, tinker; got {self.backend!r}"
            )
        # a rank past any hidden size is a typo: it would end in a failed allocation
        check_range("model", "lora_rank", self.lora_rank, 0, 2**12, integer=True)
        check_device(self.device)
        if self.dtype not in {"auto", "float32", "bfloat16", "float16"}:
            raise ConfigError(
                f"model.dtype must be auto, float32, bfloat16 or float16; got {self.dtype!r}"
            )
        if self.compile not in {"auto", "on", "off"}:
            raise ConfigError(f"model.compile must be auto, on or off; got {self.compile!r}")
        if self.loss_reduction not in LOSS_REDUCTIONS:
            raise ConfigError(
                f"model.loss_reduction must be one of {', '.join(LOSS_REDUCTIONS)}; "
                f"got {self.loss_reduction!r}"
            )
        if self.backend == "local" and self.loss_reduction not in ("auto", "sum"):
            raise ConfigError(
                "model.loss_reduction describes a remote service; the local backend sums "
                f'(use "auto" or "sum"), got {self.loss_reduction!r}'
            )
        if self.backend != "local":
            if self.compile == "on":
                raise ConfigError(
                    f"model.compile = on describes the local trainer; {self.backend} compiles "
                    'its own kernels (use "auto" or "off")'
                )
            if self.lora_rank == 0:
                raise ConfigError(
                    f"model.lora_rank = 0 (full fine-tuning) is not offered by {self.backend}: "
                    "it trains LoRA adapters; set model.lora_rank (for example 32)"
                )
            check_rank = check_pytrio_rank if self.backend == "pytrio" else check_tinker_rank
            check_rank(self.lora_rank)
