"""Spend accounting: tokens counted from known trajectories, money, projections, the budget
stop (a checkpoint, a clean return, a resumable run whose totals survive the resume)."""

from __future__ import annotations

import gzip
import json

import pytest

from retool.config import CostConfig, load_config
from retool.data.examples import MathExample
from retool.errors import ConfigError
from retool.reward import load_reward_function
from retool.rollout import rollout_batch
from retool.training.cost import (
    SpendLedger,
    StepTokens,
    prefill_split,
    prefill_tokens,
    sampled_tokens,
    step_tokens,
)
from retool.training.loop import train
from tests.builders import scripted_rollout
from tests.rollout.fakes import FakeSandbox, ScriptedSampler, answer_text, call_text
from tests.training.test_loop import write_config

QUESTIONS = [
    MathExample("q1", "What is 2^10?", "1024"),
    MathExample("q2", "What is 3^5?", "243"),
]


def two_calls_or_answer(call) -> str:
    """Sample 0 calls the tool twice before answering; the others answer at once."""
    if call.index == 0 and call.turn < 2:
        return call_text(f"print({call.turn} + 1)")
    return answer_text("7")


def exact(text: str, reference: str) -> float:
    return 1.0 if text.endswith(f"{{{reference}}}.") else -1.0


def test_prefill_counts_every_request_once_as_the_sampler_received_it(smol_tokenizer):

    sampler = ScriptedSampler(smol_tokenizer, two_calls_or_answer)
    sandbox = FakeSandbox(lambda code: "1\n")
    config = scripted_rollout(group_size=3, max_trajectory_tokens=2048)
    scorer = load_reward_function("tests.training.test_cost:exact")
    result = rollout_batch(sampler, smol_tokenizer, sandbox, QUESTIONS, config, scorer=scorer)
    trajectories = result.trajectories
    assert any(len(t.turns) > 1 for t in trajectories)  # later turns re-send their history
    # What a service bills: each request's prompt, as the sampler got it.
    assert prefill_tokens(trajectories) == sum(len(r.prompt) for r in sampler.requests)
    first, later = prefill_split(trajectories)
    assert first == sum(len(r.prompt) for r in sampler.requests if r.num_samples == 3)
    assert later == sum(len(r.prompt) for r in sampler.requests if r.num_samples == 1)
    assert sampled_tokens(trajectories) == result.counters.sampled_tokens
    tokens = step_tokens(trajectories, trained=11)
    assert tokens == StepTokens(first + later, result.counters.sampled_tokens, 11)


def test_ledger_totals_money_and_projection():
    cost = CostConfig(prefill_price=0.5, sample_price=2.0, train_price=3.0, currency="EUR")
    steps = [StepTokens(1000, 200, 3000), StepTokens(3000, 600, 1000)]
    ledger = SpendLedger(cost, steps[:1])
    metrics = ledger.metrics(steps[1], step=2, total_steps=5)
    total = steps[0] + steps[1]
    assert metrics["cost/prefill_tokens"] == steps[1].prefill
    assert metrics["cost/total_trained_tokens"] == steps[0].trained + steps[1].trained
    assert metrics["cost/total_tokens"] == total.total
    money = [(s.prefill * 0.5 + s.sampled * 2.0 + s.trained * 3.0) / 1e6 for s in steps]
    assert metrics["cost/money"] == pytest.approx(money[1])
    assert metrics["cost/total_money"] == pytest.approx(sum(money))
    # Three steps left, each projected as the mean of the two so far.
    assert metrics["cost/projected_total_money"] == pytest.approx(sum(money) * (1 + 3 / 2))
    assert metrics["cost/projected_total_tokens"] == pytest.approx(total.total * 2.5)
    assert ledger.steps == steps[:1]  # metrics() is pure; add() records the step
    ledger.add(steps[1])
    assert ledger.total == total
    assert "EUR" in ledger.summary(steps[1])
    # Without prices: tokens only.
    unpriced = SpendLedger(CostConfig(), steps).metrics(steps[0], step=3, total_steps=3)
    assert "cost/money" not in unpriced and unpriced["cost/tokens"] == steps[0].total


