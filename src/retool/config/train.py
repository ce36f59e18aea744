"""``[train]``: the optimisation loop, its optimizer, batches, checkpoints and evaluations."""

from __future__ import annotations

from dataclasses import dataclass

from retool.checks import SEED_MAX, check_path_text
from retool.config.fields import check_range, expand_home
from retool.errors import ConfigError


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop (defaults are the reference's)."""

    steps: int = 20  # training steps (updates_per_step optimizer steps each), in [1, 10**7]
    questions_per_batch: int = 8  # questions per step, in [1, 2**16]; trajectories: x group_size
    # optimizer updates per step, each on a contiguous share of the step's groups (PPO
    # mini-batches; retool.training.updates), in [1, questions_per_batch]
    updates_per_step: int = 1
    # overlapped steps (retool.training.overlap): step s samples with the policy after
    # max(0, s - 1 - k) steps while the steps before it train; 0 = rollout then training,
    # in series. In [0, 16]
    max_off_policy_steps: int = 0
    loss: str = "ppo"  # ppo | importance_sampling | cispo
    clip_low: float = 0.8  # PPO/CISPO ratio clip, lower bound (absolute), in (0, 1]
    clip_high: float = 1.28  # PPO/CISPO ratio clip, upper bound (absolute), in [1, 100]
    loss_aggregation: str = "seq_mean"  # seq_mean | token_mean | token_sum
    learning_rate: float = 4e-5  # AdamW, in [0, 1]
    beta1: float = 0.9  # AdamW first-moment decay, in [0, 1)
    beta2: float = 0.95  # AdamW second-moment decay, in [0, 1)
    eps: float = 1e-12  # AdamW epsilon, in (0, 1]
    weight_decay: float = 0.0  # AdamW decoupled weight decay, in [0, 1]
    grad_clip_norm: float = 0.0  # global gradient-norm clip, in [0, 1e6]; 0 disables
    max_train_tokens: int = 8192  # longest datum the trainer accepts, in [1, 2**20]
    micro_batch_tokens: int = 16384  # padded-area budget per forward_backward, [1, 2**24]
    micro_batch_items: int = 32  # datums per forward_backward at most, in [1, 2**16]
    save_every: int = 10  # checkpoint period in steps, in [0, 10**7]; 0: only at the end
    eval_every: int = 0  # evaluate the policy every this many steps, in [0, 10**7]; 0 never
    eval_dataset: str = ""  # problems for those evaluations; "" = data.dev
    eval_n: int = 4  # samples per problem in those evaluations, in [1, 1024]
    eval_limit: int = 0  # first this many problems, in [0, 10**7]; 0 = all
    # also evaluate the starting policy (base or --init-from weights) as step 0, before
    # the first step: the learning curve's first point (needs eval_every)
    eval_at_start: bool = False
    seed: int = 0  # LoRA initialisation, in [0, 2**32 - 1]
    run_dir: str = "runs/default"  # metrics, checkpoints, samples
    # Sampler/trainer numerics (retool.training.numerics): where pi_old comes from, and the
    # rollout correction (auto: none when sampler and trainer are float32, else tis).
    old_logprobs: str = "sampler"  # sampler | recompute (one trainer forward per step)
    rollout_correction: str = "auto"  # auto | none | tis | mis
    rollout_correction_cap: float = 2.0  # C: TIS cap, MIS keeps ratios in [1/C, C]; (1, 100]

    def __post_init__(self) -> None:
        if self.old_logprobs not in ("sampler", "recompute"):
            raise ConfigError(
                f"train.old_logprobs must be sampler or recompute; got {self.old_logprobs!r}"
            )
        if self.rollout_correction not in ("auto", "none", "tis", "mis"):
            raise ConfigError(
                "train.rollout_correction must be auto, none, tis or mis; "
                f"got {self.rollout_correction!r}"
            )
        check_range(
            "train", "rollout_correction_cap", self.rollout_correction_cap, 1, 100, low_open=True
        )
        ints = {  # name: (low, high); every bound is inclusive
            "steps": (1, 10**7),
            "questions_per_batch": (1, 2**16),
            "updates_per_step": (1, 2**16),
            "max_off_policy_steps": (0, 16),
            "max_train_tokens": (1, 2**20),
            "micro_batch_tokens": (1, 2**24),
            "micro_batch_items": (1, 2**16),
            "save_every": (0, 10**7),
            "eval_every": (0, 10**7),
            "eval_n": (1, 1024),
            "eval_limit": (0, 10**7),
            "seed": (0, SEED_MAX),
        }
        for name, (low, high) in ints.items():
            check_range("train", name, getattr(self, name), low, high, integer=True)
        floats: dict[str, tuple[float, float]] = {
            "learning_rate": (0, 1),
            "weight_decay": (0, 1),
            "grad_clip_norm": (0, 1e6),
            "clip_high": (1, 100),
        }
        for name, (lowest, highest) in floats.items():
            check_range("train", name, getattr(self, name), lowest, highest, integer=False)
        check_range("train", "eps", self.eps, 0, 1, integer=False, low_open=True)
        check_range("train", "clip_low", self.clip_low, 0, 1, integer=False, low_open=True)
        for name in ("beta1", "beta2"):
            check_range("train", name, getattr(self, name), 0, 1, integer=False)
            if getattr(self, name) >= 1:
                raise ConfigError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.loss not in ("ppo", "importance_sampling", "cispo"):
            raise ConfigError(
                f"train.loss must be ppo, importance_sampling or cispo; got {self.loss!r}"
            )
        if self.loss_aggregation not in ("seq_mean", "token_mean", "token_sum"):
            raise ConfigError(
                "train.loss_aggregation must be seq_mean, token_mean or token_sum; "
                f"got {self.loss_aggregation!r}"
            )
        if self.updates_per_step > self.questions_per_batch:
            raise ConfigError(
                f"train.updates_per_step ({self.updates_per_step}) must be <= "
                f"train.questions_per_batch ({self.questions_per_batch}): each update trains "
                "on whole groups, at least one"
            )
        if self.max_train_tokens > self.micro_batch_tokens:
            raise ConfigError(
                f"train.max_train_tokens ({self.max_train_tokens}) must be <= "
                f"train.micro_batch_tokens ({self.micro_batch_tokens}): a longest datum "
                "must fit one micro-batch"
            )
        check_path_text("train.eval_dataset", self.eval_dataset, empty=True)
        if self.eval_at_start and not self.eval_every:
            raise ConfigError(
                "train.eval_at_start evaluates step 0 of train.eval_every's evaluations: "
                "set train.eval_every too"
            )
        check_path_text("train.run_dir", self.run_dir)
        expand_home(self, "eval_dataset", "run_dir")
