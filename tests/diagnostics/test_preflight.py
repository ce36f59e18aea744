"""``retool preflight``: the verdicts from scripted rollouts, the projection, and the real
command on ``tiny-random`` (``--init-from`` a checkpoint)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from retool.config import load_config
from retool.data.examples import MathExample
from retool.diagnostics.preflight import assess, project_step
from retool.reward import load_reward_function
from retool.rollout import rollout_batch
from retool.training.cost import prefill_split, sampled_tokens
from retool.training.datum import build_training_datums
from tests.builders import TINY_RUN, scripted_rollout, write_run_toml
from tests.rollout.fakes import FakeSandbox, ScriptedSampler, answer_text, call_text

ROOT = Path(__file__).resolve().parents[2]
RETOOL = ROOT / ".venv" / "bin" / "retool"
QUESTIONS = [
    MathExample("q1", "What is 2^10?", "1024"),
    MathExample("q2", "What is 3^5?", "243"),
]
VERDICT = re.compile(r"^(GO|NO-GO|SFT recommended): ")


def exact(text: str, reference: str) -> float:
    return 1.0 if text.rstrip().endswith(f"\\boxed{{{reference}}}.") else -1.0


def reference(call) -> str:
    return "1024" if "2^10" in call.prompt_text else "243"


def code_then_half_right(call) -> str:
    """A call naming the sample, then the right answer for even samples, a wrong one for odd."""
    if call.turn == 0:
        return call_text(f"print({call.index})")
    sample = int(re.findall(r"print\((\d+)\)", call.prompt_text)[-1])
    return answer_text(reference(call) if sample % 2 == 0 else "0")


def no_tool_half_right(call) -> str:
    return answer_text(reference(call) if call.index % 2 == 0 else "0")


def code_then_right(call) -> str:
    return call_text("print(1)") if call.turn == 0 else answer_text(reference(call))


def preflight(tokenizer, script, *overrides: str):
    config = load_config(None, ["rollout.group_size=4", "train.questions_per_batch=2", *overrides])
    sampler = ScriptedSampler(tokenizer, script)
    rollout = scripted_rollout(group_size=4, max_trajectory_tokens=2048)
    scorer = load_reward_function("tests.diagnostics.test_preflight:exact")
    result = rollout_batch(
        sampler, tokenizer, FakeSandbox(lambda code: "1\n"), QUESTIONS, rollout, scorer=scorer
    )
    trained = sum(d.num_tokens for d in build_training_datums(result.trajectories, 8192))
    return assess(result, config, trained=trained, model="scripted"), result, trained


def test_verdicts(smol_tokenizer):
    go, result, trained = preflight(smol_tokenizer, code_then_half_right)
    assert go.go and go.verdict.startswith("GO: 8 of 8 trajectories ran the tool, 2 of 2 groups")
    assert go.valid_tool_call_rate == 1.0 and go.sandbox_calls == 8 == go.sandbox_ok
    assert go.lines()[-1] == go.verdict and trained > 0
    # Sample sizes equal the run's: the projected step is the sample itself.
    assert go.per_step.prefill == sum(prefill_split(result.trajectories))
    assert go.per_step.sampled == sampled_tokens(result.trajectories)
    assert go.per_step.trained == trained

    sft, _, _ = preflight(smol_tokenizer, no_tool_half_right)
    assert sft.verdict == "SFT recommended: 0 of 8 trajectories called the tool" and not sft.go

    alike, _, trained = preflight(smol_tokenizer, code_then_right)
    assert alike.verdict.startswith("NO-GO: every group scored alike (2 all right, 0 all wrong)")
    assert trained == 0 and alike.per_step.trained == 0


def test_projection_scales_to_the_run_and_prices_it(smol_tokenizer):
    prices = ["cost.prefill_price=1", "cost.sample_price=2", "cost.train_price=4"]
    limit = ["cost.max_tokens=100000", "train.steps=1000"]
    report, result, trained = preflight(
        smol_tokenizer,
        code_then_half_right,
        "train.questions_per_batch=4",
        "rollout.group_size=8",
        *prices,
        *limit,
    )
    first, later = prefill_split(result.trajectories)
    # Twice the questions (first requests) and four times the trajectories (everything else).
    assert report.per_step.prefill == first * 2 + later * 4
    assert report.per_step.sampled == sampled_tokens(result.trajectories) * 4
    assert report.per_step.trained == trained * 4
    step = report.per_step
    assert report.step_money == (step.prefill + 2 * step.sampled + 4 * step.trained) / 1e6
    assert report.affordable_steps == 100000 // step.total < 1000
    assert any("stops the run after about" in w for w in report.warnings)
    assert report.per_run == step.scaled(1000)
    assert project_step(result, trained, 2, 4) == report.sample  # the sample's own sizes


@pytest.mark.slow  # runs many processes: started first under workers
def test_console_script_on_tiny_random_from_a_checkpoint(tmp_path):
    from retool.backends.local import LocalServiceClient

    service = LocalServiceClient(checkpoint_root=tmp_path / "ckpt")
    trainer = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    state = trainer.save_state("start").result().path
    config = write_run_toml(
        tmp_path / "run.toml",
        TINY_RUN,
        rollout={"group_size": 2, "max_assistant_tokens": 8},
        sandbox={"max_workers": 1},
        reward={"function": "tests.training.rewards:even_length"},
        train={"steps": 10, "questions_per_batch": 4, "micro_batch_tokens": 2048},
        cost={"sample_price": 2.0, "prefill_price": 0.5, "train_price": 3.0, "currency": "EUR"},
    )
    done = subprocess.run(
        [
            str(RETOOL),
            "preflight",
            "--config",
            str(config),
            "--questions",
            "2",
            "--group-size",
            "3",
            "--init-from",
            str(state),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = done.stdout.strip().splitlines()
    assert lines and VERDICT.match(lines[-1]), done.stdout + done.stderr
    assert done.returncode == (0 if lines[-1].startswith("GO") else 1)
    assert lines[0] == f"policy {state}: 2 questions x 3 = 6 trajectories"
    per_step = next(line for line in lines if line.startswith("per step (proj.)"))
    assert "EUR" in per_step and "prefill" in per_step
    assert any(line.startswith("per run  (proj.)") and "(10 steps)" in line for line in lines)
    # The chosen numerics and their measured mismatch (fp32 here: within the 1e-4 contract).
    numerics = next(line for line in lines if line.startswith("numerics"))
    kl = float(numerics.split("sampler_kl ")[1].split()[0])
    assert "sampler float32" in numerics and abs(kl) < 1e-4, numerics
