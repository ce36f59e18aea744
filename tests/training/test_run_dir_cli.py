"""The run directory as users meet it: ``retool`` on ``tiny-random``.

Each case a real command: kill and resume from another working directory,
moved and copied runs, ``--init-from`` a run given by an absolute path from
elsewhere, a run killed before its first checkpoint that resumes from its
``--init-from`` weights, two writers on one run directory or one ``eval
--output``, the resume refusals, ``rollout --output`` refusing what it does
not own, and disk full (a small tmpfs in a private mount namespace) during a
checkpoint, a metrics line and an evaluation row. Weights are
compared with uninterrupted runs of the same settings (``atol=1e-6``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from retool.cli import main
from retool.config import load_config
from retool.training.provenance import RunInputs, digest_file
from retool.training.run_dir import RunDirectory
from tests.training.test_loop import ROOT, final_weights, train_here, uninterrupted, write_config

__all__ = ["uninterrupted"]  # the fixture, shared with test_loop

COMMAND = [sys.executable, "-c", "import sys; from retool.cli import main; sys.exit(main())"]


def retool_in(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    for name in ("RETOOL_KILL_AT", "RETOOL_FILL_AT"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, env=environment, timeout=600, cwd=cwd
    )


def assert_same_weights(run_dir: Path, expected: dict[str, torch.Tensor], step: int = 2) -> None:
    weights = final_weights(run_dir, step)
    assert weights.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=1e-6)


def test_killed_runs_resume_from_another_directory_after_a_move_and_as_a_copy(
    tmp_path, uninterrupted
):
    config, expected = uninterrupted
    started, other = tmp_path / "started", tmp_path / "other"
    started.mkdir()
    other.mkdir()
    args = ("train", "--config", str(config), "--no-progress")
    killed = retool_in(started, *args, "--run-dir", "run", RETOOL_KILL_AT="state:2")
    assert killed.returncode == -9, killed.stderr
    copy = tmp_path / "copy"
    shutil.copytree(started / "run", copy)
    moved = tmp_path / "moved"
    (started / "run").rename(moved)  # the original's files are gone: the copy has its own
    for run_dir in (copy, moved):
        resumed = retool_in(other, *args, "--run-dir", str(run_dir), "--resume")
        assert resumed.returncode == 0, resumed.stderr
        said = re.search(
            r"resuming after step 1 from checkpoint step 1; (\d+) journaled", resumed.stderr
        )
        assert said, resumed.stderr
        run = RunDirectory(run_dir)
        assert run.completed_steps() == [1, 2]
        assert run.metrics()[1]["train/reused_groups"] == int(said.group(1))
        assert [r.step for r in run.checkpoints()] == [1, 2]
        assert_same_weights(run_dir, expected)


@pytest.fixture(scope="module")
def init_source(tmp_path_factory):
    """A one-step run to start from, and the uninterrupted run started from it elsewhere."""
    tmp = tmp_path_factory.mktemp("init")
    config = write_config(tmp)
    train_here(config, tmp / "source", ("train.steps=1",))  # in this process: ~7 s less
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    args = ("train", "--config", str(config), "--init-from", str(tmp / "source"), "--no-progress")
    straight = retool_in(elsewhere, *args, "--run-dir", "straight")  # absolute --init-from
    assert straight.returncode == 0, straight.stderr
    return config, tmp / "source", args, final_weights(elsewhere / "straight", 2)


def test_a_run_killed_before_its_first_checkpoint_resumes_from_its_init_from_weights(
    tmp_path, init_source
):
    config, source, args, expected = init_source
    killed = retool_in(tmp_path, *args, "--run-dir", "run", RETOOL_KILL_AT="journal:1:3")
    assert killed.returncode == -9, killed.stderr
    inputs = json.loads((tmp_path / "run" / "inputs.json").read_text())
    assert inputs["kind"] == "rl" and inputs["init_from"]["spec"] == str(source)
    resume = ("train", "--config", str(config), "--run-dir", "run", "--resume", "--no-progress")
    resumed = retool_in(tmp_path, *resume)
    assert resumed.returncode == 0, resumed.stderr
    assert f"starting again from --init-from {source}" in resumed.stderr
    assert RunDirectory(tmp_path / "run").completed_steps() == [1, 2]
    assert_same_weights(tmp_path / "run", expected)


def test_a_resume_whose_init_from_checkpoint_changed_is_refused(tmp_path, init_source):
    config, source, args, _ = init_source
    copy = tmp_path / "source"
    shutil.copytree(source, copy)
    args = tuple(str(copy) if a == str(source) else a for a in args)
    killed = retool_in(tmp_path, *args, "--run-dir", "run", RETOOL_KILL_AT="journal:1:1")
    assert killed.returncode == -9, killed.stderr
    weights = next((copy / "checkpoints" / "state").iterdir()) / "trainable.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    resume = ("train", "--config", str(config), "--run-dir", "run", "--resume", "--no-progress")
    refused = retool_in(tmp_path, *resume)
    assert refused.returncode == 2, refused.stderr
    assert "changed since the run started" in refused.stderr
    # after the note that the killed run's lock file was taken over, one error line
    lines = refused.stderr.strip().splitlines()
    assert [line for line in lines if not line.startswith("retool: note: ")] == [lines[-1]]
    assert lines[-1].startswith("retool: error: --resume: the --init-from checkpoint")


def test_two_writers_on_one_run_directory(tmp_path):
    config = write_config(tmp_path)
    args = ("train", "--config", str(config), "--run-dir", "run", "--no-progress")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("RETOOL_KILL_AT", None)
    first = subprocess.Popen(
        [*COMMAND, *args], cwd=tmp_path, env=environment, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "run" / "lock").exists() and first.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for extra in ((), ("--resume",)):
            second = retool_in(tmp_path, *args, *extra)
            assert second.returncode == 2, second.stderr
            assert f"is in use by pid {first.pid} on " in second.stderr
            assert len(second.stderr.strip().splitlines()) == 1
        _, stderr = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    assert RunDirectory(tmp_path / "run").completed_steps() == [1, 2]  # never [1, 1, 2, 2]
    assert not (tmp_path / "run" / "lock").exists()


# -- refusals that need no model: in-process, one line, exit 2 -----------------------------


def fabricated_run(path: Path, config_path: Path, inputs: RunInputs, steps: int = 2) -> None:
    run = RunDirectory.open(path, load_config(config_path), resume=False, inputs=inputs)
    for step in range(1, steps + 1):
        run.complete_step(step, {"x": 1.0}, [])
        name = f"step_{step:06d}"
        for kind in ("state", "sampler"):
            (run.checkpoint_root / kind / name).mkdir(parents=True)
        run.add_checkpoint(
            step,
            str(run.checkpoint_root / "state" / name),
            str(run.checkpoint_root / "sampler" / name),
        )
    run.close()


def conversation(name: str) -> str:
    messages = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "Compute it.", "code": "print(2 + 2)"},
        {"role": "tool", "content": "4\n"},
        {"role": "assistant", "content": "\\boxed{4}"},
    ]
    return json.dumps({"id": name, "messages": messages}) + "\n"


def refusal(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("retool: error: "), err
    return err[0]


def test_resume_refusals(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    config = write_config(tmp_path)
    demos, other = tmp_path / "demos.jsonl", tmp_path / "other.jsonl"
    demos.write_text(conversation("a"))
    other.write_text(conversation("b"))
    sft = RunInputs("sft", str(demos), digest_file(demos))
    fabricated_run(tmp_path / "sft", config, sft)
    train = ("train", "--config", str(config), "--no-progress", "--resume", "--run-dir")
    sft_resume = ("sft", "--config", str(config), "--no-progress", "--resume", "--run-dir")
    line = refusal(capsys, *train, str(tmp_path / "sft"))
    assert "is a SFT run (started by retool sft); resume it with that command" in line
    from retool.data import load_dataset
    from retool.training.provenance import digest_records

    rl = RunInputs("rl", "demo:train", digest_records(load_dataset("demo:train")))
    fabricated_run(tmp_path / "rl", config, rl)
    line = refusal(capsys, *sft_resume, str(tmp_path / "rl"), "--data", str(demos))
    assert "is a RL run (started by retool train)" in line
    line = refusal(capsys, *train, str(tmp_path / "rl"), "--set", "train.steps=1")
    assert "train.steps = 1, but" in line and "has completed 2 steps" in line
    shutil.rmtree(tmp_path / "rl" / "checkpoints")
    line = refusal(capsys, *train, str(tmp_path / "rl"))
    assert "none of the 2 checkpoints" in line and "replace the 2 committed steps" in line
    # sft --resume with other --data, or the same file with other content: by content hash
    line = refusal(capsys, *sft_resume, str(tmp_path / "sft"), "--data", str(other))
    assert f"the run was started on {demos}, not {other}" in line
    demos.write_text(other.read_text())
    line = refusal(capsys, *sft_resume, str(tmp_path / "sft"), "--data", str(demos))
    assert f"{demos} has changed since" in line


def test_rollout_output_refuses_its_dataset_and_files_of_other_commands(tmp_path, capsys):
    dataset = tmp_path / "questions.jsonl"
    dataset.write_text(json.dumps({"id": "q", "question": "1+1?", "answer": "2"}) + "\n")
    args = ("rollout", "--model", "tiny-random", "--dataset", str(dataset), "--output")
    line = refusal(capsys, *args, str(dataset))
    assert "is the --dataset this command reads" in line
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    for owned in (metrics, tmp_path / "binary.gz"):
        if owned.suffix == ".gz":
            owned.write_bytes(b"\x1f\x8b\x08\x00junk")
        line = refusal(capsys, *args, str(owned))
        assert "is not a rollout file written by `retool rollout --output`" in line
    assert metrics.read_text() == json.dumps({"step": 1, "loss": 0.5}) + "\n"


def test_a_second_eval_on_one_output_is_refused(tmp_path, capsys):
    from tests.training.test_run_dir import hold_lock_in_child

    output = tmp_path / "out.jsonl"
    holder = hold_lock_in_child(tmp_path / "out.jsonl.lock")
    try:
        line = refusal(
            capsys, "eval", "--model", "tiny-random", "--dataset", "demo", "--output", str(output)
        )
        assert f"--output {output} is in use by pid {holder.pid}" in line
    finally:
        holder.kill()
        holder.wait()
    assert not output.exists()


# -- disk full ---------------------------------------------------------------------------

DISK_FULL_DRIVER = """
import contextlib, io, json, os, subprocess, sys
from pathlib import Path
from retool.cli import main
disk, out, config = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cases = json.loads(sys.argv[4])
command = [sys.executable, "-c", "import sys; from retool.cli import main; sys.exit(main())"]
report = {}
for name, fill_at, extra in cases:
    run = disk / name
    args = ["train", "--config", config, "--run-dir", str(run), "--no-progress", *extra]
    env = {**os.environ, "RETOOL_FILL_AT": fill_at, "RETOOL_FILL_FILE": str(disk / "ballast")}
    full = subprocess.run([*command, *args], capture_output=True, text=True, env=env)
    (disk / "ballast").unlink(missing_ok=True)
    # The resume in this process: `retool train --resume` as the command runs it, without
    # a process start (~8 s of imports) per case.
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([*args, "--resume"])
    report[name] = {"full": [full.returncode, full.stderr[-2000:]],
                    "resumed": [code, err.getvalue()[-2000:]]}
    subprocess.run(["cp", "-r", str(run), str(out / name)], check=True)
