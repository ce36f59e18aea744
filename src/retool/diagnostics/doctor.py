"""``retool doctor``: can this machine run this config? One table, one verdict.

Each row is a :class:`Check` with a status:

* ``ok`` / ``info``: fine, or only informative;
* ``warn``: the run can start but something is weaker than it should be
  (basic sandbox isolation, little free disk);
* ``fail``: the selected config cannot run here (a bad config, the local
  backend without torch, an unknown model, CUDA asked for and absent, a
  remote backend without its SDK or credentials, a dataset that does not
  load, ``sandbox.isolation = "strict"`` on a machine without it). The
  report's exit status is 1 and the reasons are listed.

Nothing here loads a model or contacts a service: credentials are looked up
where each SDK itself looks (environment variable, then its login file) and
their values are never read into the report.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retool import __version__
from retool.config import RunConfig, SandboxConfig, load_config
from retool.data import load_dataset
from retool.data.files import check_output_dir
from retool.diagnostics.sampler import sampler_rows
from retool.errors import RetoolError
from retool.sandbox import IsolationLevel, LocalSandbox

if TYPE_CHECKING:  # the local backend imports torch: loaded only where a check needs it
    from retool.backends.local.dtype import ModelShapes

EXTRAS = ("local", "pytrio", "tinker", "track", "report")  # optional-dependency groups
LOW_DISK = 2 << 30  # bytes: warn below this much free space for the run directory
NO_DISK = 100 << 20  # bytes: too little for a checkpoint at all


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table."""

    name: str  # what was checked
    status: str  # ok | info | warn | fail
    detail: str  # what was found (never a secret)


@dataclass(frozen=True)
class DoctorReport:
    """Every check, and whether the selected config can run."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def reasons(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.status == "fail"]

    def table(self) -> str:
        width = max(len(c.name) for c in self.checks)
        rows = [f"{c.name.ljust(width)}  {c.status.ljust(4)}  {c.detail}" for c in self.checks]
        if self.ok:
            rows.append("ready: the selected config can run here")
        else:
            rows.append("cannot run: " + "; ".join(self.reasons))
        return "\n".join(rows)


# -- environment -------------------------------------------------------------------


def check_python() -> Check:
    version = platform.python_version()
    status = "ok" if sys.version_info >= (3, 11) else "fail"
    return Check("python", status, f"{version} ({sys.executable})")


def check_torch(backend: str) -> list[Check]:
    """torch and the accelerators it sees (local backend: required)."""
    if importlib.util.find_spec("torch") is None:
        status = "fail" if backend == "local" else "info"
        return [Check("torch", status, "not installed: pip install 'retool-rl[local]'")]
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        accel = f"CUDA {torch.version.cuda}: {names}"
    else:
        accel = "CUDA not available"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        accel += "; MPS available"
    return [Check("torch", "ok", f"{torch.__version__}; {accel}")]


def check_device(device: str, backend: str) -> Check:
    """Where the local backend will put the model."""
    if backend != "local":
        return Check("device", "info", f"chosen by the {backend} service")
    if importlib.util.find_spec("torch") is None:
        return Check("device", "fail", f"{device}: torch is not installed")
    import torch

    if device == "auto":
        return Check("device", "ok", "auto -> " + ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return Check("device", "fail", f"{device}: CUDA is not available to torch here")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            return Check(
                "device", "fail", f"{device}: only {torch.cuda.device_count()} CUDA device(s)"
            )
    if device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            return Check("device", "fail", "mps: not available to torch here")
    return Check("device", "ok", device)


def check_distributed(backend: str, device: str) -> Check:
    """The torchrun job this process is a rank of (from torchrun's environment; no group
    is joined): world size, the collectives' backend and this rank's device, as the local
    backend's process group would pick them (``backends/local/distributed.py``)."""
    if importlib.util.find_spec("torch") is None:
        return Check("distributed", "info", "one process (torch is not installed)")
    import torch

    from retool.backends.local.distributed import world

    try:
        me = world()
    except RetoolError as exc:
        return Check("distributed", "fail", str(exc))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not me.distributed:
        hint = f"torchrun --nproc-per-node N shards the trainer ({gpus} CUDA device(s) seen)"
        return Check("distributed", "info", f"world size 1: one process; {hint}")
    place = f"world size {me.size}, rank {me.rank}, local rank {me.local_rank}"
    if backend != "local":
        detail = f"{place}: torchrun shards only the local backend (model.backend = {backend})"
        return Check("distributed", "fail", detail)
    if me.local_rank < gpus and device != "cpu":
        return Check(
            "distributed", "ok", f"{place}; NCCL (gloo for CPU objects); cuda:{me.local_rank}"
        )
    status = "warn" if gpus and device != "cpu" else "ok"
    why = f" (local rank {me.local_rank} has no GPU of the {gpus})" if status == "warn" else ""
    return Check("distributed", status, f"{place}; gloo; cpu{why}")


