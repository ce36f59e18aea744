"""``retool doctor``: the table, the exit status, and credentials found without reading them out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from retool.diagnostics.doctor import (
    check_device,
    check_disk,
    diagnose,
    extras_status,
    pytrio_credentials,
    tinker_credentials,
)

ROOT = Path(__file__).resolve().parents[2]
RETOOL = ROOT / ".venv" / "bin" / "retool"


def test_console_script_reports_a_runnable_tiny_random_config(tmp_path):
    done = subprocess.run(
        [
            str(RETOOL),
            "doctor",
            "--set",
            "model.base_model=tiny-random",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    for name in ("python", "torch", "device", "model", "extras", "sandbox", "disk"):
        assert name in rows, done.stdout
    assert "tiny-random ->" in rows["model"] and "isolation" in rows["sandbox"]
    assert str(tmp_path / "run") in rows["disk"]
    assert done.stdout.rstrip().endswith("ready: the selected config can run here")


def test_a_config_that_cannot_run_fails_with_its_reasons(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no login files
    for name in ("TINKER_API_KEY", "TINKER_CREDENTIAL_CMD", "PYTRIO_API_KEY", "PYTRIO_ENV"):
        monkeypatch.delenv(name, raising=False)
    missing = tmp_path / "no-such-model"
    report = diagnose(None, [f"model.base_model={missing}"], sandbox=False)
    assert not report.ok and any(r.startswith("model:") for r in report.reasons)
    assert "cannot run: model:" in report.table()
    remote = diagnose(None, ["model.backend=tinker"], sandbox=False)
    assert [r.split(":")[0] for r in remote.reasons] == ["tinker credentials"]
    assert "tinker auth login" in remote.table()
    broken = diagnose(None, ["train.steps=0"], sandbox=False)
    assert not broken.ok and broken.reasons[0].startswith("config:")
    assert "train.steps" in broken.reasons[0]


def test_credentials_are_found_where_each_sdk_looks_and_never_shown(tmp_path, monkeypatch):
    home = tmp_path
    assert pytrio_credentials({}, home) == "" and tinker_credentials({}, home) == ""
    assert pytrio_credentials({"PYTRIO_API_KEY": "sk-secret"}, home) == "PYTRIO_API_KEY"
    assert tinker_credentials({"TINKER_API_KEY": "tml-secret"}, home) == "TINKER_API_KEY"
    # trio login: the active profile's config.toml (env.toml names it; PYTRIO_ENV overrides).
    (home / ".pytrio" / "envs" / "work").mkdir(parents=True)
    (home / ".pytrio" / "envs" / "work" / "config.toml").write_text('api_key = "sk-secret"\n')
    assert pytrio_credentials({}, home) == ""  # the default profile has none
    (home / ".pytrio" / "env.toml").write_text('active_env = "work"\n')
    assert "envs/work/config.toml" in pytrio_credentials({}, home)
    assert pytrio_credentials({"PYTRIO_ENV": "other"}, home) == ""
    # tinker auth login: a default key in ~/.tinker/credentials.json.
    (home / ".tinker").mkdir()
    store = home / ".tinker" / "credentials.json"
    store.write_text(json.dumps({"version": 1, "default": None, "keys": {"a": {}}}))
    assert tinker_credentials({}, home) == ""
    store.write_text(json.dumps({"version": 1, "default": "a", "keys": {"a": {"key": "tml-x"}}}))
    assert "credentials.json" in tinker_credentials({}, home)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TINKER_API_KEY", "tml-do-not-print")
    table = diagnose(None, ["model.backend=tinker"], sandbox=False).table()
    assert "tml-do-not-print" not in table and "sk-secret" not in table
    assert "present (TINKER_API_KEY)" in table


def test_device_disk_and_extras(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check_device("cuda", "local").status == "fail"
    assert check_device("auto", "local").detail == "auto -> cpu"
    assert check_device("cuda", "tinker").status == "info"  # the service's business
    disk = check_disk(str(tmp_path / "not" / "yet" / "made"))
    assert disk.status in ("ok", "warn") and "GiB free" in disk.detail
    status = extras_status()
    assert status.get("local") == []  # the tests run with the local extra installed


@pytest.mark.parametrize("extra", ["pytrio", "tinker"])
def test_extras_lists_the_remote_sdks(extra):
    assert extra in extras_status()
