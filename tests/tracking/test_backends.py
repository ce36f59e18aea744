"""Each tracker, really started offline: log 3 steps, close, read back what it wrote.

The environment is hostile on purpose: ``WANDB_MODE=online`` and
``SWANLAB_MODE=cloud`` with fake API keys, as in a user's shell. The trackers
must still run offline, and the ``no_network`` fixture fails the test if
anything in this process tried to reach a host. Nothing may be written outside
the run directory (the working directory must stay empty).

Each test skips, with the install command, when its package is missing.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from retool.tracking import make_tracker

STEPS = {
    1: {"reward/mean": 0.25, "stop/answer": 0.5, "sandbox/latency_p50_s": 0.125},
    2: {"reward/mean": 0.5, "stop/answer": 0.75, "sandbox/latency_p50_s": 0.0625},
    3: {"reward/mean": 0.75, "stop/answer": 1.0, "sandbox/latency_p50_s": 0.03125},
}
CONFIG = {"model": {"name": "tiny-random"}, "train": {"steps": 3, "run_dir": Path("/runs/x")}}


@pytest.fixture(autouse=True)
def hostile_env() -> None:
    os.environ.update(
        {
            "WANDB_MODE": "online",
            "WANDB_API_KEY": "x" * 40,
            "SWANLAB_MODE": "cloud",
            "SWANLAB_API_KEY": "x" * 21,
        }
    )


def need(package: str) -> None:
    pytest.importorskip(
        package, reason=f"{package} is not installed: pip install 'retool-rl[track]'"
    )


def run_three_steps(kind: str, run_dir: Path) -> None:
    tracker = make_tracker(kind, run_dir, "demo-run", CONFIG)
    for step, metrics in STEPS.items():
        # numpy and bool values, as the loop may hand over: the tracker makes floats
        logged = {name: np.float32(value) for name, value in metrics.items()}
        tracker.log(logged, step)
    tracker.close()
    assert tracker.failures == 0


def expected(name: str) -> list[tuple[int, float]]:
    return [(step, metrics[name]) for step, metrics in STEPS.items()]


def only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


# --- TensorBoard ---------------------------------------------------------------------------


def test_tensorboard_writes_scalars_with_slash_names(tmp_path: Path, isolated_env: Path) -> None:
    need("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_three_steps("tensorboard", tmp_path / "run")

    log_dir = tmp_path / "run" / "tensorboard"
    only(sorted(log_dir.glob("events.out.tfevents.*")))
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(STEPS[1])
    for name in STEPS[1]:
        got = [(e.step, e.value) for e in events.Scalars(name)]
        assert [s for s, _ in got] == [1, 2, 3]
        assert [v for _, v in got] == pytest.approx([v for _, v in expected(name)])
    assert events.SummaryMetadata("config").plugin_data.plugin_name == "text"
    config_text = events.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "demo-run" in config_text and '"tiny-random"' in config_text
    assert list(isolated_env.iterdir()) == []


# --- Weights & Biases ----------------------------------------------------------------------


def wandb_records(path: Path) -> Iterator[object]:
    """The records of an offline ``.wandb`` file.

    The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic, version),
    then 32 KiB blocks of chunks ``crc32c(4) length(2) type(1) data``, type
    1=FULL, 2=FIRST, 3=MIDDLE, 4=LAST; each record a ``wandb_internal.Record``.
    wandb 0.31 ships no Python reader for it, hence these lines.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:  # zero fill
            continue
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        elif kind in (2, 3):
            pending += chunk


def test_wandb_writes_an_offline_run(tmp_path: Path, isolated_env: Path) -> None:
    need("wandb")
    run_three_steps("wandb", tmp_path / "run")
    assert os.environ["WANDB_MODE"] == "offline"  # forced over the shell's "online"

    run_path = only(sorted((tmp_path / "run" / "wandb").glob("offline-run-*")))
    records = list(wandb_records(only(sorted(run_path.glob("run-*.wandb")))))
    history: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                name = item.key or "/".join(item.nested_key)
                history.setdefault(name, []).append(
                    (record.history.step.num, json.loads(item.value_json))
                )
    for name in STEPS[1]:
        assert [s for s, _ in history[name]] == [1, 2, 3]
        assert [v for _, v in history[name]] == pytest.approx([v for _, v in expected(name)])
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "demo-run" and run.project == "retool"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["model"] == {"name": "tiny-random"}
    assert config["train"] == {"steps": 3, "run_dir": "/runs/x"}
    assert list(isolated_env.iterdir()) == []


# --- SwanLab -------------------------------------------------------------------------------


def swanlab_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """``{name: [(step, value)]}`` from a ``run-*.swanlab`` file, via SwanLab's own reader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader = DataStoreReader()
    reader.open(str(path))
    scalars: dict[str, list[tuple[int, float]]] = {}
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        if record.HasField("scalar"):
            scalar = record.scalar
            scalars.setdefault(scalar.key, []).append((scalar.step, scalar.value.number))
    return scalars


def test_swanlab_writes_an_offline_run(tmp_path: Path, isolated_env: Path) -> None:
    need("swanlab")
    run_three_steps("swanlab", tmp_path / "run")
    assert os.environ["SWANLAB_MODE"] == "offline"  # forced over the shell's "cloud"

    run_path = only(sorted((tmp_path / "run" / "swanlab").glob("run-*")))
    store = only(sorted(run_path.glob("run-*.swanlab")))
    raw = store.read_bytes()
    assert all(name.encode() in raw for name in STEPS[1])
    config = (run_path / "files" / "config.yaml").read_text()
    assert "tiny-random" in config and "/runs/x" in config
    try:
        scalars = swanlab_scalars(store)
    except ImportError:  # SwanLab moved its internal reader: the names above must do
        return
    for name in STEPS[1]:
        assert [s for s, _ in scalars[name]] == [1, 2, 3]
        assert [v for _, v in scalars[name]] == pytest.approx([v for _, v in expected(name)])
    assert list(isolated_env.iterdir()) == []


# --- after start, a failing backend never stops training ---------------------------------


def _break_tensorboard(tracker: object) -> None:
    tracker._writer.close()  # type: ignore[attr-defined]


def _break_run(tracker: object) -> None:
    tracker._run.finish()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kind", "break_it"),
    [("tensorboard", _break_tensorboard), ("wandb", _break_run), ("swanlab", _break_run)],
)
def test_a_log_failure_warns_once_and_training_goes_on(
    kind: str, break_it, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    need(kind)
    tracker = make_tracker(kind, tmp_path / "run", "demo-run", CONFIG)
    tracker.log(STEPS[1], 1)
    assert tracker.failures == 0
    break_it(tracker)  # the backend dies behind the tracker's back
    with caplog.at_level(logging.WARNING, logger="retool.tracking"):
        tracker.log(STEPS[2], 2)
        tracker.log(STEPS[3], 3)
        tracker.close()
    assert tracker.failures >= 2
    ours = [r for r in caplog.records if r.name.startswith("retool.tracking")]
    assert len(ours) == 1
    assert f"tracker {kind}: log failed" in ours[0].getMessage()


@pytest.mark.parametrize("kind", ["tensorboard", "wandb", "swanlab"])
def test_each_tracker_needs_only_its_own_package(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(kind)
    for other in {"tensorboard", "wandb", "swanlab"} - {kind}:
        monkeypatch.setitem(sys.modules, other, None)  # `import other` fails as if not installed
    run_three_steps(kind, tmp_path / "run")  # asserts no failures, close included
