"""What every command shares: parsing, settings, paths, run directories (one place for each).

Design rules of the ``retool`` command line, enforced here so that each
command cannot forget one:

* **One line per mistake.** :class:`Parser` prints an argument error as one
  line (``retool: error: ...``, exit 2) instead of argparse's usage block;
  everything else the user can get wrong is a
  :class:`~retool.errors.RetoolError`, printed the same way by
  :func:`retool.cli.main`.
* **Checked before work.** Numbers are checked by their argparse type
  (:func:`add_number`: finite, within a range that ``--help`` states), paths
  by :mod:`retool.data.files` and run directories by :func:`check_run_dir`,
  all before a model loads or a file is written.
* **One precedence.** A flag beats ``--set section.key=value``, which beats
  the ``--config`` file, which beats the built-in default. Flags that mirror
  a config key default to ``None`` and only override when given.
* **Nothing silently ignored.** A ``--set`` key the command does not use is
  refused, naming the key and what to use instead (:func:`load_command_config`):
  the keys a command never reads (its ``unused`` table, and ``demo.*``, which
  only ``retool demo`` reads, for every command), and the keys that have no
  effect with the settings as resolved (:data:`IDLE`: a vLLM setting while
  ``sampler.engine = "local"``, ``rollout.max_oversample`` without dynamic
  sampling). Keys of a ``--config`` file that the command does not use are
  accepted: one file serves ``train``, ``eval`` and ``rollout``. Settings that
  contradict each other (``sampler.urls`` with the local engine) are refused
  from any source, by :mod:`retool.config`.
* **Every default in --help.** :class:`HelpFormatter` appends
  ``(default: ...)`` to every option that has one; options whose default is
  not a constant say it in words.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from retool.checks import check_number, format_bound
from retool.config import RunConfig, load_config_given, parse_override
from retool.data.files import check_output_dir
from retool.errors import ConfigError, DependencyError
from retool.interrupts import Interrupted
from retool.tracking.factory import PACKAGES

if TYPE_CHECKING:  # loaded by the commands that open a run, not by every command
    from retool.training.run_dir import RunDirectory

PRECEDENCE = "a flag > --set > the --config file > the built-in default"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps hand-wrapped descriptions, wraps one-line ones, and shows every default."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == [] or default == "==SUPPRESS=="
        if (
            action.option_strings
            and "default" not in text
            and not unset
            and not isinstance(action, argparse._VersionAction | argparse._HelpAction)
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other retool error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # name the subcommand whose --help lists what it takes
            words = [self.prog, *(getattr(parsed, k, None) for k in ("command", "kind", "verb"))]
            prog = " ".join(w for w in words if isinstance(w, str))
            self.exit(
                2,
                f"retool: error: unrecognized arguments: {' '.join(extras)} "
                f"(see `{prog} --help`)\n",
            )
        return parsed

    def error(self, message: str) -> NoReturn:
        # "argument --questions: --questions must be ..." says the flag twice
        message = re.sub(r"^argument (\S+?)(?:/\S+)?: (?=\1 )", "", message)
        self.exit(2, f"retool: error: {message} (see `{self.prog} --help`)\n")


def add_number(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    low: float | None,
    high: float | None,
    integer: bool = True,
    low_open: bool = False,
    help: str,
    **kwargs: Any,
) -> None:
    """An option whose value is checked (finite, in range) as it is parsed; --help states both."""

    def parse(text: str) -> int | float:
        try:
            value: int | float = int(text) if integer else float(text)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise argparse.ArgumentTypeError(f"{flag} must be {kind}, got {text!r}") from None
        try:
            check_number(flag, value, low, high, integer=integer, low_open=low_open)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    parse.__name__ = "integer" if integer else "number"
    lower = f"{'>' if low_open else '>='} {format_bound(low)}" if low is not None else ""
    upper = f"<= {format_bound(high)}" if high is not None else ""
    if low is not None and high is not None:
        bounds = f"in {'(' if low_open else '['}{format_bound(low)}, {format_bound(high)}]"
    else:
        bounds = lower or upper or "finite"
    kwargs.setdefault("metavar", "N" if integer else "X")
    parser.add_argument(flag, type=parse, help=f"{help}; {bounds}", **kwargs)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set section.key=value``."""
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        help="a TOML config file (default: the built-in defaults; configs/demo.toml lists every "
        "key)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help=f"override one config value (repeatable; default: none). Precedence: {PRECEDENCE}",
    )


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options of commands that write a run directory (``train``, ``sft``)."""
    parser.add_argument(
        "--run-dir", metavar="DIR", help="where the run lives (default: train.run_dir)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir from its last checkpoint",
    )
    parser.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start from these weights: a checkpoint state directory or a run directory "
        "(its last checkpoint) (default: model.base_model)",
    )
    parser.add_argument(
        "--tracker",
        choices=["swanlab", "wandb", "tensorboard"],
        help="also log to this tracker (offline mode; needs the 'track' extra; default: none, "
        "metrics.jsonl is always written)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bars (summary lines only)"
    )


def _override_key(text: str) -> str:
    section, key, _ = parse_override(text)
    return f"{section}.{key}"


def set_keys(args: argparse.Namespace) -> list[str]:
    """The ``section.key`` of every ``--set`` given, in order."""
    return [_override_key(text) for text in args.overrides]


# What no command that goes through load_command_config reads: `retool demo` is the only
# reader of [demo] (and hands its settings to the commands it runs in a config file).
UNUSED_BY_EVERY_COMMAND = {
    "demo": "only `retool demo` reads [demo] (the cold start and its evaluations)",
}


@dataclass(frozen=True)
class Idle:
    """Keys that have no effect while the resolved config is ``when`` (for every command)."""

    keys: frozenset[str]  # section.key
    when: Callable[[RunConfig], bool]  # the resolved config -> whether these keys do nothing
    because: str  # the setting that makes them idle, as the user would write it
    instead: str  # what to do


# vLLM settings of the in-process engine only (a `vllm serve` has its own)
_VLLM_IN_PROCESS: tuple[str, ...] = ("enforce_eager", "max_model_len", "kv_cache_gb")
_VLLM_IN_PROCESS += ("gpu_memory_utilization", "threads_bind")
IDLE = (
    Idle(
        frozenset(f"sampler.{k}" for k in ("dtype", "sync", *_VLLM_IN_PROCESS)),
        lambda c: c.sampler.engine == "local",
        'sampler.engine = "local" (the local backend samples; these are vLLM settings)',
        "add --set sampler.engine=vllm to sample with vLLM, or drop it",
    ),
    Idle(
        frozenset(f"sampler.{k}" for k in _VLLM_IN_PROCESS),
        lambda c: c.sampler.engine == "vllm" and bool(c.sampler.url_list),
        "sampler.urls names vllm serve endpoints (each server is started with its own)",
        "give it to `vllm serve`, or drop sampler.urls for the in-process engine",
    ),
    Idle(
        frozenset({"rollout.max_oversample"}),
        lambda c: not c.rollout.dynamic_sampling,
        "rollout.dynamic_sampling = false (no question is drawn to replace a dropped group)",
        "add --set rollout.dynamic_sampling=true, or drop it",
    ),
)


def check_idle(config: RunConfig, overrides: Sequence[str], rules: Sequence[Idle] = IDLE) -> None:
    """Refuse a ``--set`` that the resolved ``config`` makes a no-op (:data:`IDLE`)."""
    for text in overrides:
        key = _override_key(text)
        for rule in rules:
            if key in rule.keys and rule.when(config):
                raise ConfigError(
                    f"--set {text.strip()}: {key} has no effect while {rule.because}; "
                    f"{rule.instead}"
                )


def load_command_config(
    args: argparse.Namespace,
    command: str,
    *,
    unused: Mapping[str, str] = {},
    flags: Sequence[str] = (),
) -> RunConfig:
    """The run config of one command: ``--config``, then ``--set``, then ``flags`` (last wins).

    ``unused`` maps a section (``"data"``) or a key (``"rollout.group_size"``)
    that ``command`` does not read to what to use instead; a ``--set`` of one
    (or of ``demo.*``, :data:`UNUSED_BY_EVERY_COMMAND`) is refused rather than
    silently ignored, and so is one the resolved settings make a no-op
    (:data:`IDLE`, checked once the config is loaded). ``flags`` are the overrides the
    command's own flags stand for, applied last (:data:`PRECEDENCE`).
    """
    return load_command_config_given(args, command, unused=unused, flags=flags)[0]


def load_command_config_given(
    args: argparse.Namespace,
    command: str,
    *,
    unused: Mapping[str, str] = {},
    flags: Sequence[str] = (),
) -> tuple[RunConfig, frozenset[str]]:
    """:func:`load_command_config`, and the ``section.key`` names given (file, --set, flags)."""
    unused = {**UNUSED_BY_EVERY_COMMAND, **unused}
    for text in args.overrides:
        key = _override_key(text)
        reason = unused.get(key) or unused.get(key.split(".", 1)[0])
        if reason is not None:
            raise ConfigError(f"--set {text}: `retool {command}` does not use {key}; {reason}")
    config, given = load_config_given(args.config, [*args.overrides, *flags])
    check_idle(config, args.overrides)
    return config, given


def check_run_dir(path: str | os.PathLike[str], *, resume: bool, flag: str = "--run-dir") -> Path:
    """Refuse a run directory that ``train``/``sft`` would fail on, before anything loads.

    The same rules :meth:`RunDirectory.open` enforces, checked first so no
    model loads for nothing: a new run needs a directory that does not hold
    one; ``--resume`` needs one that does; either needs a writable place.
    """
    from retool.training.run_dir import refusal

    path = Path(path)
    check_output_dir(path, flag=flag)
    why = refusal(path, resume)
    if why:
        raise ConfigError(f"{flag} {path}: {why}")
    return path


_SKELETON = {
    "config.toml",
    "inputs.json",
    "numerics.json",
    "log.txt",
    "rollouts",
    "journal",
    "checkpoints",
}


@contextlib.contextmanager
def run_dir_rollback(path: str | os.PathLike[str]) -> Iterator[None]:
    """Remove a run directory this command created if it fails before its first step.

    A failure while the model loads (a device that is not there, a backend
    without an adapter, an interrupt) would otherwise leave a run directory
    holding only ``config.toml``, which the next attempt would have to
    clean up. Only a directory that did not exist (or was empty) before and
    still holds nothing but the empty skeleton is removed, and never after the
    training loop's own interrupt, which tells the user to ``--resume``.
    """
    path = Path(path)
    fresh = not path.exists() or (path.is_dir() and not any(path.iterdir()))
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, Interrupted):
            raise  # the loop said "continue with --resume": keep what --resume needs
        if fresh and _only_skeleton(path):
            for name in _SKELETON:
                entry = path / name
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                path.rmdir()
        raise


def _only_skeleton(path: Path) -> bool:
    if not path.is_dir():
        return False
    for entry in path.iterdir():
        if entry.name not in _SKELETON:
            return False
        if entry.is_dir() and any(entry.rglob("*")):
            return False
    return True


def check_saved_weights(backend: str, path: str | os.PathLike[str]) -> None:
    """Refuse saved sampler weights whose ``retool_sampler.json`` is damaged, before loading.

    The local backend reads that file when it loads the weights; reading it
    first makes a damaged one the command's one error line (not one after its
    "loading ..." note). It imports torch, which loading the model does anyway.
    """
    if backend == "local" and (Path(path) / "retool_sampler.json").is_file():
        from retool.backends.local.service import read_sampler_info

        read_sampler_info(Path(path))


def check_tracker(tracker: str | None) -> None:
    """The tracker's package is installed (a ``DependencyError`` naming the extra otherwise)."""
    if tracker:
        import importlib.util

        if importlib.util.find_spec(PACKAGES[tracker]) is None:  # without importing it (slow)
            raise DependencyError(
                f"--tracker {tracker} needs the {PACKAGES[tracker]!r} package, which is not "
                "installed; install it with: pip install 'retool-rl[track]'"
            )


def print_run(run: RunDirectory, then: str = "") -> None:
    """Where a training run lives and its last checkpoint."""
    print(f"run directory: {run.path}")
    last = run.last_checkpoint()
    if last is not None:
        print(f"last checkpoint: step {last.step}, sampler weights {last.sampler_path}")
        if then:
            print(then.format(run=run.path))


def say(text: str) -> None:
    """A progress note for people, on stderr (stdout stays the command's result)."""
    print(text, file=sys.stderr, flush=True)
