"""``[demo]``: what ``retool demo`` runs around the RL steps."""

from __future__ import annotations

from dataclasses import dataclass

from retool.checks import check_path_text
from retool.config.fields import check_range, expand_home


@dataclass(frozen=True)
class DemoConfig:
    """What ``retool demo`` runs around the RL steps (``train.*`` stay the RL settings).

    Only ``retool demo`` reads this section; every other command ignores it, as
    ``retool eval`` ignores ``train.*``. The demo evaluates on two held-out
    splits by default: ``demo:test`` (new numbers, phrasings seen in training)
    and ``demo:paraphrase`` (phrasings no training data uses). The settings
    here were chosen on ``demo:dev``, so the tables it prints are measured on
    problems nothing was tuned on.
    """

    sft_steps: int = 40  # cold-start SFT steps on demonstrations from data.train
    sft_batch: int = 4  # demonstrations per SFT step (40 x 4 beat 20 x 8 and 10 x 16 on demo:dev)
    sft_learning_rate: float = 1e-3  # AdamW learning rate of the cold start
    rl_steps: int = 6  # RL steps from the SFT checkpoint (train.* holds their settings)
    # evaluate the base model too; false skips that phase (the long run: the bundled base
    # model scored 0.0% on both held-out splits in every demo run)
    evaluate_base: bool = True
    eval_dataset: str = "demo:test"  # held-out problems for base / SFT / RL
    # held-out phrasings, evaluated like eval_dataset; "" = none
    paraphrase_dataset: str = "demo:paraphrase"
    eval_n: int = 4  # samples per problem, the same seeds for all three policies
    eval_limit: int = 0  # first this many problems; 0 = all
    eval_temperature: float = 0.7  # sampling temperature of the evaluations
    eval_top_p: float = 1.0  # nucleus mass of the evaluations

    def __post_init__(self) -> None:
        check_range("demo", "sft_steps", self.sft_steps, 0, 10_000, integer=True)
        check_range("demo", "sft_batch", self.sft_batch, 1, 4096, integer=True)
        check_range("demo", "sft_learning_rate", self.sft_learning_rate, 0, 1, low_open=True)
        check_range("demo", "rl_steps", self.rl_steps, 0, 10_000, integer=True)
        check_path_text("demo.eval_dataset", self.eval_dataset)
        check_path_text("demo.paraphrase_dataset", self.paraphrase_dataset, empty=True)
        expand_home(self, "eval_dataset", "paraphrase_dataset")
        check_range("demo", "eval_n", self.eval_n, 1, 1024, integer=True)
        check_range("demo", "eval_limit", self.eval_limit, 0, 10**7, integer=True)
        check_range("demo", "eval_temperature", self.eval_temperature, 0, 100)
        check_range("demo", "eval_top_p", self.eval_top_p, 0, 1, low_open=True)
