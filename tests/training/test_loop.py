"""The RL step loop on ``tiny-random``: one optimizer step per step, skips, run directory,
and kill -9 at several points followed by ``--resume``.

A random model never earns the boxed-answer reward, so these runs use the
custom reward ``tests.training.rewards:even_length`` (+1 for an even-length
final text): groups get mixed rewards and every step really changes the
weights, which is what makes the weight comparison after a resume mean
something.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from retool.config import load_config
from retool.errors import RetoolError
from retool.training.loop import train
from retool.training.run_dir import RunDirectory
from tests.builders import run_toml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = run_toml(
    rollout={"group_size": 4},
    train={
        "grad_clip_norm": 1.0,
        "micro_batch_tokens": 1500,
        "micro_batch_items": 3,
        "save_every": 1,
    },
)


@pytest.fixture(autouse=True)
def importable_rewards(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def write_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG + extra)
    return path


def final_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(
        str(run_dir / "checkpoints" / "state" / f"step_{step:06d}" / "trainable.safetensors")
    )


def test_each_step_takes_one_optimizer_step_and_changes_the_weights(tmp_path):
    evaluation = ["train.eval_every=2", "train.eval_n=2", "train.eval_limit=2"]
    config = load_config(write_config(tmp_path), evaluation)
    run = train(config, run_dir=str(tmp_path / "run"), progress=False)
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    assert [m["optim/step"] for m in metrics] == [1.0, 2.0]  # the trainer's own counter
    assert all(m["train/update_skipped"] == 0 for m in metrics)
    assert all(m["train/micro_batches"] >= 2 for m in metrics)  # accumulated, still one step
    assert all(m["train/datums"] > 0 and m["train/loss_tokens"] > 0 for m in metrics)
    for key in ("time/rollout_s", "time/training_s", "time/checkpoint_s", "reward/mean"):
        assert key in metrics[0]
    for m in metrics:  # this process's memory: resident after the step, and its peak so far
        assert 0.05 < m["memory/rss_gb"] <= m["memory/peak_rss_gb"] < 1000
    assert metrics[1]["memory/peak_rss_gb"] >= metrics[0]["memory/peak_rss_gb"]
    first, second = final_weights(run.path, 1), final_weights(run.path, 2)
    assert any(not torch.equal(first[k], second[k]) for k in first)
    records = [json.loads(line) for line in run.manifest_path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert (run.path / "rollouts" / "step_000002.jsonl.gz").exists()
    assert list((run.path / "journal").iterdir()) == []
    assert "[train]" in run.config_path.read_text()
    # train.eval_every: the policy after step 2 evaluated on data.dev, 2 problems x 2 samples.
    from retool.evaluation import load_results

    assert [p.name for p in run.eval_dir.iterdir()] == ["step_000002.jsonl"]
    results = load_results(run.eval_path(2))
    assert results.summary is not None and len(results.rows) == 4
    assert (
        results.settings["model"].endswith("@2") and "eval after step 2" in run.log_path.read_text()
    )


def test_eval_at_start_evaluates_the_starting_policy_as_step_0_first(tmp_path):
    """The learning curve's first point: the weights before any step, evaluated before
    step 1 samples, as the later evaluations are (same problems, seeds, samples)."""
    from retool.errors import ConfigError
    from retool.evaluation import load_results

    with pytest.raises(ConfigError, match="train.eval_at_start .* set train.eval_every"):
        load_config(write_config(tmp_path), ["train.eval_at_start=true"])
    sets = ["train.eval_every=2", "train.eval_n=2", "train.eval_limit=2"]
    config = load_config(write_config(tmp_path), [*sets, "train.eval_at_start=true"])
    run = train(config, run_dir=str(tmp_path / "run"), progress=False)
    assert sorted(p.name for p in run.eval_dir.iterdir()) == [
        "step_000000.jsonl",
        "step_000002.jsonl",
    ]
    start, end = load_results(run.eval_path(0)), load_results(run.eval_path(2))
    assert start.summary is not None and start.settings["model"].endswith("@0")
    assert [(r["problem_id"], r["sample_index"]) for r in start.rows] == [
        (r["problem_id"], r["sample_index"]) for r in end.rows
    ]
    log = run.log_path.read_text()
    assert log.index("eval after step 0") < log.index("step 1")  # before any training


def test_a_step_where_every_group_scores_alike_skips_the_update(tmp_path):
    # The boxed-answer reward: a random model is always wrong, every advantage is 0.
    config = load_config(write_config(tmp_path), ["train.steps=1", 'reward.function=""'])
    run = train(config, run_dir=str(tmp_path / "run"), progress=False, tracker="tensorboard")
    (metrics,) = run.metrics()
    assert list((run.path / "tensorboard").glob("events.out.tfevents.*"))  # the tracker ran
    assert metrics["train/update_skipped"] == 1.0 and metrics["train/datums"] == 0
    assert "optim/step" not in metrics
    assert metrics["rollout/degenerate_group_rate"] == 1.0
    log = run.log_path.read_text()
    assert "nothing to train" in log and "retool sft" in log and "retool preflight" in log


def test_run_directory_guards_against_mistakes(tmp_path):
    config = load_config(write_config(tmp_path), ["train.steps=1"])
    run_dir = str(tmp_path / "run")
    with pytest.raises(RetoolError, match="nothing to resume"):
        train(config, run_dir=run_dir, resume=True, progress=False)
    train(config, run_dir=run_dir, progress=False)
    with pytest.raises(RetoolError, match="already holds a run"):
        train(config, run_dir=run_dir, progress=False)
    changed = load_config(write_config(tmp_path), ["train.steps=1", "train.learning_rate=0.5"])
    with pytest.raises(RetoolError, match=r"train.learning_rate \(0.001 -> 0.5\)"):
        train(changed, run_dir=run_dir, resume=True, progress=False)
    # More steps is a legitimate change on resume: it extends the run.
    longer = load_config(write_config(tmp_path), ["train.steps=2"])
    run = train(longer, run_dir=run_dir, resume=True, progress=False)
    assert run.completed_steps() == [1, 2]


def retool(*args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RETOOL_KILL_AT", None)
    if kill_at:
        env["RETOOL_KILL_AT"] = kill_at
    command = [sys.executable, "-c", "import sys; from retool.cli import main; sys.exit(main())"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )


def train_here(
    config: Path, run_dir: Path, sets: tuple[str, ...] = (), *, resume: bool = False
) -> RunDirectory:
    """A run in this process: the reference run, or the resume of a killed ``retool``
    process (the kill needs a process; the resume tests the run directory it left, and
    ``retool train --resume`` itself is tested in test_run_dir_cli.py). A process of its
    own would cost ~7 s of imports on a 2-core host, for the same weights: the float32
    steps do not depend on the process."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))  # the tests' reward function
        config_ = load_config(config, list(sets))
        return train(config_, run_dir=str(run_dir), resume=resume, progress=False)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    config = write_config(tmp)
    train_here(config, tmp / "run")
    return config, final_weights(tmp / "run", 2)


