"""The RL step's numerics: old logprobs recomputed, rollout correction through the
advantages (remote) or the loss (local), mismatch metrics, ``numerics.json`` and resume."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from retool.backends.local.dtype import Numerics
from retool.config import load_config
from retool.errors import ConfigError
from retool.training.datum import TrainingDatum
from retool.training.numerics import (
    NUMERICS_FILE,
    StepNumerics,
    check_supported,
    prepare_step,
    record_numerics,
    resolve_correction,
)
from retool.types import Datum, ForwardBackwardOutput, Future, ModelInput, TensorData

SAMPLED = [0.0, -1.0, -1.0, -2.0]  # position 0 is a prompt position (advantage 0)
TRAINED = [-5.0, 0.0, -1.1, -1.0]  # log rho 1 (rho e > cap 2), -0.1, 1 on the loss tokens


class Phases:
    def __init__(self):
        self.names = []

    @contextlib.contextmanager
    def __call__(self, name):
        self.names.append(name)
        yield


class FakeTrainer:
    """A service whose forward returns fixed logprobs (as a remote trainer's would)."""

    def __init__(self):
        self.calls = 0

    def forward(self, data, loss_fn, config=None):
        self.calls += 1
        outputs = tuple({"logprobs": TensorData.from_list(TRAINED)} for _ in data)
        return Future.completed(ForwardBackwardOutput(outputs, {}))


def _item(advantage=0.5):
    datum = Datum(
        ModelInput.from_ints([1, 2, 3, 4]),
        {
            "target_tokens": TensorData.from_list([2, 3, 4, 5], "int64"),
            "logprobs": TensorData.from_list(SAMPLED),
            "advantages": TensorData.from_list([0.0] + [advantage] * 3),
        },
    )
    return TrainingDatum(datum=datum, num_tokens=4, loss_tokens=3)


def _config(*overrides, backend="pytrio"):
    config = load_config(None, list(overrides))
    return SimpleNamespace(train=config.train, model=SimpleNamespace(backend=backend))


def test_recompute_through_the_advantages_caps_weights_and_measures_the_mismatch():
    trainer, phases = FakeTrainer(), Phases()
    config = _config("train.old_logprobs=recompute", "train.rollout_correction=tis")
    step = prepare_step(trainer, [[[_item()], [_item()]]], config, None, {"c": 1.0}, phases)
    assert trainer.calls == 2 and phases.names == ["recompute"]
    datum = step.updates[0][0][0].datum
    np.testing.assert_allclose(datum.loss_fn_inputs["logprobs"].to_numpy(), TRAINED)
    weights = [1.0, min(math.e, 2.0), math.exp(-0.1), min(math.e, 2.0)]
    expected = np.array([0.0, 0.5, 0.5, 0.5]) * weights
    np.testing.assert_allclose(datum.loss_fn_inputs["advantages"].to_numpy(), expected, rtol=1e-6)
    assert "sampler_logprobs" not in datum.loss_fn_inputs  # a service gets only its keys
    assert step.loss_config == {"c": 1.0}  # nothing added for a remote loss
    assert step.metrics["train/sampler_kl"] == pytest.approx(-(1 - 0.1 + 1) / 3)
    assert step.metrics["train/sampler_clip_fraction"] == pytest.approx(2 / 3)
    assert step.metrics["train/correction_fraction"] == pytest.approx(2 / 3)


def test_recompute_keeps_each_update_its_own_micro_batches():
    trainer = FakeTrainer()
    config = _config("train.old_logprobs=recompute", "train.rollout_correction=tis")
    updates = [[[_item()], [_item(), _item()]], [[_item()]]]
    step = prepare_step(trainer, updates, config, None, None, Phases())
    assert trainer.calls == 3  # one forward per micro-batch of every update, before any trains
    assert [[len(batch) for batch in update] for update in step.updates] == [[1, 2], [1]]
    assert step.metrics["train/sampler_kl"] == pytest.approx(-(1 - 0.1 + 1) / 3)  # over all


def test_mis_on_a_service_zeroes_a_trajectory_whose_ratio_leaves_the_bounds():
    config = _config("train.old_logprobs=recompute", "train.rollout_correction=mis")
    step = prepare_step(FakeTrainer(), [[[_item()]]], config, None, None, Phases())
    advantages = step.updates[0][0][0].datum.loss_fn_inputs["advantages"].to_numpy()
    assert not advantages.any()  # sum log rho = 1.9 > log 2
    assert step.metrics["train/correction_fraction"] == 1.0


def test_sampler_mode_leaves_the_datums_and_derives_the_mismatch_from_the_ratio():
    trainer = FakeTrainer()
    step = prepare_step(trainer, [[[_item()]]], _config(), None, None, Phases())
    assert trainer.calls == 0 and step.updates[0][0][0] == _item()
    got = step.finish({"train/approx_kl": 0.25, "train/clip_fraction": 0.5})
    assert got == {"train/sampler_kl": 0.25, "train/sampler_clip_fraction": 0.5}
    # What the trainer reported itself is kept.
    assert step.finish({"train/sampler_kl": 0.1, "train/approx_kl": 0.2}) == {}


def test_local_backend_gets_the_correction_in_the_loss_config():
    config = _config(
        "train.rollout_correction=tis", "train.rollout_correction_cap=3", backend="local"
    )
    step = prepare_step(FakeTrainer(), [[[_item()]]], config, None, {"c": 1.0}, Phases())
    assert step.loss_config == {"c": 1.0, "rollout_correction": 1.0, "rollout_correction_cap": 3.0}
    recompute = _config("train.old_logprobs=recompute", backend="local")
    step = prepare_step(FakeTrainer(), [[[_item()]]], recompute, None, None, Phases())
    inputs = step.updates[0][0][0].datum.loss_fn_inputs
    np.testing.assert_allclose(inputs["sampler_logprobs"].to_numpy(), SAMPLED)
    np.testing.assert_allclose(inputs["logprobs"].to_numpy(), TRAINED)
    assert step.metrics == {}  # the local loss measures the mismatch itself


def test_auto_correction_is_none_under_float32_and_tis_otherwise():
    fp32 = Numerics("auto", "float32", "float32")
    mixed = Numerics("auto", "bfloat16", "float32")
    assert resolve_correction("auto", fp32) == "none"
    assert resolve_correction("auto", None) == "none"  # a remote service
    assert resolve_correction("auto", mixed) == "tis"
    assert resolve_correction("mis", fp32) == "mis"


def test_a_service_refuses_a_correction_without_recompute():
    with pytest.raises(ConfigError, match='needs train.old_logprobs = "recompute"'):
        check_supported(_config("train.rollout_correction=tis"))
    check_supported(_config("train.rollout_correction=tis", "train.old_logprobs=recompute"))
    check_supported(_config("train.rollout_correction=tis", backend="local"))


def test_numerics_are_recorded_and_a_resume_refuses_a_change(tmp_path):
    run = SimpleNamespace(path=tmp_path, lines=[])
    run.log = run.lines.append
    chosen = Numerics("auto", "float32", "bfloat16", (), {"flags": "amx_bf16"})
    record_numerics(run, SimpleNamespace(numerics=chosen), resume=False)
    stored = json.loads((tmp_path / NUMERICS_FILE).read_text())
    assert (stored["sampler"], stored["trainer"]) == ("float32", "bfloat16")
    assert run.lines and "trainer bfloat16" in run.lines[0]
    record_numerics(run, SimpleNamespace(numerics=chosen), resume=True)  # same: fine
    changed = Numerics("auto", "float32", "float32")
    with pytest.raises(ConfigError, match="numerics changed"):
        record_numerics(run, SimpleNamespace(numerics=changed), resume=True)
    record_numerics(run, SimpleNamespace(), resume=True)  # a remote service: nothing to record


def test_the_trainers_compile_choice_is_recorded_and_logged_on_every_start(tmp_path):
    from retool.backends.local.compiled import CompileChoice

    run = SimpleNamespace(path=tmp_path, lines=[])
    run.log = run.lines.append
    chosen = Numerics("auto", "float32", "bfloat16", (), {"flags": "amx_bf16"})
    on = CompileChoice("auto", True, "auto: bf16 trainer")
    record_numerics(run, SimpleNamespace(numerics=chosen), False, None, on)
    stored = json.loads((tmp_path / NUMERICS_FILE).read_text())
    assert stored["compile"] == {
        "requested": "auto",
        "enabled": True,
        "reason": "auto: bf16 trainer",
    }
    assert "trainer: compile on (auto: bf16 trainer)" in run.lines
    # a resumed process may decide otherwise (no compiler there): logged, not refused
    off = CompileChoice("auto", False, "auto: no C++ compiler (g++, c++ or clang++) on PATH")
    record_numerics(run, SimpleNamespace(numerics=chosen), True, None, off)
    assert run.lines[-1] == f"trainer: {off.summary()}"
    assert json.loads((tmp_path / NUMERICS_FILE).read_text()) == stored


def test_step_numerics_never_override_the_trainers_metrics():
    step = StepNumerics([], None, {"train/sampler_kl": 1.0, "train/correction_fraction": 0.5})
    assert step.finish({"train/sampler_kl": 0.0}) == {"train/correction_fraction": 0.5}


def test_unreadable_numerics_file_is_one_clear_error(tmp_path: Path):
    from retool.training.numerics import read_numerics

    (tmp_path / NUMERICS_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="numerics.json: unreadable"):
        read_numerics(tmp_path)


# -- the loop, on tiny-random ---------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def importable_rewards(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def _loop_config(tmp_path: Path, *overrides: str):
    from tests.training.test_loop import CONFIG

    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    settings = ["train.steps=1", "train.questions_per_batch=1", "model.dtype=float32"]
    return load_config(path, [*settings, *overrides])


def test_a_step_with_recompute_and_tis_logs_the_mismatch_and_the_recompute(
    tmp_path, importable_rewards
):
    from retool.training.loop import train

    config = _loop_config(tmp_path, "train.old_logprobs=recompute", "train.rollout_correction=tis")
    run = train(config, run_dir=str(tmp_path / "run"), progress=False)
    (metrics,) = run.metrics()
    assert metrics["time/recompute_s"] > 0
    # fp32 sampler and trainer: the mismatch is float rounding (the 1e-4 contract).
    assert abs(metrics["train/sampler_kl"]) < 1e-4
    assert metrics["train/sampler_clip_fraction"] == 0.0
    assert metrics["train/correction_fraction"] == 0.0
    # pi_old is the trainer's own: the ratio of the (only) update's forward is 1.
    assert abs(metrics["train/approx_kl"]) < 1e-5
    stored = json.loads((tmp_path / "run" / NUMERICS_FILE).read_text())
    assert (stored["requested"], stored["sampler"], stored["trainer"]) == (
        "float32",
        "float32",
        "float32",
    )


# -- a damaged numerics.json (a careless edit, a bad copy) --------------------------------

GOOD_RECORD = {"requested": "auto", "sampler": "float32", "trainer": "bfloat16"}
TIMING = {"role": "trainer", "rows": 64, "float32_s": 0.2, "bfloat16_s": 0.1, "chosen": "bfloat16"}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[]", "expected a JSON object, got a list"),
        ('"float32"', "got 'float32'"),
        ("null", "got null"),
        (json.dumps({**GOOD_RECORD, "sampler": "int8"}), "'sampler' is 'int8', expected one of"),
        (json.dumps({**GOOD_RECORD, "trainer": ["bfloat16"]}), "'trainer' is a list"),
        (json.dumps({**GOOD_RECORD, "requested": True}), "'requested' is a boolean"),
        (json.dumps({"requested": "auto", "sampler": "float32"}), "no 'trainer' field"),
        (json.dumps({**GOOD_RECORD, "timings": "fast"}), "'timings' must be a list"),
        (json.dumps({**GOOD_RECORD, "timings": [7]}), "'timings[0]' must be an object"),
        (
            json.dumps({**GOOD_RECORD, "timings": [{**TIMING, "rows": "64"}]}),
            "'timings[0].rows' must be an integer",
        ),
        (
            json.dumps({**GOOD_RECORD, "timings": [{**TIMING, "float32_s": float("nan")}]}),
            "'timings[0].float32_s' must be a number",
        ),
        (
            json.dumps({**GOOD_RECORD, "timings": [{**TIMING, "chosen": "fp8"}]}),
            "'timings[0].chosen' is 'fp8'",
        ),
        (
            json.dumps({**GOOD_RECORD, "timings": [{**TIMING, "stopped_early": "no"}]}),
            "'timings[0].stopped_early' must be true or false",
        ),
        (json.dumps({**GOOD_RECORD, "host": ["cpu"]}), "'host' must be an object"),
        ('{"requested": ' + "9" * 5000 + "}", "not JSON"),
        ("{not json", "not JSON"),
    ],
)
def test_a_damaged_numerics_file_names_the_file_and_the_field(tmp_path, text, names):
    from retool.training.numerics import read_numerics

    (tmp_path / NUMERICS_FILE).write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_numerics(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / NUMERICS_FILE}: unreadable (")
    assert names in message and "\n" not in message


def test_numerics_that_are_not_utf8_or_a_directory_are_one_error(tmp_path):
    from retool.training.numerics import read_numerics

    (tmp_path / NUMERICS_FILE).write_bytes(b'{"sampler": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_numerics(tmp_path)
    (tmp_path / NUMERICS_FILE).unlink()
    (tmp_path / NUMERICS_FILE).mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        read_numerics(tmp_path)


def test_what_record_numerics_writes_reads_back_unchanged(tmp_path):
    from retool.backends.local.dtype import RoleTiming
    from retool.training.numerics import read_numerics

    timings = (
        RoleTiming("trainer", 64, 0.2, 0.1, "bfloat16"),
        RoleTiming("sampler", 8, 0, 0, "float32", True),
    )
    chosen = Numerics("auto", "float32", "bfloat16", timings, {"flags": "amx_bf16"})
    run = SimpleNamespace(path=tmp_path, log=lambda line: None)
    record_numerics(run, SimpleNamespace(numerics=chosen), resume=False)
    assert read_numerics(tmp_path) == chosen


def test_the_local_service_refuses_numerics_with_an_unknown_dtype():
    from retool.backends.local.service import LocalServiceClient

    with pytest.raises(ConfigError, match="'int8'"):
        LocalServiceClient(device="cpu", numerics=Numerics("auto", "int8", "float32"))