def check_model(base_model: str, backend: str) -> Check:
    """Where ``model.base_model`` resolves (local); remote services resolve their own names."""
    if backend != "local":
        return Check("model", "info", f"{base_model}: resolved by the {backend} service")
    # here, not at the top: retool.backends.local imports torch (seconds to load)
    from retool.backends.local.models import resolve_model

    try:
        source = resolve_model(base_model)
    except RetoolError as exc:
        return Check("model", "fail", str(exc))
    where = source.path / source.gguf_file if source.gguf_file else source.path
    kind = " (random weights, for tests)" if source.random_init else ""
    return Check("model", "ok", f"{base_model} -> {where}{kind}")


def model_shapes(base_model: str) -> ModelShapes | None:
    """The model's projection shapes from its config alone (no weights), or None."""
    from retool.backends.local.dtype import ModelShapes
    from retool.backends.local.models import cache_dir, file_digest, resolve_model

    source = resolve_model(base_model)
    if source.random_init:
        from retool.backends.local.models import tiny_random_config

        return ModelShapes.from_config(tiny_random_config(49152))
    if source.gguf_file is None:
        path = source.path / "config.json"
    else:  # the converted copy the backend caches (see models.load_model)
        digest = file_digest(source.path / source.gguf_file)
        path = cache_dir() / "models" / f"{Path(source.gguf_file).stem}-{digest}" / "config.json"
    try:
        return ModelShapes.from_config(_Namespace(json.loads(path.read_text())))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _Namespace:
    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def check_numerics(config: RunConfig, run_dir: str | None) -> Check:
    """What ``model.dtype`` means per role here: a run's record, else measured now."""
    model = config.model
    if model.backend != "local":
        return Check("numerics", "info", f"chosen by the {model.backend} service")
    if importlib.util.find_spec("torch") is None:
        return Check("numerics", "info", "torch is not installed")
    from retool.backends.local.dtype import Workload, resolve_numerics
    from retool.training.numerics import read_numerics

    recorded = read_numerics(Path(run_dir)) if run_dir else None
    if recorded is not None:
        return Check("numerics", "ok", f"recorded in {run_dir}: {recorded.summary()}")
    try:
        shapes = model_shapes(model.base_model) if model.dtype == "auto" else None
    except RetoolError as exc:
        return Check("numerics", "info", f"not measured: {exc}")
    if model.dtype == "auto" and shapes is None:
        return Check("numerics", "info", "auto: measured when the model first loads")
    from retool.backends.local.compiled import resolve_compile

    numerics = resolve_numerics(model.dtype, shapes, Workload.from_config(config))
    import torch

    device = model.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    choice = resolve_compile(model.compile, numerics.trainer, device)
    status = "fail" if model.compile == "on" and not choice.enabled else "ok"
    return Check("numerics", status, f"{numerics.summary()}; trainer {choice.summary()}")


def check_data(spec: str, name: str) -> Check:
    try:
        examples = load_dataset(spec)
    except RetoolError as exc:
        return Check(name, "fail", str(exc))
    return Check(name, "ok", f"{spec}: {len(examples)} questions")


