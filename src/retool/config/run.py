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
        if self.rollout.max_trajectory_tokens > self.train.max_train_tokens:
            raise ConfigError(
                f"rollout.max_trajectory_tokens ({self.rollout.max_trajectory_tokens}) must be "
                f"<= train.max_train_tokens ({self.train.max_train_tokens}): longer trajectories "
                "could be sampled but never trained on"
            )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)
