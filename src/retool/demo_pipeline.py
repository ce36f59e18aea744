"""Reference trajectories: the pipeline driven by known-good tool calls.

Before any model is sampled, the data flow of a rollout can be exercised end to
end with the demo dataset's own solutions standing in for the model: render the
prompt, write the call in the dialect, parse it back, execute it, append the
observation token-exactly, answer, and score. ``retool demo`` prints it; tests
use it to check that every stage agrees with the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from retool.config import RunConfig
from retool.data.demo import DemoProblem
from retool.protocol import ParseKind, get_protocol
from retool.reward import score_many
from retool.sandbox import LocalSandbox, format_tool_content


@dataclass(frozen=True)
class WalkthroughReport:
    """Counts from one reference walkthrough."""

    total: int  # trajectories built
    correct: int  # scored +1
    tool_calls: int  # code executions
    tokens: int  # tokens in all final sequences


def write_call(protocol: str, code: str) -> str:
    """The assistant text that calls the tool with ``code`` in ``protocol``."""
    import json

    if protocol == "markdown":
        return f"I will compute this with Python.\n```python\n{code}\n```\n"
    if protocol == "hermes_json":
        payload = json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
        return f"I will compute this with Python.\n<tool_call>\n{payload}\n</tool_call>"
    return (
        "I will compute this with Python.\n<tool_call>\n<function=code_interpreter>\n"
        f"<parameter=code>\n{code}\n</parameter>\n</function>\n</tool_call>"
    )


def reference_walkthrough(
    config: RunConfig, problems: Sequence[DemoProblem], log: Callable[[str], None] = lambda _: None
) -> WalkthroughReport:
    from retool.backends.local.models import load_tokenizer

    dialect = get_protocol(config.rollout.protocol)
    tokenizer = load_tokenizer(config.model.base_model)
    sandbox = LocalSandbox(
        timeout=config.sandbox.timeout,
        memory_mb=config.sandbox.memory_mb,
        max_workers=1,
        isolation=config.sandbox.isolation,
        max_output_bytes=config.sandbox.max_output_bytes,
    )
    log(
        f"[sandbox] isolation level {sandbox.isolation_level}; preloaded "
        f"{', '.join(sandbox.preloaded)}"
    )
    log(f"[protocol] {dialect.name}: stop sequences {dialect.stop_sequences(tokenizer)}")
    finals: list[str] = []
    tool_calls = tokens = 0
    for index, problem in enumerate(problems):
        messages = dialect.initial_messages(problem.question, tokenizer)
        prompt = dialect.render_prompt(tokenizer, messages)
        call_text = write_call(dialect.name, problem.solution)
        parsed = dialect.parse(call_text)
        if parsed.kind != ParseKind.TOOL or parsed.code is None:
            raise AssertionError(f"reference call did not parse as a tool call: {parsed}")
        completion = tokenizer.encode(call_text, add_special_tokens=False)
        output = format_tool_content(sandbox.run(parsed.code), config.sandbox.timeout)
        tool_calls += 1
        next_prompt = dialect.continuation(
            tokenizer,
            messages,
            prompt,
            completion,
            dialect.tool_message(f"code-{index}-0-1", output),
        )
        answer = f"The interpreter printed {output.strip()}.\n\\boxed{{{output.strip()}}}"
        final = next_prompt + tokenizer.encode(answer, add_special_tokens=False)
        tokens += len(final)
        finals.append(answer)
        if index == 0:
            delta = next_prompt[len(prompt) + len(completion) :]
            log(f"[prompt] {len(prompt)} prompt tokens; question: {problem.question}")
            log(
                f"[rollout] turn 1 parsed as {parsed.kind}; code {parsed.code!r} printed "
                f"{output.strip()!r}; next prompt = P1 + C1 + {len(delta)} "
                "template/observation tokens"
            )
    window = sandbox.stats.snapshot_and_reset()
    sandbox.close()
    log(
        f"[sandbox] {window['calls']} calls, success rate {window['success_rate']:.0%}, "
        f"p50 {window['latency_p50_s'] * 1000:.1f} ms"
    )
    results = score_many(
        finals,
        [str(p.answer) for p in problems],
        timeout=config.reward.timeout,
        workers=config.reward.workers,
    )
    for problem, result in zip(problems, results, strict=True):
        log(
            f"[reward] {problem.id} ({problem.family}): answer {result.answer} -> "
            f"{result.reward:+.0f}"
        )
    return WalkthroughReport(
        total=len(problems),
        correct=sum(r.correct for r in results),
        tool_calls=tool_calls,
        tokens=tokens,
    )
