"""``RunConfig``: every section together, and the checks that span two of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from retool.config.cost import CostConfig
from retool.config.data import DataConfig
from retool.config.demo import DemoConfig
from retool.config.model import ModelConfig
from retool.config.reward import RewardConfig
from retool.config.rollout import RolloutConfig
from retool.config.sampler import SamplerConfig
from retool.config.sandbox import SandboxConfig
from retool.config.train import TrainConfig
from retool.errors import ConfigError


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs, one field per TOML section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)

    def __post_init__(self) -> None:
        if self.sampler.engine == "vllm" and self.model.backend != "local":
            raise ConfigError(
                f'sampler.engine = "vllm" needs model.backend = "local" (the trainer whose '
                f"weights it syncs); got model.backend = {self.model.backend!r}"
            )
        if (
            self.sampler.engine == "vllm"
            and self.sampler.sync == "lora"
            and not self.model.lora_rank
        ):
            raise ConfigError(
                'sampler.sync = "lora" needs a LoRA trainer (model.lora_rank > 0); with '
                'model.lora_rank = 0 use sampler.sync = "merged"'
            )
        check_lagged_sampler(self)
        if self.rollout.max_trajectory_tokens > self.train.max_train_tokens:
            raise ConfigError(
                f"rollout.max_trajectory_tokens ({self.rollout.max_trajectory_tokens}) must be "
                f"<= train.max_train_tokens ({self.train.max_train_tokens}): longer trajectories "
                "could be sampled but never trained on"
            )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


def check_lagged_sampler(config: RunConfig) -> None:
    """Refuse a sampler that cannot hold two policies while ``train.max_off_policy_steps > 0``.

    An in-process vLLM engine in ``sync = "merged"`` mode holds one set of weights,
    reloaded in place: a newer policy would change the weights under a rollout that
    must sample with an older one. Adapters (``sync = "lora"``, in process or on
    servers) stay loaded side by side. Called at load for ``engine = "vllm"`` and
    again once ``"auto"`` has chosen (:class:`~retool.training.session.Session`).
    """
    if (
        config.train.max_off_policy_steps
        and config.sampler.engine == "vllm"
        and config.sampler.sync == "merged"
    ):
        raise ConfigError(
            f"train.max_off_policy_steps = {config.train.max_off_policy_steps} needs "
            'sampler.sync = "lora" with sampler.engine = "vllm": a merged engine holds one '
            "policy, and overlapped steps sample with an older one while the newest trains"
        )
