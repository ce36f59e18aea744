"""Run directory bookkeeping: torn lines, rewinding, journals, config checks; metric merging."""

from __future__ import annotations

import json

import pytest

from retool.config import load_config
from retool.data.examples import MathExample
from retool.errors import ConfigError, RetoolError
from retool.reward import RewardResult, load_reward_function
from retool.rollout import AssistantTurn, StopReason, Trajectory
from retool.training.metrics import merge_trainer_metrics
from retool.training.run_dir import RunDirectory, config_to_toml, read_rollouts

EXAMPLES = [MathExample("a", "q a", "1"), MathExample("b", "q b", "2")]


def trajectory(slot: int, group: int, example: MathExample | None = None) -> Trajectory:
    t = Trajectory(example or EXAMPLES[slot], group, [], question_index=slot)
    t.turns.append(AssistantTurn([1, 2], [3, 4], [-0.1, -0.2], "x"))
    t.stop_reason = StopReason.ANSWER
    return t


def test_config_toml_round_trips():
    config = load_config(None, ["rollout.protocol=hermes_json", "train.steps=7"])
    path_text = config_to_toml(config)
    import tomllib

    assert tomllib.loads(path_text) == config.to_dict()


def test_rewind_keeps_only_what_the_checkpoint_covers(tmp_path):
    run = RunDirectory.open(tmp_path / "run", load_config(), resume=False)
    for step in (1, 2, 3):
        run.complete_step(step, {"loss": float(step)}, [trajectory(0, 0)])
    run.add_checkpoint(2, str(tmp_path), str(tmp_path))
    run.journal(3).append(trajectory(0, 0))
    run.journal(4).append(trajectory(0, 0))
    run.rewind(2)
    assert run.completed_steps() == [1, 2]
    assert sorted(p.name for p in run.rollouts_dir.iterdir()) == [
        "step_000001.jsonl.gz",
        "step_000002.jsonl.gz",
    ]
    assert [p.name for p in run.journal_dir.iterdir()] == ["step_000003.jsonl"]
    (record,) = read_rollouts(run.rollouts_path(1))
    assert record["stop_reason"] == "answer" and record["tokens"]["sampled"] == 2


def test_a_torn_last_line_is_ignored_but_a_damaged_middle_is_an_error(tmp_path):
    run = RunDirectory.open(tmp_path / "run", load_config(), resume=False)
    run.complete_step(1, {"x": 1.0}, [])
    with open(run.metrics_path, "a") as handle:
        handle.write('{"step": 2, "x"')  # killed mid-write
    assert run.completed_steps() == [1]
    run.metrics_path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(RetoolError, match=r"metrics.jsonl:2"):
        run.completed_steps()


def test_manifest_lines_without_their_directories_do_not_count(tmp_path):
    run = RunDirectory.open(tmp_path / "run", load_config(), resume=False)
    (tmp_path / "s1").mkdir()
    run.add_checkpoint(1, str(tmp_path / "s1"), str(tmp_path / "s1"))
    run.add_checkpoint(2, str(tmp_path / "gone"), str(tmp_path / "s1"))
    assert run.last_checkpoint().step == 1


def test_journal_reuses_only_complete_groups_of_the_same_questions(tmp_path):
    run = RunDirectory.open(tmp_path / "run", load_config(), resume=False)
    journal = run.journal(1)
    for g in range(3):
        journal.append(trajectory(0, g))
    journal.append(trajectory(1, 0))  # incomplete group
    with open(journal.path, "a") as handle:
        handle.write('{"example": ')  # torn
    groups = journal.complete_groups(EXAMPLES, group_size=3)
    assert list(groups) == [0] and [t.group_index for t in groups[0]] == [0, 1, 2]
    other = [MathExample("z", "q z", "9"), EXAMPLES[1]]
    assert journal.complete_groups(other, group_size=3) == {}  # a different question in slot 0


def test_opening_refuses_a_file_and_a_damaged_resume(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RetoolError, match="is a file"):
        RunDirectory.open(tmp_path / "file", load_config(), resume=False)


def test_trainer_metrics_merge_by_meaning():
    merged = merge_trainer_metrics(
        [
            {"loss:sum": 1.0, "loss_tokens": 10.0, "clip_fraction": 0.5, "ratio_max": 1.1},
            {"loss:sum": 2.0, "loss_tokens": 30.0, "clip_fraction": 0.1, "ratio_max": 1.3},
        ]
    )
    assert merged["loss:sum"] == 3.0 and merged["loss_tokens"] == 40.0
    assert merged["clip_fraction"] == pytest.approx((0.5 * 10 + 0.1 * 30) / 40)
    assert merged["ratio_max"] == 1.3
    assert merge_trainer_metrics([]) == {}


def test_custom_reward_function_is_loaded_and_checked():
    score = load_reward_function("tests.training.rewards:even_length")
    assert score("ab", "x") == RewardResult(1.0, correct=True, valid_format=True, answer=None)
    assert score("abc", "x").reward == -1.0
    for bad, match in (
        ("no_colon", "must look like"),
        ("tests.training.nothing_here:f", "cannot import"),
        ("tests.training.rewards:missing", "no function"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_reward_function(bad)
    assert json.dumps(score("ab", "x").reward) == "1.0"


def test_a_damaged_sampler_description_is_one_clear_error(tmp_path):
    from retool.backends.local import LocalServiceClient
    from retool.errors import BackendError

    service = LocalServiceClient(checkpoint_root=tmp_path / "ckpt")
    for text in ("{not json", '{"merged": true}', "[1, 2]"):
        (tmp_path / "retool_sampler.json").write_text(text)
        with pytest.raises(BackendError, match="not a valid sampler description"):
            service.create_sampling_client(model_path=tmp_path)
