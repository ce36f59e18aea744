"""Run directory bookkeeping: torn lines, rewinding, journals, config checks; metric merging."""

from __future__ import annotations

import json
from pathlib import Path

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


# -- location independence, locks, resume refusals, torn tails, TOML ----------------------

import dataclasses  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tomllib  # noqa: E402

from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from retool.training import run_lock  # noqa: E402
from retool.training.provenance import RunInputs  # noqa: E402
from retool.training.run_dir import repair_tail, toml_string  # noqa: E402

RL = RunInputs("rl", "demo:train", "a" * 64)


def fake_checkpoint(run: RunDirectory, step: int) -> None:
    """Both checkpoint directories under the run, as a backend writes them, and the line."""
    name = f"step_{step:06d}"
    state, sampler = run.checkpoint_root / "state" / name, run.checkpoint_root / "sampler" / name
    for directory in (state, sampler):
        directory.mkdir(parents=True)
        (directory / "weights").write_text(str(step))
    run.add_checkpoint(step, str(state), str(sampler))


def two_step_run(path, inputs=RL):
    run = RunDirectory.open(path, load_config(), resume=False, inputs=inputs)
    for step in (1, 2):
        run.complete_step(step, {"x": 1.0}, [])
        fake_checkpoint(run, step)
    run.close()
    return run


@pytest.mark.parametrize(
    "move",
    ["another working directory", "moved", "copied (original deleted)", "copied (both kept)"],
)
def test_a_run_directory_is_found_wherever_it_is_and_a_copy_uses_its_own(
    tmp_path, monkeypatch, move
):
    monkeypatch.chdir(tmp_path)
    two_step_run("runs/a")  # relative to the working directory it started in
    manifest = Path("runs/a/checkpoints.jsonl").read_text().splitlines()
    stored = [json.loads(line)["state_path"] for line in manifest]
    assert stored[-1] == "checkpoints/state/step_000002"  # relative to the run directory
    where = tmp_path / "elsewhere"
    where.mkdir()
    if move == "another working directory":
        path = tmp_path / "runs" / "a"
    elif move == "moved":
        path = tmp_path / "moved"
        (tmp_path / "runs" / "a").rename(path)
    else:
        path = tmp_path / "copy"
        shutil.copytree(tmp_path / "runs" / "a", path)
        if "deleted" in move:
            shutil.rmtree(tmp_path / "runs" / "a")
    monkeypatch.chdir(where)
    run = RunDirectory.open(path, load_config(), resume=True, inputs=RL)
    last = run.last_checkpoint()
    run.close()
    assert last is not None and last.step == 2
    assert Path(last.state_path).resolve().is_relative_to(path.resolve())  # its own files


