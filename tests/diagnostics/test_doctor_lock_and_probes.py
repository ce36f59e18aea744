"""``retool doctor`` says what ``train`` would: a locked run directory, and probe errors as rows.

Found by a careless user: the doctor said "run directory ok (resume)" while
another ``retool train`` held the run's lock, and ``train --resume`` then
refused it. The doctor now reports the holder ``train`` would name, without
taking, rewriting or removing the lock (a stale lock file stays as it was:
the next run takes it over). And a sampler probe that raises a user's error
(a malformed ``sampler.urls`` entry) is that URL's failed row, never a
traceback out of the doctor.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from retool.config import load_config
from retool.diagnostics import doctor as doctor_module
from retool.diagnostics import sampler as sampler_module
from retool.diagnostics.doctor import check_run_dir, diagnose
from retool.errors import ConfigError, RetoolError
from retool.training.run_dir import check_run_dir_free

HOLD = (
    "import sys; from pathlib import Path; from retool.training import run_lock; "
    "run_lock.acquire(Path(sys.argv[1]) / 'lock', 'run directory'); "
    "print('held', flush=True); sys.stdin.read()"
)


@pytest.fixture
def run_dir(tmp_path):
    """A run directory that --resume would accept (a config.toml a run wrote)."""
    path = tmp_path / "run"
    path.mkdir()
    (path / "config.toml").write_text("[train]\nsteps = 2\n")
    (path / "inputs.json").write_text("{}")
    return path


@pytest.fixture
def holder(run_dir):
    """Another process holding the run's lock, as a running `retool train` does."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "held"
    yield process
    process.stdin.close()
    process.wait(timeout=30)


def _lock_state(path: Path) -> tuple[int, bytes]:
    return path.stat().st_ino, path.read_bytes()


@pytest.mark.parametrize("resume", [True, False])
def test_a_run_directory_held_by_a_live_process_fails_with_the_holder_train_names(
    run_dir, holder, resume
):
    if not resume:  # a new run in a directory a starting `train` has just locked
        (run_dir / "config.toml").unlink()
        (run_dir / "inputs.json").unlink()
    before = _lock_state(run_dir / "lock")
    row = check_run_dir(str(run_dir), resume=resume)
    assert row.status == "fail"
    assert f"is in use by pid {holder.pid} on " in row.detail
    with pytest.raises(RetoolError) as train_says:  # what `train` prints, word for word
        check_run_dir_free(run_dir)
    assert row.detail == str(train_says.value)
    assert _lock_state(run_dir / "lock") == before  # looked at, not taken over or rewritten


def test_the_doctor_report_fails_on_the_lock(run_dir, holder, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[model]\nbase_model = "tiny-random"\n')
    report = diagnose(str(config), run_dir=str(run_dir), sandbox=False, resume=True)
    assert not report.ok
    assert any("is in use by pid" in reason for reason in report.reasons)


def test_a_stale_lock_file_is_left_alone_and_the_run_directory_is_ok(run_dir):
    lock = run_dir / "lock"
    lock.write_text('{"pid": 999999999, "host": "elsewhere", "since": 0}\n')
    before = _lock_state(lock)
    row = check_run_dir(str(run_dir), resume=True)
    assert row.status == "ok", row.detail
    assert _lock_state(lock) == before  # check_free would have taken it over and removed it


def test_a_lock_held_by_this_process_is_not_someone_else(run_dir):
    from retool.training import run_lock

    lock = run_dir / "lock"
    run_lock.acquire(lock, "run directory")
    try:
        assert check_run_dir(str(run_dir), resume=True).status == "ok"
    finally:
        run_lock.release(lock)


def test_a_lock_that_is_a_directory_fails_as_train_would(run_dir):
    (run_dir / "lock").mkdir()
    row = check_run_dir(str(run_dir), resume=True)
    assert row.status == "fail" and "lock" in row.detail


# -- probes that raise ------------------------------------------------------------------


def test_a_url_the_client_refuses_is_its_failed_row(monkeypatch):
    def refuse(url, timeout=3.0):
        raise ConfigError(f"sampler.urls: {url!r} is not a valid URL (Invalid IPv6 URL)")

    monkeypatch.setattr(sampler_module, "probe", refuse)
    sampler = SimpleNamespace(engine="vllm", url_list=("http://[::1", "http://h:1"))
    rows = sampler_module.url_rows(sampler)
    assert [r[:2] for r in rows] == [("sampler url", "fail")] * 2
    assert "http://[::1" in rows[0][2] and "http://h:1" in rows[1][2]


def test_a_malformed_ipv6_url_is_a_row_not_a_traceback():
    # past the config's own check (a library caller's sampler), the probe still reports
    sampler = SimpleNamespace(engine="vllm", url_list=("http://[::1",))
    ((name, status, detail),) = sampler_module.url_rows(sampler, timeout=0.5)
    assert (name, status) == ("sampler url", "fail") and "http://[::1" in detail


def test_any_user_error_from_the_sampler_rows_is_one_failed_check(monkeypatch):
    def rows(sampler):
        raise RetoolError("sampler.urls: refused by the client")

    monkeypatch.setattr(doctor_module, "sampler_rows", rows)
    report = diagnose(None, ['model.base_model="tiny-random"'], sandbox=False)
    (row,) = [c for c in report.checks if c.name == "sampler"]
    assert row.status == "fail" and "refused by the client" in row.detail


def test_a_malformed_url_in_the_config_is_the_config_row():
    overrides = ["sampler.engine=vllm", "sampler.sync=lora", 'sampler.urls="http://[::1"']
    with pytest.raises(ConfigError, match="Invalid IPv6 URL"):
        load_config(None, overrides)
    report = diagnose(None, overrides, sandbox=False)  # the config row; no probe runs
    assert report.checks[-1].name == "config" and report.checks[-1].status == "fail"
