"""The run directory: nothing lost, nothing doubled.

::

    runs/<name>/
      config.toml              the resolved config (checked again on --resume)
      metrics.jsonl            exactly one line per completed step, each with its "step"
      checkpoints.jsonl        the manifest: step, state_path, sampler_path, time
      checkpoints/state/...    optimizer + weights (save_state)
      checkpoints/sampler/...  sampler weights (save_weights_for_sampler)
      rollouts/step_000001.jsonl.gz   every trajectory of a completed step
      journal/step_000002.jsonl       trajectories of the step in progress, as they end
      eval/step_000010.jsonl   ``retool eval`` results of the policy after that step
      log.txt                  the step summaries

Rules that make a kill at any moment safe:

* A checkpoint exists only once its manifest line is written, after both of
  its directories are complete (each is written to a temporary sibling and
  renamed). A half-written checkpoint is invisible and is overwritten later.
* A step is complete once its metrics line is written (rollouts file first,
  by rename). ``--resume`` continues from the last checkpoint: metrics lines,
  rollout files and journals of later steps are discarded, and those steps
  run again with the same seeds.
* The journal of the step right after the checkpoint is kept: the groups it
  completed are reused instead of sampled again (which matters when sampling
  is paid for). A torn last line of any JSONL file is ignored.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.config import RunConfig, load_config
from retool.data.examples import MathExample
from retool.errors import RetoolError
from retool.rollout import Trajectory

# Keys that may differ on --resume: how long to run, how often to save, and the
# spend limits (a budget stop tells the user to raise them and resume).
RESUMABLE_CHANGES = {
    ("train", "steps"),
    ("train", "save_every"),
    ("cost", "max_tokens"),
    ("cost", "max_money"),
}


@dataclass(frozen=True)
class CheckpointRecord:
    """One line of ``checkpoints.jsonl``."""

    step: int  # steps completed when it was saved (weights after this many updates)
    state_path: str  # save_state directory (weights + optimizer + RNG)
    sampler_path: str  # sampler weights directory (loadable by ``retool eval``)
    time: float  # unix time of the manifest line


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Lines of a JSONL file; a torn (unparsable) last line is dropped."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # killed mid-write
            raise RetoolError(
                f"{path}:{number}: not valid JSON; the run directory is damaged"
            ) from None
    return records


def _append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and make it durable before returning."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def config_to_toml(config: RunConfig) -> str:
    """The resolved config as TOML (every section, every key)."""
    out = []
    for section, values in config.to_dict().items():
        out.append(f"[{section}]")
        out += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        out.append("")
    return "\n".join(out)


def _config_differences(old: RunConfig, new: RunConfig) -> list[str]:
    differences = []
    a, b = old.to_dict(), new.to_dict()
    for section, values in b.items():
        for key, value in values.items():
            before = a.get(section, {}).get(key)
            if before != value and (section, key) not in RESUMABLE_CHANGES:
                differences.append(f"{section}.{key} ({before!r} -> {value!r})")
    return differences


class Journal:
    """Trajectories of one step, appended as they end."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, trajectory: Trajectory) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(trajectory.to_json()) + "\n")
            handle.flush()

    def complete_groups(
        self, batch: Sequence[MathExample], group_size: int
    ) -> dict[int, list[Trajectory]]:
        """Question slots whose whole group is journaled (for the same questions)."""
        by_slot: dict[int, dict[int, Trajectory]] = {}
        for record in _read_jsonl(self.path):
            trajectory = Trajectory.from_json(record)
            slot = trajectory.question_index
            if 0 <= slot < len(batch) and trajectory.example.id == batch[slot].id:
                by_slot.setdefault(slot, {})[trajectory.group_index] = trajectory
        return {
            slot: [members[g] for g in range(group_size)]
            for slot, members in by_slot.items()
            if set(members) == set(range(group_size))
        }

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class RunDirectory:
    """One run's files; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config_path = path / "config.toml"
        self.metrics_path = path / "metrics.jsonl"
        self.manifest_path = path / "checkpoints.jsonl"
        self.checkpoint_root = path / "checkpoints"
        self.rollouts_dir = path / "rollouts"
        self.journal_dir = path / "journal"
        self.eval_dir = path / "eval"
        self.log_path = path / "log.txt"

    # -- opening -------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], config: RunConfig, resume: bool) -> RunDirectory:
        """Create a new run directory, or reopen one for ``--resume``."""
        run = cls(Path(path))
        holds_run = run.metrics_path.exists() or run.manifest_path.exists()
        if run.path.exists() and not run.path.is_dir():
            raise RetoolError(f"run directory {run.path} is a file; choose another --run-dir")
        if resume:
            if not run.config_path.exists():
                raise RetoolError(
                    f"nothing to resume in {run.path} (no config.toml); drop --resume to start"
                )
            stored = load_config(run.config_path)
            differences = _config_differences(stored, config)
            if differences:
                raise RetoolError(
                    f"--resume: the config differs from the one in {run.config_path}: "
                    f"{', '.join(differences)}; resume with the same settings or start a new run"
                )
        elif holds_run:
            raise RetoolError(
                f"run directory {run.path} already holds a run; use --resume to continue it "
                "or choose another --run-dir"
            )
        try:
            run.path.mkdir(parents=True, exist_ok=True)
            for directory in (run.rollouts_dir, run.journal_dir, run.checkpoint_root):
                directory.mkdir(exist_ok=True)
            _write_atomic(run.config_path, config_to_toml(config).encode())
        except OSError as exc:
            raise RetoolError(
                f"cannot write the run directory {run.path}: {exc.strerror}"
            ) from None
        return run

    # -- checkpoints ---------------------------------------------------------------
    def checkpoints(self) -> list[CheckpointRecord]:
        fields = {f.name for f in dataclasses.fields(CheckpointRecord)}
        return [
            CheckpointRecord(**{k: v for k, v in record.items() if k in fields})
            for record in _read_jsonl(self.manifest_path)
        ]

    def last_checkpoint(self) -> CheckpointRecord | None:
        """The newest checkpoint whose directories are both on disk."""
        for record in reversed(self.checkpoints()):
            if Path(record.state_path).is_dir() and Path(record.sampler_path).is_dir():
                return record
        return None

    def add_checkpoint(self, step: int, state_path: str, sampler_path: str) -> CheckpointRecord:
        record = CheckpointRecord(step, str(state_path), str(sampler_path), time.time())
        _append_line(self.manifest_path, dataclasses.asdict(record))
        return record

    # -- steps -----------------------------------------------------------------------
    def completed_steps(self) -> list[int]:
        return [int(r["step"]) for r in _read_jsonl(self.metrics_path)]

    def metrics(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.metrics_path)

    def rollouts_path(self, step: int) -> Path:
        return self.rollouts_dir / f"step_{step:06d}.jsonl.gz"

    def eval_path(self, step: int) -> Path:
        return self.eval_dir / f"step_{step:06d}.jsonl"

    def journal(self, step: int) -> Journal:
        return Journal(self.journal_dir / f"step_{step:06d}.jsonl")

    def complete_step(
        self, step: int, metrics: dict[str, Any], records: Iterable[Trajectory | dict[str, Any]]
    ) -> None:
        """Rollouts file, then the step's metrics line (the commit point), then drop its journal.

        ``records`` are the step's trajectories (or, for SFT, its conversations).
        """
        lines = "".join(
            json.dumps(r.to_record() if isinstance(r, Trajectory) else r) + "\n" for r in records
        )
        _write_atomic(self.rollouts_path(step), gzip.compress(lines.encode(), mtime=0))
        _append_line(self.metrics_path, {"step": step, **metrics})
        self.journal(step).remove()

    def rewind(self, step: int) -> None:
        """Forget every step after ``step`` (the checkpoint a resume starts from).

        Keeps the journal of ``step + 1``: it was sampled by the checkpoint's weights.
        """
        kept = [r for r in _read_jsonl(self.metrics_path) if int(r["step"]) <= step]
        _write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept).encode())
        for path in self.rollouts_dir.glob("step_*.jsonl.gz"):
            if int(path.name[5:11]) > step:
                path.unlink()
        for path in self.journal_dir.glob("step_*.jsonl"):
            if int(path.name[5:11]) != step + 1:
                path.unlink()
        for path in self.eval_dir.glob("step_*.jsonl"):
            if int(path.name[5:11]) > step:
                path.unlink()
        records = [r for r in _read_jsonl(self.manifest_path) if int(r["step"]) <= step]
        _write_atomic(self.manifest_path, "".join(json.dumps(r) + "\n" for r in records).encode())

    def log(self, line: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


def read_rollouts(path: Path) -> Iterator[dict[str, Any]]:
    """The trajectory records of one ``rollouts/step_*.jsonl.gz`` file."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            yield json.loads(line)
