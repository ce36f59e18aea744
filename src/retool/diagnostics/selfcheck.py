"""The pipeline self-check: reference solutions stand in for the model.

Before any model is sampled, the data flow of a rollout is exercised end to
end with known-good tool calls: render the prompt in the configured dialect,
write the reference solution as a call, parse it back, execute it in the
configured sandbox, append the observation token-exactly
(``dialect.continuation``), answer with what the code printed, and score it
with the reward. Every stage must agree with the others, so a wrong stop
sequence, a parser that drops the code, a sandbox that cannot import
``math`` or a reward that rejects an exact integer shows up in seconds, with
the stage that failed named, instead of as a flat reward curve an hour into
a run. ``retool demo`` runs it first; the tests run it for every dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from retool.config import RunConfig
from retool.data.demo import DemoProblem
from retool.protocol import ParseKind, get_protocol
from retool.reward import score_many
from retool.sandbox import format_tool_content, open_sandbox
from retool.training.sft_data import write_call_text


@dataclass(frozen=True)
class SelfCheckReport:
    """Counts from one self-check; ``failures`` names each problem that did not score +1."""

    total: int  # reference trajectories built
    correct: int  # scored +1
    tool_calls: int  # code executions
    tokens: int  # tokens in all final sequences
    failures: tuple[str, ...] = field(default=())  # "<id>: <stage>: <what happened>"

    @property
    def ok(self) -> bool:
        return self.correct == self.total and not self.failures


def run_selfcheck(
    config: RunConfig,
    problems: Sequence[DemoProblem],
    *,
    log: Callable[[str], None] = lambda _: None,
) -> SelfCheckReport:
    """Drive ``problems``' reference solutions through prompt, parse, sandbox and reward."""
    # here, not at the top: retool.backends.local imports torch (seconds to load)
    from retool.backends.local.models import load_tokenizer

    dialect = get_protocol(config.rollout.protocol)
    tokenizer = load_tokenizer(config.model.base_model)
    failures: list[str] = []
    finals: list[str] = []
    tool_calls = tokens = 0
    with open_sandbox(config.sandbox) as sandbox:
        level = getattr(sandbox, "isolation_level", "?")
        log(f"sandbox: isolation {level}; protocol {dialect.name}")
        for index, problem in enumerate(problems):
            messages = dialect.initial_messages(problem.question, tokenizer)
            prompt = dialect.render_prompt(tokenizer, messages)
            call_text = write_call_text(
                dialect, "I will compute this with Python.", problem.solution
            )
            parsed = dialect.parse(call_text)
            if parsed.kind != ParseKind.TOOL or parsed.code is None:
                failures.append(f"{problem.id}: parse: the call parsed as {parsed.kind}")
                finals.append("")
                continue
            completion = tokenizer.encode(call_text, add_special_tokens=False)
            result = sandbox.run(parsed.code)
            tool_calls += 1
            output = format_tool_content(result, config.sandbox.timeout)
            if not result.ok:
                failures.append(f"{problem.id}: sandbox: {output.strip()[:200]}")
            next_prompt = dialect.continuation(
                tokenizer,
                messages,
                prompt,
                completion,
                dialect.tool_message(f"code-{index}-0-1", output),
            )
            if next_prompt[: len(prompt) + len(completion)] != prompt + completion:
                failures.append(f"{problem.id}: continuation: the next prompt is not P1 + C1 + D1")
            answer = f"The interpreter printed {output.strip()}.\n\\boxed{{{output.strip()}}}"
            tokens += len(next_prompt) + len(tokenizer.encode(answer, add_special_tokens=False))
            finals.append(answer)
            if index == 0:
                delta = len(next_prompt) - len(prompt) - len(completion)
                log(
                    f"first problem: {len(prompt)} prompt tokens, the call parsed as "
                    f"{parsed.kind}, the code printed {output.strip()!r}, next prompt = "
                    f"P1 + C1 + {delta} template/observation tokens"
                )
        window = sandbox.stats.snapshot_and_reset()
    log(
        f"sandbox: {window['calls']} calls, success rate {window['success_rate']:.0%}, "
        f"p50 {window['latency_p50_s'] * 1000:.1f} ms"
    )
    results = score_many(
        finals,
        [str(p.answer) for p in problems],
        timeout=config.reward.timeout,
        workers=config.reward.workers,
    )
    for problem, scored in zip(problems, results, strict=True):
        if not scored.correct and not any(f.startswith(f"{problem.id}:") for f in failures):
            failures.append(f"{problem.id}: reward: {scored.answer!r} scored {scored.reward:+.0f}")
    return SelfCheckReport(
        total=len(problems),
        correct=sum(r.correct for r in results),
        tool_calls=tool_calls,
        tokens=tokens,
        failures=tuple(failures),
    )
