"""SwanLab, W&B and TensorBoard, each started in its offline mode.

These machines have no network, and a dashboard must not make a run depend on
one, so every backend writes files under the run directory and nothing else:

* **SwanLab** runs in ``mode="offline"`` and writes ``<run_dir>/swanlab/run-*/``
  (``run-<id>.swanlab``, its record log, plus ``files/config.yaml``); upload it
  later with ``swanlab sync <that dir>``. SwanLab's ``"local"`` mode writes the
  same records but wants the separate ``swanboard`` dashboard package and logs
  an error without it, so offline is the quiet, complete choice. Its terminal
  proxy is turned off: the CLI owns stdout.
* **W&B** runs in ``mode="offline"`` with ``dir=<run_dir>`` and writes
  ``<run_dir>/wandb/offline-run-*/run-<id>.wandb``; upload later with
  ``wandb sync``. Offline has to be process-wide, not just per run: W&B's
  telemetry exporter reads the global settings, and with only the run in
  offline mode it still resolves ``api.forge.coreweave.com``. So ``WANDB_MODE``
  is forced to ``offline`` in ``os.environ`` (left set: any later W&B use in
  this process stays offline too) and passed to ``wandb.setup``. Console
  capture is off, as for SwanLab.
* **TensorBoard** writes ``<run_dir>/tensorboard/events.out.tfevents.*`` through
  TensorBoard's own ``EventFileWriter`` -- the writer that
  ``torch.utils.tensorboard.SummaryWriter`` wraps -- so the ``track`` extra is
  enough and a Tinker run needs no torch. Scalars are ``simple_value`` events,
  as ``SummaryWriter.add_scalar`` writes them; the config is one text summary.
  Each step is flushed: steps are seconds apart, and a killed run keeps its
  curve.

Metric names keep their slashes (``reward/mean``): W&B and TensorBoard group
panels by the prefix, SwanLab stores the name as is. Each backend's package is
imported only when that backend is asked for.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retool.tracking.base import BaseTracker

log = logging.getLogger(__name__)

PROJECT = "retool"


def plain_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as JSON-able nested dicts/lists/scalars (paths and the like as ``str``)."""
    return json.loads(json.dumps(dict(config), default=str))


class SwanLabTracker(BaseTracker):
    kind = "swanlab"

    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        super().__init__()
        # Forced, not defaulted: SWANLAB_MODE=cloud in a user's shell would upload.
        os.environ["SWANLAB_MODE"] = "offline"
        import swanlab

        self.log_dir = Path(run_dir) / "swanlab"
        settings = swanlab.Settings(
            mode="offline",
            terminal=swanlab.Settings.Terminal(proxy_type="none"),
        )
        # reinit=True: SwanLab keeps one run per process; a second tracker in the
        # same process (SFT then RL, or tests) finishes the first one.
        self._run = swanlab.init(
            mode="offline",
            log_dir=str(self.log_dir),
            project=os.environ.get("SWANLAB_PROJECT") or PROJECT,
            name=run_name,
            config=plain_config(config),
            settings=settings,
            reinit=True,
        )

    def _write(self, values: dict[str, float], step: int) -> None:
        self._run.log(values, step=step)

    def _finish(self) -> None:
        self._run.finish()
        log.info("swanlab: offline run under %s; upload with `swanlab sync`", self.log_dir)


class WandbTracker(BaseTracker):
    kind = "wandb"

    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        super().__init__()
        os.environ["WANDB_MODE"] = "offline"  # forced: see the module docstring
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(mode="offline", console="off")
        wandb.setup(settings=settings)
        # reinit="create_new": this run is ours alone; it neither finishes nor
        # reuses a run someone else started in this process.
        self._run = wandb.init(
            dir=str(run_dir),
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            name=run_name,
            config=plain_config(config),
            mode="offline",
            settings=settings,
            reinit="create_new",
        )
        self.run_path = Path(self._run.dir).parent  # <run_dir>/wandb/offline-run-*

    def _write(self, values: dict[str, float], step: int) -> None:
        self._run.log(values, step=step)

    def _finish(self) -> None:
        import wandb

        self._run.finish()
        # finish() returns before wandb-core has written the run file (it lags by
        # tens of ms); stopping the service flushes it, so after close() the file
        # is complete. Only when no other W&B run is active in this process.
        if _no_active_wandb_run():
            wandb.teardown()
        log.info(
            "wandb: offline run in %s; upload with `wandb sync %s`", self.run_path, self.run_path
        )


def _no_active_wandb_run() -> bool:
    """True when this process has no W&B run still open (when unsure: False)."""
    try:
        from wandb.sdk import wandb_setup

        return wandb_setup.singleton().most_recent_active_run is None
    except Exception:
        return False


class TensorBoardTracker(BaseTracker):
    kind = "tensorboard"

    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> None:
        super().__init__()
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        self.log_dir = Path(run_dir) / "tensorboard"
        self._writer = EventFileWriter(str(self.log_dir))
        self._write_config(run_name, config)

    def _write_config(self, run_name: str, config: Mapping[str, Any]) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb

        text = json.dumps(plain_config(config), indent=2, sort_keys=True)
        summary = text_pb("config", f"run `{run_name}`\n\n```json\n{text}\n```")
        self._writer.add_event(
            self._event_pb2.Event(wall_time=time.time(), step=0, summary=summary)
        )
        self._writer.flush()

    def _write(self, values: dict[str, float], step: int) -> None:
        summary = self._summary_pb2.Summary(
            value=[
                self._summary_pb2.Summary.Value(tag=name, simple_value=value)
                for name, value in values.items()
            ]
        )
        event = self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
        self._writer.add_event(event)
        self._writer.flush()

    def _finish(self) -> None:
        self._writer.close()
        log.info(
            "tensorboard: events in %s; view with `tensorboard --logdir %s`",
            self.log_dir,
            self.log_dir,
        )