def check_sandbox(sandbox_config: SandboxConfig) -> Check:
    """The isolation level the local sandbox reaches here, and what is missing."""
    backend = getattr(sandbox_config, "backend", "local")
    if backend != "local":
        url = getattr(sandbox_config, "url", "")
        return Check("sandbox", "info", f"{backend} service {url}".strip())

    try:
        sandbox = LocalSandbox(max_workers=1, preload=(), isolation=sandbox_config.isolation)
    except RetoolError as exc:
        return Check("sandbox", "fail", str(exc))
    with sandbox:
        level, missing = sandbox.isolation_level, list(sandbox.missing)
    detail = f"isolation {level} (sandbox.isolation = {sandbox_config.isolation})"
    if missing:
        detail += "; missing: " + "; ".join(missing)
    return Check("sandbox", "ok" if level == IsolationLevel.FULL else "warn", detail)


def _requirement_name(spec: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", spec.strip(), maxsplit=1)[0]


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def extras_status() -> dict[str, list[str]]:
    """Each optional-dependency group of retool-rl -> its packages that are missing."""
    try:
        requires = importlib.metadata.requires("retool-rl") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for spec in requires:
        found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", spec)
        if found is None:
            continue
        name = _requirement_name(spec)
        missing = out.setdefault(found.group(1), [])
        if not _installed(name):
            missing.append(name)
    return out


def check_extras(backend: str) -> Check:
    status = extras_status()
    parts = []
    for extra in [*EXTRAS, *sorted(set(status) - set(EXTRAS) - {"dev"})]:
        if extra not in status:
            continue
        missing = status[extra]
        parts.append(f"{extra} " + ("yes" if not missing else f"no (missing {', '.join(missing)})"))
    needed = backend if backend in status else None
    if needed and status[needed]:
        return Check(
            "extras", "fail", f"{'; '.join(parts)}; install: pip install 'retool-rl[{needed}]'"
        )
    return Check("extras", "ok" if parts else "info", "; ".join(parts) or "no package metadata")


# -- credentials -------------------------------------------------------------------


def pytrio_credentials(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """Where PyTRIO would find an API key ("" when nowhere); the value is never returned.

    As the SDK resolves it (pytrio/config/environment.py, config.py,
    repository.py): ``PYTRIO_API_KEY``, else the ``api_key`` of the active
    profile's ``config.toml`` under ``~/.pytrio`` (``trio login``); the
    active profile is ``PYTRIO_ENV`` or ``env.toml``'s ``active_env``.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    if env.get("PYTRIO_API_KEY", "").strip():
        return "PYTRIO_API_KEY"
    root = (home or Path.home()) / ".pytrio"
    active = env.get("PYTRIO_ENV", "").strip()
    if not active:
        active = str(_read_toml(root / "env.toml").get("active_env", "")).strip()
    profile = root / "config.toml" if not active else root / "envs" / active / "config.toml"
    if str(_read_toml(profile).get("api_key", "")).strip():
        return f"{profile} (trio login)"
    return ""


def tinker_credentials(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """Where Tinker would find a credential ("" when nowhere); the value is never returned.

    As the SDK resolves it (tinker/lib/_auth_token_provider.py,
    tinker/lib/credentials.py): ``TINKER_API_KEY``, ``TINKER_CREDENTIAL_CMD``,
    else the default key of ``~/.tinker/credentials.json`` (``tinker auth login``).
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    for name in ("TINKER_API_KEY", "TINKER_CREDENTIAL_CMD"):
        if env.get(name, "").strip():
            return name
    path = (home or Path.home()) / ".tinker" / "credentials.json"
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    default = stored.get("default") if isinstance(stored, dict) else None
    keys = stored.get("keys") if isinstance(stored, dict) else None
    if default and isinstance(keys, dict) and default in keys:
        return f"{path} (tinker auth login)"
    return ""


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


CREDENTIALS = {
    "pytrio": (pytrio_credentials, "set PYTRIO_API_KEY or run `trio login`"),
    "tinker": (tinker_credentials, "set TINKER_API_KEY or run `tinker auth login`"),
}


def check_credentials(backend: str) -> list[Check]:
    out = []
    for name, (find, how) in CREDENTIALS.items():
        where = find()
        if where:
            out.append(Check(f"{name} credentials", "ok", f"present ({where})"))
        else:
            status = "fail" if backend == name else "info"
            out.append(Check(f"{name} credentials", status, f"none: {how}"))
    return out


def check_run_dir(run_dir: str, resume: bool = False) -> Check:
    """Whether ``retool train``/``sft`` would accept this run directory (with ``resume``).

    In the order they check it: the place, the run it holds (or not), then its
    lock: a run directory another process is writing is refused by ``train``
    (with or without ``--resume``), so it is a failed check here too, with the
    holder ``train`` would name. The lock is only looked at, never taken.
    """
    path = Path(run_dir).expanduser()
    try:
        check_output_dir(path, flag="run directory")
    except RetoolError as exc:
        return Check("run directory", "fail", str(exc))
    from retool.training.run_dir import lock_refusal, refusal

    why = refusal(path, resume)
    if why:
        return Check("run directory", "fail", f"{path}: {why}")
    locked = lock_refusal(path)
    if locked:
        return Check("run directory", "fail", locked)
    return Check("run directory", "ok", f"{path} ({'resume' if resume else 'new run'})")


def check_disk(run_dir: str) -> Check:
    """Free space where the run directory is (or would be created)."""
    path = Path(run_dir).expanduser().absolute()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    detail = f"{free / (1 << 30):.1f} GiB free for {path}"
    if free < NO_DISK:
        return Check("disk", "fail", detail + ": too little for a checkpoint")
    return Check("disk", "warn" if free < LOW_DISK else "ok", detail)


# -- the report --------------------------------------------------------------------


def diagnose(
    config_path: str | None = None,
    overrides: Sequence[str] = (),
    *,
    run_dir: str | None = None,
    sandbox: bool = True,
    resume: bool = False,
) -> DoctorReport:
    """Check this machine against the config (defaults without ``config_path``).

    A config that does not load is itself a failed check. ``sandbox=False``
    skips starting the sandbox (the only check that spawns processes).
    """
    checks = [check_python(), Check("retool-rl", "info", __version__)]
    try:
        config = load_config(config_path, overrides)
    except RetoolError as exc:
        checks.append(Check("config", "fail", str(exc)))
        return DoctorReport(tuple(checks))
    backend = config.model.backend
    checks.append(
        Check("config", "ok", f"{config_path or 'built-in defaults'}; model.backend = {backend}")
    )
    checks += check_torch(backend)
    checks.append(check_device(config.model.device, backend))
    checks.append(check_distributed(backend, config.model.device))
    checks.append(check_model(config.model.base_model, backend))
    try:
        checks.append(check_numerics(config, run_dir or config.train.run_dir))
    except RetoolError as exc:
        checks.append(Check("numerics", "fail", str(exc)))
    checks.append(check_extras(backend))
    try:
        checks += [Check(*row) for row in sampler_rows(config.sampler)]
    except RetoolError as exc:  # a probe that raised instead of reporting: still one row
        checks.append(Check("sampler", "fail", str(exc)))
    checks += check_credentials(backend)
    checks.append(check_data(config.data.train, "data.train"))
    if config.train.eval_every > 0:  # the periodic evaluation reads this split at step 1
        name = "train.eval_dataset" if config.train.eval_dataset else "data.dev"
        checks.append(check_data(config.train.eval_dataset or config.data.dev, name))
    if sandbox:
        checks.append(check_sandbox(config.sandbox))
    chosen = run_dir or config.train.run_dir
    checks.append(check_run_dir(chosen, resume))
    if checks[-1].status != "fail":
        checks.append(check_disk(chosen))
    return DoctorReport(tuple(checks))
