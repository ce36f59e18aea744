"""Run directories for the report tests: one real, the others written through RunDirectory.

* ``real_run``: two RL steps of ``retool train`` on ``tiny-random`` (in-process,
  once per session), with the custom reward of the training tests so groups get
  mixed rewards and the token colouring has loss-carrying tokens.
* ``crafted_run``: trajectories built as :class:`Trajectory` objects (with
  ids from the real tokenizer) and committed by :meth:`RunDirectory.complete_step`,
  so the files have the exact format of a run: code calls, observations (one
  failed), a group without loss, hostile text (``</script>``, quotes, NUL), and
  metrics with gaps (an update skipped, no sandbox metrics).
* ``sft_run``: conversation records as ``retool sft`` writes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from retool.config import load_config
from retool.data.examples import MathExample
from retool.report.viewer import cached_tokenizer
from retool.rollout import Trajectory
from retool.rollout.types import AssistantTurn, Observation, StopReason
from retool.training.run_dir import RunDirectory, config_to_toml
from tests.builders import run_toml

ROOT = Path(__file__).resolve().parents[2]
RL_CONFIG = run_toml(
    rollout={"group_size": 3},
    train={"micro_batch_tokens": 4000, "micro_batch_items": 8, "save_every": 2},
)
EVIL = '</script><script>alert("pwned")</script> "quoted" \x00 <!-- & <b>bold</b>'
EVIL_QUESTION = 'What is 6*7? <img src=x onerror="alert(1)"> </textarea>'


@pytest.fixture(scope="session")
def real_run(tmp_path_factory) -> Path:
    from retool.training.loop import train

    tmp = tmp_path_factory.mktemp("report-real")
    config_path = tmp / "run.toml"
    config_path.write_text(RL_CONFIG)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))
        patch.setenv("PYTHONPATH", str(ROOT))
        run = train(load_config(config_path), run_dir=str(tmp / "run"), progress=False)
    assert run.completed_steps() == [1, 2]
    return run.path


@pytest.fixture(scope="session")
def real_report(real_run, tmp_path_factory) -> Path:
    """``write_report`` of ``real_run`` (the run's own tokenizer, loaded from its config)."""
    from retool.report import write_report

    return write_report(real_run, output=tmp_path_factory.mktemp("real-report") / "report")


@pytest.fixture(scope="session")
def crafted_report(crafted_run, tmp_path_factory) -> Path:
    from retool.report import write_report

    return write_report(crafted_run, output=tmp_path_factory.mktemp("crafted-report"))


@pytest.fixture(scope="session")
def tokenizer():
    return cached_tokenizer("tiny-random")


def _trajectory(
    tokenizer,
    example: MathExample,
    slot: int,
    group: int,
    texts: list[str],
    observations: list[Observation],
    reward: float,
    advantage: float,
    stop: StopReason = StopReason.ANSWER,
) -> Trajectory:
    """A trajectory of ``texts`` (assistant turns) answered by ``observations``."""
    messages = [{"role": "system", "content": "You are a careful mathematician."}]
    messages.append({"role": "user", "content": example.question})
    prompt = tokenizer.encode("<|im_start|>user\n" + example.question + "<|im_end|>\n")
    turns = []
    for index, text in enumerate(texts):
        completion = tokenizer.encode(text)
        kind = "tool" if index < len(observations) else "answer"
        turns.append(AssistantTurn(list(prompt), completion, [0.0] * len(completion), text, kind))
        messages.append({"role": "assistant", "content": text})
        prompt = prompt + completion
        if index < len(observations):
            body = f"```output\n{observations[index].content}\n```"
            messages.append({"role": "user", "content": body})
            prompt = prompt + tokenizer.encode("<|im_start|>user\n" + body + "<|im_end|>\n")
    return Trajectory(
        example=example,
        group_index=group,
        messages=messages,
        question_index=slot,
        turns=turns,
        observations=observations,
        code_calls=len(observations),
        final_text=texts[-1],
        reward=reward,
        correct=reward > 0,
        valid_format="boxed" in texts[-1],
        answer="42" if reward > 0 else None,
        advantage=advantage,
        stop_reason=stop,
    )


def _observation(call_id: str, code: str, content: str, ok: bool = True) -> Observation:
    return Observation(
        call_id=call_id,
        code=code,
        content=content,
        ok=ok,
        error_kind=None if ok else "timeout",
        latency_s=0.25,
        content_tokens=3,
        template_tokens=5,
    )


@pytest.fixture(scope="session")
def crafted_run(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("report-crafted") / "run"
    config = load_config(None, ['model.base_model="tiny-random"', "rollout.group_size=2"])
    path.mkdir()
    (path / "config.toml").write_text(config_to_toml(config))
    run = RunDirectory(path)
    run.rollouts_dir.mkdir()
    seven = MathExample("demo-test-0001", EVIL_QUESTION, "42")
    other = MathExample("demo-test-0002", "What is 2+2?", "4")
    call = "Let me compute it.\n```python\nprint(6 * 7)\n```\n"
    step_one = [
        _trajectory(
            tokenizer,
            seven,
            0,
            0,
            [call, "The interpreter printed 42.\n\\boxed{42}"],
            [_observation("code-0-0-0", "print(6 * 7)", "42")],
            1.0,
            1.0,
        ),
        _trajectory(tokenizer, seven, 0, 1, [EVIL], [], -1.0, -1.0),
        _trajectory(
            tokenizer,
            other,
            1,
            0,
            ["```python\nwhile True: pass\n```\n", "I give up."],
            [_observation("code-1-0-0", "while True: pass", "TimeoutError", ok=False)],
            -1.0,
            0.0,
        ),
        _trajectory(tokenizer, other, 1, 1, ["No idea."], [], -1.0, 0.0),
    ]
    metrics_one = {"reward/mean": -0.5, "reward/correct": 0.25, "train/update_skipped": 1.0}
    metrics_two = {
        "reward/mean": 0.0,
        "reward/correct": 0.5,
        "train/update_skipped": 0.0,
        "train/loss:sum": 0.5,
        "optim/grad_norm": 1.5,
        "time/rollout_s": 2.0,
        "time/training_s": 3.0,
        "time/step_s": 5.0,
    }
    run.complete_step(1, metrics_one, step_one)
    run.complete_step(2, metrics_two, step_one[:2])
    return path


SFT_RECORDS = [
    {
        "id": "demo-train-0000",
        "messages": [
            {"role": "user", "content": "What is 123 \\times 456? Give the exact integer."},
            {"role": "assistant", "content": "Let me compute this.", "code": "print(123 * 456)"},
            {"role": "tool", "content": "56088\n"},
            {"role": "assistant", "content": "The interpreter printed 56088.\n\\boxed{56088}"},
        ],
    },
    {
        "id": "demo-train-0001",
        "messages": [
            {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "\\boxed{5}"},
        ],
    },
]


@pytest.fixture(scope="session")
def sft_run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report-sft") / "run"
    path.mkdir()
    config = load_config(None, ['model.base_model="tiny-random"'])
    (path / "config.toml").write_text(config_to_toml(config))
    run = RunDirectory(path)
    run.rollouts_dir.mkdir()
    for step in (1, 2):
        metrics = {
            "train/loss:sum": 3.0 / step,
            "train/loss_tokens": 40.0,
            "optim/grad_norm": 2.0,
            "optim/step": float(step),
            "time/datums_s": 0.1,
            "time/training_s": 1.0,
            "time/step_s": 1.1,
            "sft/conversations": 2.0,
        }
        run.complete_step(step, metrics, SFT_RECORDS)
    return path
