"""The run directory: nothing lost, nothing doubled.

::

    runs/<name>/
      config.toml              the resolved config (checked again on --resume)
      inputs.json              run kind, data hash, --init-from (see training.provenance)
      lock                     held while a command writes here (see training.run_lock)
      metrics.jsonl            exactly one line per completed step, each with its "step"
      checkpoints.jsonl        the manifest: step, state_path, sampler_path, time
                               (paths relative to the run directory)
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
  is paid for). A torn last line of any JSONL file is ignored, and cut off
  before the next line is appended (never glued onto).
* A new run (no ``--resume``) may start over an attempt that committed no
  step, but reuses none of its journal: those samples may come from other
  settings. It never replaces a ``config.toml`` that no run wrote (one
  without ``inputs.json``, which a run writes first).

Location independence: the manifest's paths are written relative to the run
directory and resolved against it, so a run resumes (and ``--init-from`` or
``retool eval`` reads it) from any working directory, after a move, and a
copy uses its own checkpoints. Older manifests hold paths relative to where
the run was started, or absolute ones; a checkpoint is then looked up by name
under this run directory's ``checkpoints/`` first, as written last.

One writer at a time: :meth:`RunDirectory.open` takes the directory's lock
(:mod:`retool.training.run_lock`) before it reads anything, and
:meth:`RunDirectory.close` (or the end of the process) releases it.
``--resume`` refuses what would make the continued run mean something else:
other settings (``config.toml``), another run kind or other data
(``inputs.json``), fewer ``train.steps`` than completed, and a run whose
checkpoints are all gone (it would silently start again at step 0 and
replace the committed steps).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool.config import RunConfig, load_config
from retool.data.examples import MathExample
from retool.data.files import write_atomic
from retool.data.longints import json_loads
from retool.errors import RetoolError
from retool.rollout import Trajectory
from retool.training import provenance, run_lock
from retool.training.faults import crash_point

# Keys that may differ on --resume: how long to run, how often to save, the spend
# limits (a budget stop tells the user to raise them and resume), and where the run
# directory is (it may have been moved: the directory opened is the run).
RESUMABLE_CHANGES = {
    ("train", "run_dir"),
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
    time: float = 0.0  # unix time of the manifest line (informational; 0 when absent)


_CHECKPOINT_KEYS = ("step", "state_path", "sampler_path")


def _damaged(path: Path, number: int, why: str, fix: str = "") -> RetoolError:
    fix = fix or "repair or remove that line, or start a new run in another --run-dir"
    return RetoolError(f"{path}:{number}: {why}; the run directory is damaged: {fix}")


def _read_jsonl(path: Path, required: Sequence[str] = (), fix: str = "") -> list[dict[str, Any]]:
    """Lines of a JSONL file; a torn (unparsable) last line is dropped.

    Any other line that is not UTF-8, not a JSON object or lacks a ``required``
    key is an error naming ``path:line`` (``fix`` says what to do).
    """
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines()
    records = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json_loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if number == len(lines):
                break  # killed mid-write
            why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "not valid JSON"
            raise _damaged(path, number, why, fix) from None
        if not isinstance(record, dict):
            raise _damaged(path, number, "not a JSON object", fix)
        missing = [key for key in required if key not in record]
        if missing:
            raise _damaged(path, number, f"no {missing[0]!r} field", fix)
        if "step" in required and (
            not isinstance(record["step"], int) or isinstance(record["step"], bool)
        ):
            raise _damaged(path, number, f"'step' is not an integer ({record['step']!r:.40})", fix)
        records.append(record)
    return records


def repair_tail(path: Path) -> None:
    """Cut a torn last line (no newline: killed mid-write) so the next append starts clean."""
    try:
        with open(path, "rb+") as handle:
            end = handle.seek(0, os.SEEK_END)
            if end == 0:
                return
            handle.seek(end - 1)
            if handle.read(1) == b"\n":
                return
            position = end
            while position > 0:  # back to the last complete line
                step = min(4096, position)
                handle.seek(position - step)
                block = handle.read(step)
                cut = block.rfind(b"\n")
                if cut >= 0:
                    position = position - step + cut + 1
                    break
                position -= step
            handle.truncate(position)
            handle.flush()
            os.fsync(handle.fileno())
    except FileNotFoundError:
        return


def step_of(path: Path) -> int:
    """The step number of ``step_NNNNNN.*`` under a run directory; another name is an error."""
    digits = path.name[5:11]
    if not (path.name.startswith("step_") and digits.isdigit() and path.name[11:12] == "."):
        raise RetoolError(
            f"{path}: unexpected file name under {path.parent.name}/ (expected step_NNNNNN.*); "
            "move it out of the run directory"
        )
    return int(digits)


def _append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and make it durable before returning."""
    repair_tail(path)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n"}
