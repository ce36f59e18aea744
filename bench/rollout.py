"""Rollout scheduling benchmark: no round barrier vs the reference's round barrier.

    .venv/bin/python bench/rollout.py [--questions 8] [--group-size 4] [--token-ms 2]

A scripted sampler replies after ``token_ms`` per generated token (as a remote
service that batches freely would); a scripted sandbox answers in 10 ms,
except that in every round one call takes 2 s (round r = a trajectory's r-th
tool call; the slow one is a fixed trajectory among those that make an r-th
call). Each trajectory makes 0-3 tool calls and then answers; completions are
40-200 tokens. Both schedulers see exactly the same replies and latencies.

* ours: :func:`retool.rollout.rollout_batch` (each trajectory advances alone).
* barrier: the reference's loop, written here with the same dialect, budgets
  and continuation: sample every live trajectory, wait for all; run every tool
  call, wait for all; next round.

The critical path is the slowest single trajectory's own sampling + tool
time: no scheduler can finish earlier. Prints wall time over critical path.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from retool.backends.local.models import load_tokenizer
from retool.config import RolloutConfig
from retool.data.examples import MathExample
from retool.protocol import ParseKind, get_protocol
from retool.rollout import rollout_batch, sample_seed
from retool.sandbox import ExecResult, SandboxStats
from retool.types import ModelInput, SampledSequence, SampleResponse, SamplingParams, StopReason

SLOW_S = 2.0
FAST_S = 0.010


class Plan:
    """What each trajectory does: its number of calls and completion lengths."""

    def __init__(self, questions: int, group: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.calls = {(q, g): rng.randint(0, 3) for q in range(questions) for g in range(group)}
        self.lengths = {
            (q, g, turn): rng.randint(40, 200)
            for (q, g), n in self.calls.items()
            for turn in range(n + 1)
        }
        # Round r's slow call: one fixed trajectory among those that make an r-th call.
        self.slow = {}
        for r in range(3):
            makers = sorted(k for k, n in self.calls.items() if n > r)
            if makers:
                self.slow[r] = makers[rng.randrange(len(makers))]

    def critical_path(self, token_s: float) -> float:
        worst = 0.0
        for (q, g), n in self.calls.items():
            sampling = sum(self.lengths[q, g, t] for t in range(n + 1)) * token_s
            tools = sum(SLOW_S if self.slow.get(r) == (q, g) else FAST_S for r in range(n))
            worst = max(worst, sampling + tools)
        return worst


class ScriptedSampler:
    """Replies per the plan; identifies the trajectory from markers in the prompt."""

    def __init__(self, tokenizer, plan: Plan, token_s: float) -> None:
        self.tokenizer, self.plan, self.token_s = tokenizer, plan, token_s

    def _text(self, q: int, g: int, turn: int) -> str:
        n = self.plan.lengths[q, g, turn]
        filler = " ".join(["step"] * max(1, n - 20))
        if turn < self.plan.calls[q, g]:
            return f"{filler}\n```python\nprint('Q{q}G{g}T{turn}')\n```\n"
        return f"{filler} \\boxed{{{q}}}"

    async def sample_async(self, prompt: ModelInput, num_samples: int, params: SamplingParams):
        text = self.tokenizer.decode(prompt.to_ints())
        q = int(text.split("Question number ")[1].split(".")[0])
        turn = text.count("<|im_start|>assistant") - 1
        if num_samples > 1:
            groups = list(range(num_samples))
        else:  # the group shows in the last observation: Q{q}G{g}T{turn-1}
            groups = [int(text.rsplit(f"Q{q}G", 1)[1].split("T")[0])]
        sequences = []
        longest = 0
        for g in groups:
            ids = self.tokenizer.encode(self._text(q, g, turn), add_special_tokens=False)
            longest = max(longest, len(ids))
            sequences.append(SampledSequence(tuple(ids), (-1.0,) * len(ids), None, StopReason.STOP))
        await asyncio.sleep(longest * self.token_s)
        return SampleResponse(tuple(sequences))


class ScriptedSandbox:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.stats = SandboxStats()
        self.timeout = 10.0

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        tag = code.split("'")[1]  # Q{q}G{g}T{turn}
        q, rest = tag[1:].split("G")
        g, turn = rest.split("T")
        slow = self.plan.slow.get(int(turn)) == (int(q), int(g))
        await asyncio.sleep(SLOW_S if slow else FAST_S)
        return ExecResult(True, tag + "\n", "", 0, False, 0.0, False)


def barrier_rollout(sampler, tokenizer, sandbox, examples, config: RolloutConfig) -> None:
    """The reference's schedule: every round waits for its slowest member twice."""
    dialect = get_protocol(config.protocol)
    stop = dialect.stop_sequences(tokenizer)

    async def main() -> None:
        live = []
        for q, example in enumerate(examples):
            messages = dialect.initial_messages(example.question, tokenizer)
            live.append((q, None, messages, dialect.render_prompt(tokenizer, messages)))
        turn = 0
        while live:
            responses = await asyncio.gather(
                *(
                    sampler.sample_async(
                        ModelInput.from_ints(prompt),
                        config.group_size if g is None else 1,
                        SamplingParams(
                            max_tokens=config.max_assistant_tokens,
                            seed=sample_seed(config.seed, 0, q, -1 if g is None else g, turn),
                            stop=stop,
                        ),
                    )
                    for q, g, _, prompt in live
                )
            )
            pending = []
            for (q, g, messages, prompt), response in zip(live, responses, strict=True):
                for index, sequence in enumerate(response.sequences):
                    text = tokenizer.decode(list(sequence.tokens), skip_special_tokens=True)
                    parsed = dialect.parse(text)
                    if parsed.kind == ParseKind.TOOL:
                        branch = index if g is None else g
                        pending.append((q, branch, messages, prompt, sequence, parsed.code, text))
            results = await asyncio.gather(*(sandbox.arun(p[5]) for p in pending))
            live = []
            for (q, g, messages, prompt, sequence, _, text), result in zip(
                pending, results, strict=True
            ):
                message = dialect.tool_message(f"code-{q}-{g}", result.stdout)
                follow = dialect.continuation(
                    tokenizer, messages, prompt, list(sequence.tokens), message
                )
                history = [*messages, {"role": "assistant", "content": text}, message]
                live.append((q, g, history, follow))
            turn += 1

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--token-ms", type=float, default=2.0)
    args = parser.parse_args()
    token_s = args.token_ms / 1000
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    plan = Plan(args.questions, args.group_size)
    examples = [
        MathExample(str(q), f"Question number {q}. What is {q}?", str(q))
        for q in range(args.questions)
    ]
    config = RolloutConfig(
        group_size=args.group_size,
        max_code_calls=4,
        max_assistant_turns=6,
        max_trajectory_tokens=4096,
        max_assistant_tokens=512,
        max_tool_response_tokens=64,
        max_in_flight_samples=4096,
        max_in_flight_tools=4096,
        protocol="markdown",
    )
    critical = plan.critical_path(token_s)
    sampler = ScriptedSampler(tokenizer, plan, token_s)
    started = time.monotonic()
    result = rollout_batch(sampler, tokenizer, ScriptedSandbox(plan), examples, config)
    ours = time.monotonic() - started
    assert all(t.correct for t in result.trajectories), "the script always answers correctly"
    started = time.monotonic()
    barrier_rollout(sampler, tokenizer, ScriptedSandbox(plan), examples, config)
    barrier = time.monotonic() - started
    calls = sum(plan.calls.values())
    print(
        f"{args.questions} questions x {args.group_size}, {calls} tool calls "
        f"({len(plan.slow)} of them take {SLOW_S:g} s), {args.token_ms:g} ms per token"
    )
    print("| scheduler | wall (s) | critical path (s) | wall / critical path |")
    print("| --- | --- | --- | --- |")
    print(f"| ours (no round barrier) | {ours:.2f} | {critical:.2f} | {ours / critical:.2f}x |")
    print(
        f"| round barrier (reference) | {barrier:.2f} | {critical:.2f} | "
        f"{barrier / critical:.2f}x |"
    )


if __name__ == "__main__":
    main()
