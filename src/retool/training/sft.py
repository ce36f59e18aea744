"""Cold-start SFT: ``cross_entropy`` on code-interlaced demonstrations (``retool sft``).

ReTool starts RL from a model that has seen the tool used: a few supervised
steps on conversations whose assistant turns call the interpreter and read
its real output. Each conversation is rendered by
:func:`~retool.training.sft_data.render_conversation` through the dialect's
token-exact continuation, so the supervised tokens are laid out exactly as
the RL sampler will produce them; weight 1 sits on assistant tokens only.

The loop is the RL loop's (:class:`~retool.training.session.Session`): the same
run directory, checkpoints, resume and progress. Before the first step every
conversation is rendered once with the trainer's tokenizer
(:func:`~retool.training.sft_data.check_conversations`): a line that does not
render in the dialect, or does not fit ``train.max_train_tokens``, is one
error naming ``file:line`` before anything trains, never a stop at the step
that happens to draw it after earlier steps were committed. ``train.questions_per_batch``
conversations make one step (reshuffled every epoch), and the weights are
scaled by ``train.loss_aggregation`` (``seq_mean``: each conversation weighs
the same, so ``loss:sum`` is the mean per-token NLL of a conversation).
"""

from __future__ import annotations

from pathlib import Path

from retool.config import RunConfig
from retool.data import take_batch
from retool.errors import DataError
from retool.protocol import get_protocol
from retool.training.aggregation import scale_advantages
from retool.training.cost import StepTokens
from retool.training.datum import DatumError
from retool.training.provenance import RunInputs, digest_file
from retool.training.run_dir import RunDirectory
from retool.training.session import Phases, Session
from retool.training.sft_data import (
    build_sft_datum,
    check_conversations,
    numbered_conversations,
)


def sft_summary(step: int, total: int, metrics: dict[str, float]) -> str:
    return (
        f"step {step}/{total}  {metrics['time/step_s']:.1f}s  "
        f"nll {metrics.get('train/loss:sum', 0.0):.4f}  "
        f"{metrics['train/loss_tokens']:.0f} assistant tokens"
    )


def run_sft(
    config: RunConfig,
    data_path: str | Path,
    *,
    run_dir: str | None = None,
    resume: bool = False,
    init_from: str | None = None,
    tracker: str | None = None,
    progress: bool = True,
) -> RunDirectory:
    """Supervised fine-tuning on the conversations in ``data_path``; returns the run directory."""
    cfg = config.train
    numbered = numbered_conversations(data_path)
    conversations = [conversation for _, conversation in numbered]
    session = Session(
        config,
        run_dir=run_dir,
        resume=resume,
        init_from=init_from,
        tracker=tracker,
        progress=progress,
        per_step=min(cfg.questions_per_batch, len(conversations)),
        unit="conv",
        inputs=RunInputs("sft", str(data_path), digest_file(data_path)),
    )
    dialect = get_protocol(config.rollout.protocol)
    tokenizer = session.trainer.get_tokenizer()
    with session.running():
        # every line, before step 1 (on --resume too): no step commits from a file that fails
        check_conversations(data_path, numbered, dialect, tokenizer, cfg.max_train_tokens)
        for step in session.steps():
            session.display.new_step("rendering")
            phases = Phases(session.display.phase)
            batch = take_batch(conversations, cfg.questions_per_batch, step - 1, config.data.seed)
            with phases("datums"):
                try:
                    datums = [
                        build_sft_datum(c, dialect, tokenizer, cfg.max_train_tokens, index=i)
                        for i, c in enumerate(batch)
                    ]
                except DatumError as exc:
                    raise DataError(f"{data_path}: {exc}") from None
                datums = scale_advantages(datums, cfg.loss_aggregation, len(datums))
                micro_batches = session.pack(datums)
            session.display.advance(len(batch))
            records = [{"id": c.id, "messages": list(c.messages)} for c in batch]
            # from the optim_step's submission (hold) to the manifest line a signal waits
            with session.guard.deferred_from() as hold:
                metrics, optim = session.update(
                    step, micro_batches, "cross_entropy", None, phases, hold
                )
                hold()
                metrics["sft/conversations"] = float(len(batch))
                metrics.update(optim)
                tokens = StepTokens(trained=int(metrics["train/tokens"]))
                checkpoint = session.checkpoint_if_due(step, phases)
                session.commit(step, metrics, phases, records, tokens)
                session.add_checkpoint(step, checkpoint)
            session.report(step, metrics, tokens, summary=sft_summary)
    return session.run
