"""make_tracker's errors: each one line, each saying what to do, all before training."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from retool.errors import ConfigError, DependencyError, RetoolError
from retool.tracking import TRACKERS, make_tracker, require_backend


def test_the_three_trackers() -> None:
    assert TRACKERS == ("swanlab", "wandb", "tensorboard")


def test_unknown_kind_is_a_config_error_listing_the_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        make_tracker("mlflow", tmp_path, "run", {})
    message = str(info.value)
    assert "'mlflow'" in message
    assert all(name in message for name in TRACKERS)
    assert not (tmp_path / "mlflow").exists()


@pytest.mark.parametrize("kind", TRACKERS)
def test_a_missing_package_is_a_dependency_error_naming_the_extra(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes `import <kind>` raise ModuleNotFoundError(name=<kind>),
    # exactly as when the package is not installed.
    monkeypatch.setitem(sys.modules, kind, None)
    run_dir = tmp_path / "run"
    with pytest.raises(DependencyError) as info:
        make_tracker(kind, run_dir, "run", {})
    message = str(info.value)
    assert kind in message and "retool-rl[track]" in message
    assert "\n" not in message
    assert not run_dir.exists()


def test_a_broken_install_is_a_start_failure_not_a_missing_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from retool.tracking import factory

    def broken(name: str) -> object:
        raise ModuleNotFoundError("No module named 'google.protobuf'", name="google.protobuf")

    monkeypatch.setattr(factory, "importlib", SimpleNamespace(import_module=broken))
    with pytest.raises(ModuleNotFoundError):
        require_backend("wandb")
    with pytest.raises(RetoolError) as info:
        make_tracker("wandb", tmp_path, "run", {})
    assert not isinstance(info.value, DependencyError)
    assert str(info.value) == (
        "tracker 'wandb' failed to start: ModuleNotFoundError: No module named 'google.protobuf'"
    )


def _installed(kind: str) -> bool:
    return importlib.util.find_spec(kind) is not None


@pytest.mark.parametrize("kind", TRACKERS)
def test_a_start_failure_is_one_retool_error_line(kind: str, tmp_path: Path) -> None:
    if not _installed(kind):
        pytest.skip(f"{kind} is not installed (pip install 'retool-rl[track]')")
    run_dir = tmp_path / "run"
    run_dir.write_text("a file where the run directory should be")
    with pytest.raises(RetoolError) as info:
        make_tracker(kind, run_dir, "run", {"seed": 1})
    assert not isinstance(info.value, DependencyError)
    message = str(info.value)
    assert message.startswith(f"tracker {kind!r} failed to start: ")
    assert "\n" not in message
    assert info.value.__cause__ is not None


def test_an_exception_inside_the_backend_start_is_wrapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _installed("tensorboard"):
        pytest.skip("tensorboard is not installed (pip install 'retool-rl[track]')")
    from retool.tracking import backends

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError("[Errno 13] Permission denied:\n '/runs/x/tensorboard'")

    monkeypatch.setattr(backends.TensorBoardTracker, "__init__", refuse)
    with pytest.raises(RetoolError) as info:
        make_tracker("tensorboard", tmp_path, "run", {})
    assert str(info.value) == (
        "tracker 'tensorboard' failed to start: "
        "PermissionError: [Errno 13] Permission denied: '/runs/x/tensorboard'"
    )