def test_budget_stop_projects_the_next_step_from_the_mean():
    steps = [StepTokens(100, 10, 0), StepTokens(300, 30, 0)]  # mean 220 tokens per step
    spent = sum(s.total for s in steps)
    assert SpendLedger(CostConfig(max_tokens=1)).over_budget() is None  # nothing to project
    assert SpendLedger(CostConfig(max_tokens=spent + 220), steps).over_budget() is None
    reason = SpendLedger(CostConfig(max_tokens=spent + 219), steps).over_budget()
    assert reason is not None and "cost.max_tokens" in reason and f"{spent:,}" in reason
    # Prefill at 1000 per million: 0.4 spent, 0.2 projected for the next step.
    tight = CostConfig(prefill_price=1000.0, max_money=0.6 - 1e-9)
    reason = SpendLedger(tight, steps).over_budget()
    assert reason is not None and "cost.max_money" in reason
    enough = CostConfig(prefill_price=1000.0, max_money=0.6 + 1e-9)
    assert SpendLedger(enough, steps).over_budget() is None


def test_cost_section_is_validated():
    config = load_config(None, ["cost.sample_price=1.5", "cost.max_money=3", "cost.currency=CNY"])
    assert config.cost.priced and config.to_dict()["cost"]["currency"] == "CNY"
    with pytest.raises(ConfigError, match=r"cost\.max_money needs a price"):
        load_config(None, ["cost.max_money=3"])
    with pytest.raises(ConfigError, match=r"cost\.train_price"):
        load_config(None, ["cost.train_price=-1"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(None, ["cost.max_dollars=3"])


TINY = [
    "train.steps=2",
    "train.save_every=0",  # a checkpoint only at the end: the budget stop must write one
    "train.questions_per_batch=1",
    "rollout.group_size=2",
    "cost.prefill_price=0.5",
    "cost.sample_price=2",
    "cost.train_price=3",
]


def test_budget_stop_checkpoints_and_a_resumed_run_keeps_the_totals(tmp_path):
    path = write_config(tmp_path)
    run_dir = str(tmp_path / "run")
    run = train(load_config(path, [*TINY, "cost.max_tokens=1"]), run_dir=run_dir, progress=False)
    # Step 1 always runs (nothing to project from); its mean then passes the limit.
    (first,) = run.metrics()
    assert run.last_checkpoint() is not None and run.last_checkpoint().step == 1
    log = run.log_path.read_text()
    assert "budget stop after step 1" in log and "cost.max_tokens = 1" in log
    # The step's numbers come from its own data.
    with gzip.open(run.rollouts_path(1), "rt") as handle:
        records = [json.loads(line) for line in handle]
    assert first["cost/sampled_tokens"] == sum(r["tokens"]["sampled"] for r in records)
    assert first["cost/trained_tokens"] == first["train/tokens"]
    if all(r["turns"] == 1 for r in records):  # one shared first request per question
        assert first["cost/prefill_tokens"] == records[0]["tokens"]["prompt"]
    tokens = StepTokens(
        *(int(first[f"cost/{k}_tokens"]) for k in ("prefill", "sampled", "trained"))
    )
    assert first["cost/money"] == pytest.approx(
        (tokens.prefill * 0.5 + tokens.sampled * 2 + tokens.trained * 3) / 1e6
    )
    assert first["cost/projected_total_tokens"] == 2 * tokens.total  # 2 steps configured

    # Raised limit (0 = none): step 2 runs and the totals include step 1 from before the stop.
    train(load_config(path, TINY), run_dir=run_dir, resume=True, progress=False)
    first_again, second = run.metrics()
    assert first_again == first
    for kind in ("prefill", "sampled", "trained"):
        assert (
            second[f"cost/total_{kind}_tokens"]
            == first[f"cost/{kind}_tokens"] + second[f"cost/{kind}_tokens"]
        )
    assert second["cost/total_money"] == pytest.approx(first["cost/money"] + second["cost/money"])
    assert run.last_checkpoint().step == 2
