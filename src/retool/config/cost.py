"""``[cost]``: prices of tokens and the run's spend limits."""

from __future__ import annotations

from dataclasses import dataclass

from retool.config.fields import at_least
from retool.errors import ConfigError


@dataclass(frozen=True)
class CostConfig:
    """Spend accounting and the budget stop (:mod:`retool.training.cost`).

    Every step records its tokens whatever this section says; prices turn
    them into money. Three kinds, counted from the step's own data:
    *prefill* (prompt tokens sent to the sampler: each sampling request's
    full prompt, once per request, as a remote service bills it; the local
    prefix cache does not change the count), *sampled* (completion tokens
    received) and *trained* (input tokens of the datums sent to
    ``forward_backward``). A limit stops the run cleanly, with a checkpoint,
    before a step that would take the run past it (the next step is
    projected as the mean of the steps so far); 0 means no limit.
    """

    prefill_price: float = 0.0  # money per million prefill tokens
    sample_price: float = 0.0  # money per million sampled tokens
    train_price: float = 0.0  # money per million trained tokens
    currency: str = "USD"  # label of the money in metrics and log lines
    max_tokens: int = 0  # limit on the run's prefill + sampled + trained tokens; 0 = none
    max_money: float = 0.0  # limit on the run's money (needs a price); 0 = none

    def __post_init__(self) -> None:
        for name in ("prefill_price", "sample_price", "train_price", "max_tokens", "max_money"):
            at_least("cost", name, getattr(self, name), 0)
        if not self.currency.strip():
            raise ConfigError("cost.currency must not be empty")
        if self.max_money > 0 and not self.priced:
            raise ConfigError(
                "cost.max_money needs a price: set cost.prefill_price, cost.sample_price "
                "or cost.train_price (money per million tokens)"
            )

    @property
    def priced(self) -> bool:
        """Whether any price is set (money is recorded only then)."""
        return self.prefill_price > 0 or self.sample_price > 0 or self.train_price > 0