(out / "report.json").write_text(json.dumps(report))
"""


def _private_tmpfs_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt && true"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.slow(seconds=150)  # six training runs, three of them in the driver process
@pytest.mark.skipif(not _private_tmpfs_works(), reason="no user+mount namespaces here")
def test_disk_full_during_a_checkpoint_a_metrics_line_or_an_eval_row_leaves_a_resumable_run(
    tmp_path, uninterrupted
):
    config, expected = uninterrupted
    evaluated = ["--set", "train.eval_every=2", "--set", "train.eval_limit=1",
                 "--set", "train.eval_n=2"]  # fmt: skip
    cases = [
        ("checkpoint", "optim:2", []),  # save_state of step 2 hits ENOSPC
        ("metrics", "rollouts:2", []),  # the rollouts file is written, its metrics line not
        ("eval", "eval:2", evaluated),  # the evaluation after step 2: its rows cannot be written
    ]
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DISK_FULL_DRIVER)
    script = (
        f"mount -t tmpfs -o size=32m tmpfs {disk} && "
        f"{sys.executable} {driver} {disk} {out} {config} '{json.dumps(cases)}'"
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("RETOOL_KILL_AT", None)
    done = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=environment,
        timeout=1500,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    for name, _, _ in cases:
        full_code, full_err = report[name]["full"]
        assert full_code not in (0, -9), f"{name}: the disk never filled: {full_err}"
        assert "No space left on device" in full_err or "ENOSPC" in full_err, full_err
        code, err = report[name]["resumed"]
        assert code == 0, f"{name}: {err}"
        run = RunDirectory(out / name)
        assert run.completed_steps() == [1, 2], name  # every step exactly once
        assert [r.step for r in run.checkpoints()] == [1, 2], name
        assert_same_weights(out / name, expected)
    from retool.evaluation import load_results

    results = load_results(out / "eval" / "eval" / "step_000002.jsonl")
    assert results.summary is not None  # the evaluation was finished on --resume
