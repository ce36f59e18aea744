"""What ``--model`` names: an alias, a model directory, saved sampler weights, or a run.

Resolution order (first match wins), all checked before any weights load:

1. an existing path:
   * a run directory (``checkpoints.jsonl``): its latest checkpoint's sampler weights;
   * saved sampler weights (``retool_sampler.json``: a PEFT adapter or merged weights);
   * an HF model directory (``config.json``), a ``.gguf`` file or a directory holding one;
2. ``RUN_DIR@STEP``: the checkpoint of that step in the run directory;
3. a model alias (``smollm2-135m-instruct``, ``tiny-random``);
4. with a remote backend (``backend`` is ``pytrio`` or ``tinker``), any other
   name is the service's model name (``Qwen/Qwen3.5-4B``): the service
   checks it when the sampling client is created.

Anything else is one :class:`~retool.errors.ConfigError` that says what a
model can be. A manifest's ``sampler_path`` is written relative to the
directory ``retool train`` ran in; when it is not found as written it is
looked up under ``RUN_DIR/checkpoints/sampler/`` by name, so a run directory
can be moved or evaluated from another directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retool.errors import ConfigError
from retool.training.run_dir import RunDirectory

ALIASES = ("smollm2-135m-instruct", "tiny-random")


@dataclass(frozen=True)
class ModelSpec:
    """A resolved ``--model``."""

    spec: str  # what the user wrote
    kind: str  # alias | hf | sampler | run | service
    path: str  # what the backend opens: an alias, a model directory or sampler weights
    step: int | None = None  # the checkpoint's training step (kind == "run")

    def to_dict(self) -> dict[str, object]:
        return {"spec": self.spec, "kind": self.kind, "path": self.path, "step": self.step}


def _sampler_dir(run: Path, recorded: str) -> Path | None:
    path = Path(recorded)
    candidates = [path] if path.is_absolute() else [path, run / path]
    candidates.append(run / "checkpoints" / "sampler" / path.name)
    return next((c for c in candidates if (c / "retool_sampler.json").is_file()), None)


def _from_run(spec: str, run: Path, step: int | None, flag: str = "--model") -> ModelSpec:
    try:
        records = RunDirectory(run).checkpoints()
    except Exception as exc:  # a damaged manifest
        raise ConfigError(
            f"{flag} {spec}: cannot read {run / 'checkpoints.jsonl'}: {exc}"
        ) from None
    usable = [(r, d) for r in records if (d := _sampler_dir(run, r.sampler_path)) is not None]
    if step is None:
        if not usable:
            raise ConfigError(
                f"{flag} {spec}: the run directory has no complete checkpoint yet "
                "(checkpoints.jsonl lists none whose sampler weights are on disk)"
            )
        record, directory = usable[-1]
        return ModelSpec(spec, "run", str(directory), record.step)
    for record, directory in reversed(usable):
        if record.step == step:
            return ModelSpec(spec, "run", str(directory), step)
    steps = sorted({r.step for r, _ in usable})
    available = ", ".join(map(str, steps)) if steps else "none"
    raise ConfigError(
        f"{flag} {spec}: no checkpoint of step {step} in {run}; available: {available}"
    )


def resolve_model_spec(spec: str, flag: str = "--model", backend: str = "local") -> ModelSpec:
    """Resolve ``--model`` (see the module docstring); raises :class:`ConfigError`.

    ``flag`` is how errors name the setting (``model.base_model`` when it came
    from the config); ``backend`` is ``model.backend``.
    """
    if not isinstance(spec, str):
        raise ConfigError(f"{flag} must be a string, got {spec!r}")
    if not spec.strip():
        raise ConfigError(f"{flag} must not be empty")
    if "\0" in spec:
        raise ConfigError(f"{flag} must not contain a NUL character, got {spec!r}")
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_dir() and (path / "checkpoints.jsonl").is_file():
            return _from_run(spec, path, None, flag)
        if path.is_dir() and (path / "retool_sampler.json").is_file():
            return ModelSpec(spec, "sampler", str(path))
        if path.is_dir() and (path / "config.json").is_file():
            return ModelSpec(spec, "hf", str(path))
        if (path.is_file() and path.suffix == ".gguf") or (
            path.is_dir() and any(path.glob("*.gguf"))
        ):
            return ModelSpec(spec, "hf", str(path))
        raise ConfigError(
            f"{flag} {spec}: not a model: expected a run directory (checkpoints.jsonl), saved "
            "sampler weights (retool_sampler.json), an HF model directory (config.json) or a "
            f".gguf file, or an alias ({', '.join(ALIASES)})"
        )
    if "@" in spec:
        run_text, _, step_text = spec.rpartition("@")
        run = Path(run_text).expanduser()
        if not (run.is_dir() and (run / "checkpoints.jsonl").is_file()):
            raise ConfigError(
                f"{flag} {spec}: {run_text} is not a run directory (no checkpoints.jsonl); "
                "RUN_DIR@STEP picks a checkpoint of a `retool train` run"
            )
        try:
            step = int(step_text)
        except ValueError:
            raise ConfigError(f"{flag} {spec}: the step after @ must be an integer") from None
        return _from_run(spec, run, step, flag)
    if spec in ALIASES:
        return ModelSpec(spec, "alias", spec)
    if backend != "local":
        return ModelSpec(spec, "service", spec)
    raise ConfigError(
        f"{flag} {spec}: no such file or directory, and not an alias ({', '.join(ALIASES)})"
    )
