"""``retool demo`` end to end on ``tiny-random``: walkthrough, SFT, one RL step."""

import json

from retool.cli import main


def test_demo_runs_walkthrough_sft_and_rl_through_the_library(tmp_path, capsys):
    code = main(
        [
            "demo",
            "--set",
            'model.base_model="tiny-random"',
            "--set",
            "model.lora_rank=4",
            "--set",
            "train.questions_per_batch=2",
            "--set",
            "rollout.group_size=2",
            "--set",
            "rollout.max_assistant_tokens=16",
            "--problems",
            "3",
            "--cold-start-steps",
            "1",
            "--demonstrations",
            "2",
            "--output",
            str(tmp_path),
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[reference] 3/3 reference trajectories scored +1" in out
    (root,) = tmp_path.iterdir()
    sft = [json.loads(line) for line in (root / "sft" / "metrics.jsonl").read_text().splitlines()]
    rl = [json.loads(line) for line in (root / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in sft] == [1] and sft[0]["train/loss_tokens"] > 0
    assert [m["step"] for m in rl] == [1] and rl[0]["rollout/trajectories"] == 4
    assert "[done] 1 RL step(s) after 1 SFT steps" in out
