"""Remote runs that used to fail quietly, each produced by the fake Tinker service.

* a service reporting its loss under another name, or none: the loss is
  recomputed from the per-token logprobs it returned (said once on stderr)
  and equals the local backend's;
* a session-finish call answering 404: ``close`` fails, and the clean-up
  (:func:`retool.backends.cleanup.close_all`) warns in one line while the
  real error of the command still wins;
* a sampler without ``close`` (the clean-up skips it);
* a service that fails every sample: one ``BackendError`` naming the call, and
  a ``retool train`` step whose every sample failed stops the run in one line
  (exit 2) with the last completed step's checkpoint kept.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tinker")

from retool.backends import service_client
from retool.backends.cleanup import close_all, close_quietly
from retool.backends.remote import losses
from retool.cli import main
from retool.config import ModelConfig
from retool.errors import BackendError
from retool.training.run_dir import RunDirectory
from retool.types import ModelInput, SamplingParams
from tests.backends.remote.fakes import EOS
from tests.backends.remote.test_pytrio import CLIP, DATUMS, local_update
from tests.builders import run_toml


def _service(fake, tmp_path):
    config = ModelConfig(backend="tinker", base_model=fake.base_model, lora_rank=8)
    return service_client(config, tmp_path / "checkpoints")


@pytest.mark.parametrize("name", [None, "loss:total"])
def test_a_missing_loss_metric_is_recomputed_from_the_outputs(fake_tinker, tmp_path, capsys, name):
    fake_tinker.loss_metric = name
    losses._SAID.discard("tinker")
    service = _service(fake_tinker, tmp_path)
    try:
        trainer = service.create_lora_training_client(fake_tinker.base_model, rank=8, seed=3)
        first = trainer.forward_backward(DATUMS, "ppo", CLIP).result()
        second = trainer.forward_backward(DATUMS, "ppo", CLIP).result()
    finally:
        service.close()
    loss, _, _ = local_update(DATUMS, "ppo", CLIP)
    assert first.metrics["loss:sum"] == pytest.approx(loss, rel=1e-5)
    assert second.metrics["loss:sum"] == pytest.approx(loss, rel=1e-5)
    said = [line for line in capsys.readouterr().err.splitlines() if "reported no loss:sum" in line]
    assert len(said) == 1 and "per-token logprobs" in said[0]


def test_a_failing_close_warns_and_the_real_error_wins(fake_tinker, tmp_path, capsys):
    service = _service(fake_tinker, tmp_path)
    service.create_lora_training_client(fake_tinker.base_model, rank=8, seed=3)
    fake_tinker.faults.fail("finish", times=100, status=404)
    with pytest.raises(ValueError, match="the real error"):
        try:
            raise ValueError("the real error")
        finally:
            warnings = close_all(None, object(), service)  # None and no close: skipped
    assert len(warnings) == 1 and "closing the" in warnings[0]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == warnings


def test_a_sampler_without_close_is_skipped():
    class NoClose:
        pass

    assert close_quietly(NoClose()) is None
    assert close_all(NoClose(), None) == []


def test_a_close_that_fails_after_success_is_one_warning(capsys):
    class Broken:
        def close(self):
            raise RuntimeError("404 Not Found\nbody")

    assert close_all(Broken()) == [
        "retool: warning: closing the Broken failed (RuntimeError: 404 Not Found)"
    ]
    assert capsys.readouterr().err.count("\n") == 1


def test_a_service_that_fails_every_sample_is_one_backend_error(fake_tinker, tmp_path):
    service = _service(fake_tinker, tmp_path)
    try:
        trainer = service.create_lora_training_client(fake_tinker.base_model, rank=8, seed=3)
        sampler = trainer.save_weights_and_get_sampling_client()
        fake_tinker.faults.fail("asample", times=10_000, status=400)
        params = SamplingParams(max_tokens=4, seed=1, stop=(EOS,))
        for _ in range(2):
            with pytest.raises(BackendError, match="tinker"):
                sampler.sample(ModelInput.from_ints([5, 6]), 1, params).result()
    finally:
        close_all(service)


def _run_toml(fake, run_dir, steps: int) -> str:
    return run_toml(
        {},
        model={"backend": "tinker", "base_model": fake.base_model, "lora_rank": 8},
        data={"train": "demo:train"},
        rollout={
            "group_size": 2,
            "max_assistant_turns": 1,
            "max_code_calls": 1,
            "max_trajectory_tokens": 400,
            "max_assistant_tokens": 8,
            "max_tool_response_tokens": 32,
            "min_observation_tokens": 8,
            "sample_retries": 1,
            "retry_backoff": 0.0,
        },
        reward={"function": "tests.backends.remote.fakes:alternating_reward"},
        train={
            "steps": steps,
            "questions_per_batch": 2,
            "save_every": 1,
            "max_train_tokens": 400,
            "run_dir": str(run_dir),
        },
    )


def test_a_step_whose_every_sample_failed_stops_the_run_and_keeps_the_checkpoint(
    fake_tinker, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(_run_toml(fake_tinker, run_dir, 1))
    assert main(["train", "--config", str(config), "--no-progress"]) == 0
    config.write_text(_run_toml(fake_tinker, run_dir, 3))
    capsys.readouterr()
    fake_tinker.faults.fail("asample", times=10_000, status=400)
    assert main(["train", "--config", str(config), "--resume", "--no-progress"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1, err
    assert "step 2: all 4 trajectories failed (4 in the sampler after 1 retry each" in err[0]
    assert "step 1 is the last completed one and keeps its checkpoint" in err[0]
    assert "--resume" in err[0]
    run = RunDirectory(run_dir)
    assert run.completed_steps() == [1]
    assert [c.step for c in run.checkpoints()] == [1]
    assert not any(run_dir.joinpath("journal").iterdir())  # failures are not reused on resume
    assert err[0].removeprefix("retool: error: ") in run.log_path.read_text()