@pytest.mark.slow  # runs many processes: started first under workers
@pytest.mark.parametrize(
    "kill_at",
    [
        "journal:2:5",  # mid-rollout of step 2, five trajectories journaled
        "state:2",  # mid-checkpoint: state written, sampler weights not
        "committed:2",  # step 2 committed, its checkpoint's manifest line not
    ],
)
def test_kill_and_resume_matches_an_uninterrupted_run(tmp_path, uninterrupted, kill_at):
    config, expected = uninterrupted
    run_dir = tmp_path / "run"
    args = ("train", "--config", str(config), "--run-dir", str(run_dir), "--no-progress")
    killed = retool(*args, kill_at=kill_at)
    assert killed.returncode == -9, killed.stderr
    run = train_here(config, run_dir, resume=True)
    assert run.completed_steps() == [1, 2]  # each step exactly once
    assert [r.step for r in run.checkpoints()] == [1, 2]
    weights = final_weights(run_dir, 2)
    assert weights.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=1e-6)
    if kill_at.startswith("journal"):
        (step2,) = [m for m in run.metrics() if m["step"] == 2]
        # The first question's group (4 trajectories) ended before the kill: reused.
        assert step2["train/reused_groups"] == 1


@pytest.mark.slow  # runs many processes: started first under workers
def test_sigterm_saves_the_last_completed_step_and_resume_finishes(tmp_path, uninterrupted):
    import signal
    import time

    config, expected = uninterrupted
    run_dir = tmp_path / "run"
    args = (
        "train",
        "--config",
        str(config),
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--set",
        "train.save_every=0",
    )  # no periodic checkpoint: only the signal's
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RETOOL_KILL_AT", None)
    command = [sys.executable, "-c", "import sys; from retool.cli import main; sys.exit(main())"]
    process = subprocess.Popen(
        [*command, *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    journal = run_dir / "journal" / "step_000002.jsonl"
    deadline = time.monotonic() + 240
    while not journal.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "SIGTERM" in stderr and "--resume" in stderr and "Traceback" not in stderr
    run = RunDirectory(run_dir)
    assert run.completed_steps() == [1]
    assert [r.step for r in run.checkpoints()] == [1]  # written on the way out
    resumed = retool(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert run.completed_steps() == [1, 2]
    weights = final_weights(run_dir, 2)
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=1e-6)


def test_an_exception_saves_the_last_completed_step_first(tmp_path):
    from tests.training import rewards

    rewards.CALLS["n"] = 0
    config = load_config(
        write_config(tmp_path),
        ["train.save_every=0", 'reward.function="tests.training.rewards:even_length_then_fail"'],
    )
    with pytest.raises(RuntimeError, match="went away"):
        train(config, run_dir=str(tmp_path / "run"), progress=False)
    run = RunDirectory(tmp_path / "run")
    assert run.completed_steps() == [1]
    assert [r.step for r in run.checkpoints()] == [1]  # the emergency checkpoint
    assert "before stopping" in run.log_path.read_text()