def test_old_manifests_with_cwd_relative_or_absolute_paths_still_resolve(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = two_step_run("runs/old")
    lines = [
        {"step": 1, "state_path": "runs/old/checkpoints/state/step_000001",
         "sampler_path": "runs/old/checkpoints/sampler/step_000001", "time": 0.0},
        {"step": 2, "state_path": str(tmp_path / "runs/old/checkpoints/state/step_000002"),
         "sampler_path": str(tmp_path / "runs/old/checkpoints/sampler/step_000002"), "time": 0.0},
    ]  # fmt: skip
    run.manifest_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    shutil.copytree(tmp_path / "runs" / "old", tmp_path / "copy")
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    copy = RunDirectory(tmp_path / "copy")
    assert [r.step for r in copy.checkpoints()] == [1, 2]
    for record in copy.checkpoints():  # the copy's own checkpoints, not the original's
        assert Path(record.state_path).resolve().is_relative_to((tmp_path / "copy").resolve())
        assert Path(record.sampler_path).is_dir()


def hold_lock_in_child(lock_file: Path, *, fork: bool = False) -> subprocess.Popen[str]:
    """A process holding ``lock_file`` (with ``fork``: its parent took it and exited)."""
    code = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from retool.training import run_lock\n"
        f"run_lock.acquire(Path({str(lock_file)!r}), 'x')\n"
        + ("if os.fork(): os._exit(0)\n" if fork else "")
        + "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_writer_is_refused_at_once_and_a_killed_holder_is_taken_over(tmp_path):
    path = tmp_path / "run"
    two_step_run(path)
    holder = hold_lock_in_child(path / "lock")
    try:
        with pytest.raises(run_lock.LockedError, match=rf"in use by pid {holder.pid} on "):
            RunDirectory.open(path, load_config(), resume=True, inputs=RL)
        with pytest.raises(run_lock.LockedError, match="in use by pid"):
            RunDirectory.open(path, load_config(), resume=False, inputs=RL)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (path / "lock").exists()  # kill -9: no clean-up, but the kernel freed the lock
    run = RunDirectory.open(path, load_config(), resume=True, inputs=RL)
    assert (
        f"left by pid {holder.pid}" in run.lock_note and "ended without releasing" in run.lock_note
    )
    run.close()
    assert not (path / "lock").exists()


def test_a_lock_held_by_an_orphan_of_a_dead_holder_says_what_to_do(tmp_path):
    lock_file = tmp_path / "lock"
    holder = hold_lock_in_child(lock_file, fork=True)  # the pid in the file is gone
    holder.wait()
    try:
        with pytest.raises(run_lock.LockedError, match=r"no longer runs.*fuser"):
            run_lock.acquire(lock_file, "run directory x")
    finally:
        orphans = subprocess.run(["fuser", str(lock_file)], capture_output=True, text=True)
        for pid in orphans.stdout.split() or []:
            os.kill(int(pid), signal.SIGKILL)


def test_eval_output_lock_refuses_a_second_writer(tmp_path):
    output = tmp_path / "out.jsonl"
    holder = hold_lock_in_child(run_lock.output_lock_file(output))
    try:
        with pytest.raises(run_lock.LockedError, match=rf"--output {output} is in use by pid"):
            run_lock.lock_output(output, "--output")
    finally:
        holder.kill()
        holder.wait()


def test_resume_refuses_another_kind_other_data_fewer_steps_and_lost_checkpoints(tmp_path):
    path = tmp_path / "run"
    two_step_run(path)
    config = load_config()
    cases = [
        (RunInputs("sft", "demo:train", RL.data_sha256), {}, r"is a RL run .*retool train"),
        (RunInputs("rl", "demo:train", "b" * 64), {}, r"demo:train has changed since"),
        (RunInputs("rl", "other.jsonl", "b" * 64), {}, r"started on demo:train, not other"),
        (RL, {"steps": 1}, r"train.steps = 1, but .* has completed 2 steps"),
    ]
    for inputs, train, match in cases:
        changed = dataclasses.replace(config, train=dataclasses.replace(config.train, **train))
        with pytest.raises(RetoolError, match=match):
            RunDirectory.open(path, changed, resume=True, inputs=inputs)
        assert not (path / "lock").exists()  # a refusal releases the lock
    shutil.rmtree(path / "checkpoints")
    with pytest.raises(RetoolError, match=r"none of the 2 checkpoints .* replace the 2 committed"):
        RunDirectory.open(path, config, resume=True, inputs=RL)


def test_the_resume_line_says_where_it_continues(tmp_path):
    path = tmp_path / "run"
    two_step_run(path)
    run = RunDirectory.open(path, load_config(), resume=True, inputs=RL)
    run.complete_step(3, {"x": 1.0}, [])  # committed, no checkpoint of its own
    for g in range(2):
        run.journal(4).append(trajectory(0, g))
    run.close()
    run = RunDirectory.open(path, load_config(), resume=True, inputs=RL)
    assert run.resume_line(2, 1) == (
        "resuming after step 2 from checkpoint step 2; 1 journaled groups reused; "
        "1 completed step after it run again with the same seeds"
    )
    assert run.journal(4).complete_group_count(2) == 1
    run.close()


def test_a_torn_tail_is_cut_before_the_next_append(tmp_path):
    run = RunDirectory.open(tmp_path / "run", load_config(), resume=False)
    journal = run.journal(1)
    journal.append(trajectory(0, 0))
    with open(journal.path, "a") as handle:
        handle.write('{"example": {"id": "a"')  # killed mid-line
    fresh = run.journal(1)  # what a resumed process opens
    fresh.append(trajectory(0, 1))
    lines = journal.path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)
    run.complete_step(1, {"x": 1.0}, [])
    with open(run.metrics_path, "a") as handle:
        handle.write('{"step": 2, "x"')
    run.complete_step(2, {"x": 2.0}, [])
    assert run.completed_steps() == [1, 2]
    single = tmp_path / "single"
    single.write_text("torn without any newline")
    repair_tail(single)
    assert single.read_text() == ""
    run.close()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"])))
def test_config_toml_round_trips_every_string(text):
    config = load_config()
    try:  # the config refuses some strings itself (blank, NUL); every other must round-trip
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, train=text))
    except ConfigError:
        assume(False)
    assert tomllib.loads(config_to_toml(config)) == config.to_dict()


@pytest.mark.parametrize(
    "text", ["\U0001f600 emoji", 'quote " and \\ backslash', "tab\tnl\ncr\r\x00\x1f\x7f", "", "'"]
)
def test_toml_strings_table(text):
    assert tomllib.loads(f"x = {toml_string(text)}")["x"] == text


def test_a_lone_surrogate_is_one_clear_error():
    with pytest.raises(RetoolError, match="not UTF-8"):
        toml_string("bad \udcff byte")
