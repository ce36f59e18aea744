"""``[data]``: where training and evaluation questions come from."""

from __future__ import annotations

from dataclasses import dataclass

from retool.checks import SEED_MAX, check_path_text
from retool.config.fields import check_range, expand_home


@dataclass(frozen=True)
class DataConfig:
    """Where training and evaluation questions come from."""

    train: str = "demo:train"  # "demo:<split>" or a .jsonl/.parquet path
    dev: str = "demo:dev"  # held-out questions for evaluation
    seed: int = 42  # batch order, in [0, 2**32 - 1]

    def __post_init__(self) -> None:
        check_path_text("data.train", self.train)
        check_path_text("data.dev", self.dev)
        expand_home(self, "train", "dev")
        check_range("data", "seed", self.seed, 0, SEED_MAX, integer=True)
