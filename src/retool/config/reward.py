"""``[reward]``: how answers are scored, within the verifier workers' limits."""

from __future__ import annotations

import re
from dataclasses import dataclass

from retool.checks import check_path_text
from retool.config.fields import check_range
from retool.errors import ConfigError
from retool.limits import REWARD_MAX_TIMEOUT_S, REWARD_MAX_WORKERS


@dataclass(frozen=True)
class RewardConfig:
    """How answers are scored."""

    timeout: float = 5.0  # seconds per equivalence check, in (0, 3600]; a timeout scores -1
    workers: int = 2  # verifier processes, in [1, 256]
    function: str = ""  # "package.module:function" for a custom reward; "" = boxed answer

    def __post_init__(self) -> None:
        check_range(
            "reward", "timeout", self.timeout, 0, REWARD_MAX_TIMEOUT_S, integer=False, low_open=True
        )
        check_range("reward", "workers", self.workers, 1, REWARD_MAX_WORKERS, integer=True)
        check_path_text("reward.function", self.function, empty=True)
        if self.function and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.function):
            raise ConfigError(
                "reward.function must look like 'package.module:function' (or \"\" for the "
                f"boxed-answer reward), got {self.function!r}"
            )
