"""bench/rl_diagnostics.py reads a run directory's metrics, rollouts and learning-curve
evaluations and prints per-step facts and per-family correct rates that add up."""

from __future__ import annotations

import gzip
import json
import sys

import bench.rl_diagnostics as diagnostics

from retool.data.demo import demo_problems


def test_per_step_facts_and_per_family_rates(tmp_path, monkeypatch, capsys):
    train, dev = demo_problems("train"), demo_problems("dev")
    metrics = [
        {"step": 1, "reward/correct": 0.5, "rollout/degenerate_group_rate": 0.25},
        {"step": 2, "reward/correct": 0.75, "rollout/sampled_nll": 0.4321},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (tmp_path / "rollouts").mkdir()
    # step 1: train[0] (its family) right twice and wrong once, train[1] wrong once
    records = [(train[0], True), (train[0], True), (train[0], False), (train[1], False)]
    with gzip.open(tmp_path / "rollouts" / "step_000001.jsonl.gz", "wt") as handle:
        for problem, correct in records:
            handle.write(json.dumps({"example_id": problem.id, "correct": correct}) + "\n")
    (tmp_path / "eval").mkdir()
    rows = [{"settings": {}}, {"problem_id": dev[0].id, "correct": True}, {"summary": {}}]
    (tmp_path / "eval" / "step_000000.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    monkeypatch.setattr(sys, "argv", ["rl_diagnostics.py", str(tmp_path)])
    diagnostics.main()
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["step", "correct", "alike", "groups", "-logprob"]
    assert lines[1].split() == ["1", "50%", "25%", "-"]
    assert lines[2].split() == ["2", "75%", "-", "0.432"]
    batch = out[out.index("training batches") :].splitlines()
    header = batch[1].split()
    step1 = batch[2].split()
    cell = {name: " ".join(step1[1 + 2 * i : 3 + 2 * i]) for i, name in enumerate(header[1:])}
    assert cell[train[0].family] == "67% (3)" and cell[train[1].family] == "0% (1)"
    curve = out[out.index("train.eval_every") :].splitlines()
    assert curve[1].split() == ["step", dev[0].family] and curve[2].split() == ["0", "100%", "(1)"]