_TOML_ESCAPES.update({"\f": "\\f", "\r": "\\r"})


def toml_string(text: str) -> str:
    """A TOML basic string holding exactly ``text``.

    Not ``json.dumps``: it writes a character outside the BMP as a surrogate
    pair (``\\ud83d\\ude00``), which TOML refuses. Quotes, backslashes and
    control characters are escaped; everything else is written as it is.
    """
    out = []
    for char in text:
        if char in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        elif 0xD800 <= ord(char) <= 0xDFFF:  # a lone surrogate (undecodable bytes of a path)
            raise RetoolError(
                f"the setting {text!r} holds bytes that are not UTF-8, which config.toml "
                "cannot store; rename the path or give it in UTF-8"
            )
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return toml_string(str(value))


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
        self._repaired = False

    def append(self, trajectory: Trajectory) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self._repaired:  # a kill mid-line left a torn tail: never glue onto it
            repair_tail(self.path)
            self._repaired = True
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(trajectory.to_json()) + "\n")
            handle.flush()

    def complete_groups(
        self, batch: Sequence[MathExample], group_size: int
    ) -> dict[int, list[Trajectory]]:
        """Question slots whose whole group is journaled (for the same questions)."""
        by_slot: dict[int, dict[int, Trajectory]] = {}
        fix = f"delete {self.path} (its groups are sampled again)"
        for number, record in enumerate(_read_jsonl(self.path, fix=fix), 1):
            try:
                trajectory = Trajectory.from_json(record)
            except (KeyError, TypeError, ValueError, AttributeError):
                raise _damaged(self.path, number, "not a trajectory record", fix) from None
            slot = trajectory.question_index
            if 0 <= slot < len(batch) and trajectory.example.id == batch[slot].id:
                by_slot.setdefault(slot, {})[trajectory.group_index] = trajectory
        return {
            slot: [members[g] for g in range(group_size)]
            for slot, members in by_slot.items()
            if set(members) == set(range(group_size))
        }

    def complete_group_count(self, group_size: int) -> int:
        """Question slots with a whole group journaled (what a resume reuses)."""
        by_slot: dict[int, set[int]] = {}
        for record in _read_jsonl(self.path):
            slot, group = record.get("question_index"), record.get("group_index")
            if isinstance(slot, int) and isinstance(group, int):
                by_slot.setdefault(slot, set()).add(group)
        return sum(1 for groups in by_slot.values() if groups >= set(range(group_size)))

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
        self.lock_note: str | None = None  # a stale lock taken over (see run_lock)
        self.completed_at_open = 0  # the last committed step when --resume opened it
        # train.max_off_policy_steps: journals outlive their step's commit until a
        # checkpoint covers them (see complete_step, add_checkpoint, rewind)
        self.lag = 0

    # -- opening -------------------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.path / run_lock.RUN_LOCK_NAME

    @property
    def inputs_path(self) -> Path:
        return self.path / provenance.INPUTS_NAME

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: RunConfig,
        resume: bool,
        *,
        inputs: provenance.RunInputs | None = None,
        init_from: str | None = None,
    ) -> RunDirectory:
        """Create a new run directory, or reopen one for ``--resume``; holds its lock.

        ``inputs`` (the run kind and its data) and ``init_from`` are recorded
        in ``inputs.json`` for a new run and checked on ``--resume``.
        """
        run = cls(Path(path))
        run.lag = config.train.max_off_policy_steps
        if run.path.exists() and not run.path.is_dir():
            raise RetoolError(f"run directory {run.path} is a file; choose another --run-dir")
        if resume and (why := refusal(run.path, resume=True)):
            raise RetoolError(f"run directory {run.path}: {why}")
        try:
            run.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RetoolError(
                f"cannot write the run directory {run.path}: {exc.strerror}"
            ) from None
        run.lock_note = run_lock.acquire(run.lock_path, f"run directory {run.path}")
        try:
            record = run._check(config, resume, inputs, init_from)
            for directory in (run.rollouts_dir, run.journal_dir, run.checkpoint_root):
                directory.mkdir(exist_ok=True)
            if not resume:  # an earlier attempt's samples (other settings?) are not reused
                for path in run.journal_dir.glob("step_*.jsonl"):
                    path.unlink()
            if record is not None:  # first: a config.toml without it is no run's (see _check)
                write_atomic(run.inputs_path, (json.dumps(record, indent=2) + "\n").encode())
            write_atomic(run.config_path, config_to_toml(config).encode())
        except OSError as exc:
            run.close()
            raise RetoolError(
                f"cannot write the run directory {run.path}: {exc.strerror}"
            ) from None
        except BaseException:
            run.close()
            raise
        return run

    def _check(
        self,
        config: RunConfig,
        resume: bool,
        inputs: provenance.RunInputs | None,
        init_from: str | None,
    ) -> dict[str, Any] | None:
        """Refuse a resume that would mean something else; the inputs record to write."""
        if not resume:
            why = refusal(self.path, resume=False)
            if why:
                raise RetoolError(f"run directory {self.path} {why}")
            state = resolve_checkpoint(init_from) if init_from else None
            return provenance.record_start(self.path, inputs, init_from, state)
        stored = load_config(self.config_path)
        differences = _config_differences(stored, config)
        if differences:
            raise RetoolError(
                f"--resume: the config differs from the one in {self.config_path}: "
                f"{', '.join(differences)}; resume with the same settings or start a new run"
            )
        record = provenance.check_resume(self.inputs_path, inputs)
        completed = self.completed_steps()
        self.completed_at_open = max(completed, default=0)
        if config.train.steps < self.completed_at_open:
            raise RetoolError(
                f"--resume: train.steps = {config.train.steps}, but {self.path} has completed "
                f"{self.completed_at_open} steps; ask for at least {self.completed_at_open} "
                "(a shorter run is another run: start it in another --run-dir)"
            )
        # The recorded numerics are read back after the model loads (training/numerics.py);
        # a damaged numerics.json is refused here, before anything of the run is rewritten.
        from retool.training.numerics import read_numerics

        read_numerics(self.path)
        listed = self.checkpoints()
        if listed and self.last_checkpoint() is None:
            raise RetoolError(
                f"--resume: none of the {len(listed)} checkpoints listed in "
                f"{self.manifest_path} is on disk (under {self.checkpoint_root}); restore "
                "them, or start a new run in another --run-dir (resuming would start again "
                f"at step 0 and replace the {len(completed)} committed steps)"
            )
        if record is None:  # a run from before inputs.json: record what it is resumed with
            return provenance.record_start(self.path, inputs, None, None)
        return None

    def close(self) -> None:
        """Release the lock (the process's end does it too)."""
        run_lock.release(self.lock_path)

    def resume_line(self, start: int, reused_groups: int) -> str:
        """One line saying where a resumed run continues."""
        discarded = self.completed_at_open - start
        if start == 0:
            line = "resuming from the start: the run has no checkpoint yet"
            if init := provenance.recorded_init_from_spec(self.inputs_path):
                line += f" (starting again from --init-from {init})"
        else:
            line = f"resuming after step {start} from checkpoint step {start}"
        line += f"; {reused_groups} journaled groups reused"
        if discarded > 0:
            line += (
                f"; {discarded} completed step{'s' if discarded > 1 else ''} after it run "
                "again with the same seeds"
            )
        return line

    def announce_start(self, start: int, resume: bool, group_size: int) -> None:
        """Log where the run starts; on --resume, also say it in one line on stderr."""
        if self.lock_note:
            print(f"retool: note: {self.lock_note}", file=sys.stderr, flush=True)
            self.log(self.lock_note)
        if not resume:
            self.log("starting at step 0")
            return
        line = self.resume_line(start, self.journal(start + 1).complete_group_count(group_size))
        self.log(line)
        print(line, file=sys.stderr, flush=True)

    # -- checkpoints ---------------------------------------------------------------
    def _locate(self, recorded: str, kind: str) -> str:
        """A manifest path as it is on disk now (see the module docstring)."""
        path = Path(recorded)
        candidates = [self.path / path] if not path.is_absolute() else []
        candidates += [self.checkpoint_root / kind / path.name, path]
        return str(next((c for c in candidates if c.is_dir()), candidates[0]))

    def _relative(self, path: str) -> str:
        """``path`` relative to the run directory when inside it; absolute otherwise."""
        target = Path(path).absolute()
        with contextlib.suppress(OSError, ValueError):
            return str(target.resolve().relative_to(self.path.resolve()))
        return str(target)

    def checkpoints(self) -> list[CheckpointRecord]:
        """The manifest, with each path resolved against this run directory."""
        fields = {f.name for f in dataclasses.fields(CheckpointRecord)}
        records = []
        for record in _read_jsonl(self.manifest_path, _CHECKPOINT_KEYS):
            record = {k: v for k, v in record.items() if k in fields}
            record["state_path"] = self._locate(str(record["state_path"]), "state")
            record["sampler_path"] = self._locate(str(record["sampler_path"]), "sampler")
            records.append(CheckpointRecord(**record))
        return records

    def last_checkpoint(self) -> CheckpointRecord | None:
        """The newest checkpoint whose directories are both on disk."""
        for record in reversed(self.checkpoints()):
            if Path(record.state_path).is_dir() and Path(record.sampler_path).is_dir():
                return record
        return None

    def add_checkpoint(self, step: int, state_path: str, sampler_path: str) -> CheckpointRecord:
        record = CheckpointRecord(
            step, self._relative(state_path), self._relative(sampler_path), time.time()
        )
        _append_line(self.manifest_path, dataclasses.asdict(record))
        if self.lag:  # a resume from here reuses the journals after ``step`` only
            for path in self.journal_dir.glob("step_*.jsonl"):
                if step_of(path) <= step:
                    path.unlink(missing_ok=True)
        return dataclasses.replace(
            record, state_path=str(state_path), sampler_path=str(sampler_path)
        )

    # -- steps -----------------------------------------------------------------------
    def completed_steps(self) -> list[int]:
        return [int(r["step"]) for r in _read_jsonl(self.metrics_path, ("step",))]

    def metrics(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.metrics_path, ("step",))

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

        ``records`` are the step's trajectories (or, for SFT, its conversations). With
        ``lag`` (``train.max_off_policy_steps``) the journal stays until a checkpoint of
        this step or a later one is listed: a resume from an earlier checkpoint cannot
        sample this step again (the policy that sampled it is older than the checkpoint),
        so it reuses the journal.
        """
        lines = "".join(
            json.dumps(r.to_record() if isinstance(r, Trajectory) else r) + "\n" for r in records
        )
        write_atomic(self.rollouts_path(step), gzip.compress(lines.encode(), mtime=0))
        crash_point("rollouts", step)
        _append_line(self.metrics_path, {"step": step, **metrics})
        if not self.lag:
            self.journal(step).remove()

    def rewind(self, step: int) -> None:
        """Forget every step after ``step`` (the checkpoint a resume starts from).

        Keeps the journal of ``step + 1``: it was sampled by the checkpoint's weights;
        with ``lag`` = k those of steps ``step + 1 .. step + 1 + k`` (sampled by the
        policies after ``step - k .. step`` steps, :mod:`retool.training.overlap`).
        """
        kept = [r for r in _read_jsonl(self.metrics_path, ("step",)) if int(r["step"]) <= step]
        write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept).encode())
        for path in self.rollouts_dir.glob("step_*.jsonl.gz"):
            if step_of(path) > step:
                path.unlink()
        for path in self.journal_dir.glob("step_*.jsonl"):
            if not step + 1 <= step_of(path) <= step + 1 + self.lag:
                path.unlink()
        for path in self.eval_dir.glob("step_*.jsonl"):
            if step_of(path) > step:
                path.unlink()
        records = [
            r for r in _read_jsonl(self.manifest_path, _CHECKPOINT_KEYS) if int(r["step"]) <= step
        ]
        write_atomic(self.manifest_path, "".join(json.dumps(r) + "\n" for r in records).encode())

    def log(self, line: str) -> None:
        """Append to ``log.txt``; a full disk loses the line, never the error being handled."""
        with contextlib.suppress(OSError), open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


def refusal(path: str | os.PathLike[str], resume: bool) -> str | None:
    """Why ``train``/``sft`` would refuse ``path`` as its run directory (a phrase whose
    subject is the directory), or None.

    The rules :meth:`RunDirectory.open` enforces, in one place so that the
    CLI's early check (before a model loads) and ``retool doctor`` say what the
    run itself would: ``--resume`` needs a ``config.toml``; a new run needs a
    directory without a run's metrics or manifest, and never replaces a
    ``config.toml`` that no run wrote (one without ``inputs.json``).
    """
    path = Path(path)
    config = path / "config.toml"
    if resume:
        if not config.is_file():
            return "nothing to resume (no config.toml); drop --resume to start a new run"
        return None
    if (path / "metrics.jsonl").exists() or (path / "checkpoints.jsonl").exists():
        return "already holds a run; use --resume to continue it or choose another --run-dir"
    if config.exists() and not (path / provenance.INPUTS_NAME).exists():
        return (
            f"holds a config.toml that no run wrote (a new run would replace it); move {config} "
            "away or choose another --run-dir"
        )
    return None


def check_run_dir_free(path: str | os.PathLike[str]) -> None:
    """Refuse at once (before a model loads) a run directory another process writes."""
    lock_file = Path(path) / run_lock.RUN_LOCK_NAME
    run_lock.check_free(lock_file, f"run directory {path}")


def lock_refusal(path: str | os.PathLike[str]) -> str | None:
    """What :func:`check_run_dir_free` would refuse ``path`` with now, or None.

    The same message ``train``/``sft`` print (``run directory X is in use by
    pid N on HOST ...``), found without taking, rewriting or removing the lock,
    for ``retool doctor`` (:func:`retool.training.run_lock.probe`).
    """
    lock_file = Path(path) / run_lock.RUN_LOCK_NAME
    return run_lock.probe(lock_file, f"run directory {path}")


@contextlib.contextmanager
def released(path: str | os.PathLike[str]) -> Iterator[None]:
    """Release this process's lock on a run directory when the block ends, however it ends."""
    try:
        yield
    finally:
        run_lock.release(Path(path) / run_lock.RUN_LOCK_NAME)


def read_rollouts(path: Path) -> Iterator[dict[str, Any]]:
    """The trajectory records of one ``rollouts/step_*.jsonl.gz`` file."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            yield json_loads(line)


def resolve_checkpoint(spec: str) -> Path:
    """``--init-from``: a state directory, or a run directory (its latest checkpoint)."""
    path = Path(spec).expanduser()
    if (path / "retool_state.json").is_file():
        return path
    if (path / "checkpoints.jsonl").is_file():
        record = RunDirectory(path).last_checkpoint()
        if record is None:
            raise RetoolError(f"--init-from {spec}: the run has no complete checkpoint")
        return Path(record.state_path)
    raise RetoolError(
        f"--init-from {spec}: not a checkpoint (no retool_state.json) nor a run directory "
        "(no checkpoints.jsonl)"
    )
