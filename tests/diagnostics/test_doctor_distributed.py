"""``retool doctor``'s distributed row: the world size, backend and device a rank sees."""

from __future__ import annotations

import pytest

from retool.diagnostics.doctor import check_distributed, diagnose

PLACE = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture
def torchrun_env(monkeypatch):
    for name in PLACE:
        monkeypatch.delenv(name, raising=False)

    def place(rank: str, size: str, local: str) -> None:
        for name, value in zip(PLACE, (rank, size, local), strict=True):
            monkeypatch.setenv(name, value)

    return place


def test_without_torchrun_one_process(torchrun_env):
    row = check_distributed("local", "auto")
    assert row.status == "info" and "world size 1" in row.detail and "torchrun" in row.detail


def test_a_rank_of_a_cpu_job_sees_its_place_and_gloo(torchrun_env):
    torchrun_env("1", "2", "1")
    row = check_distributed("local", "cpu")
    assert row.status == "ok"
    assert "world size 2, rank 1, local rank 1" in row.detail and "gloo; cpu" in row.detail
    assert "NCCL" not in row.detail


def test_torchrun_with_a_remote_backend_fails(torchrun_env):
    torchrun_env("0", "4", "0")
    row = check_distributed("tinker", "auto")
    assert row.status == "fail" and "only the local backend" in row.detail


@pytest.mark.parametrize("env", [("0", "two", "0"), ("3", "2", "0"), ("0", "2", "-1")])
def test_a_broken_torchrun_environment_is_a_failed_row_not_a_crash(torchrun_env, env):
    torchrun_env(*env)
    assert check_distributed("local", "auto").status == "fail"


def test_the_row_is_in_the_table(torchrun_env, tmp_path):
    torchrun_env("0", "2", "0")
    report = diagnose(
        None, ["model.base_model=tiny-random"], run_dir=str(tmp_path / "run"), sandbox=False
    )
    rows = [c for c in report.checks if c.name == "distributed"]
    assert len(rows) == 1 and "world size 2" in rows[0].detail
    assert "distributed" in report.table()
