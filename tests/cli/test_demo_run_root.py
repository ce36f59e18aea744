"""``retool demo``'s output folder: two demos started in the same second never share one.

The folder is named after the second the demo started (``demo-YYYYmmdd-HHMMSS``);
two demos started together used to compute the same name and the second
failed on ``mkdir`` with a traceback after its self-check (or, had it checked
first and created after, both would have written into one folder). Each name
is now claimed by one atomic ``mkdir``, the loser taking the next suffix.
"""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from retool.cli.demo import new_run_root
from retool.errors import ConfigError

STAMP = "demo-20260101-000000"


def test_many_threads_claiming_one_name_at_once_get_distinct_folders(tmp_path):
    start = threading.Barrier(8)
    roots = []

    def claim():
        start.wait()
        roots.append(new_run_root(tmp_path / "runs", STAMP))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(roots)) == 8 and all(root.is_dir() for root in roots)
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == sorted([STAMP, *(f"{STAMP}-{n}" for n in range(2, 9))])


def _claim_in_process(parent: str, start, out) -> None:
    from pathlib import Path

    start.wait()
    out.put(str(new_run_root(Path(parent), STAMP)))


def test_two_processes_started_in_the_same_second_get_two_folders(tmp_path):
    context = multiprocessing.get_context("spawn")  # two separate demos, not forked threads
    start, out = context.Barrier(2), context.Queue()
    workers = [
        context.Process(target=_claim_in_process, args=(str(tmp_path), start, out))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    got = {out.get(timeout=120) for _ in workers}
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert got == {str(tmp_path / STAMP), str(tmp_path / f"{STAMP}-2")}


def test_a_file_or_folder_of_that_name_is_never_reused(tmp_path):
    (tmp_path / STAMP).write_text("someone's notes")
    (tmp_path / f"{STAMP}-2").mkdir()
    (tmp_path / f"{STAMP}-2" / "config.toml").write_text("[train]\n")
    root = new_run_root(tmp_path, STAMP)
    assert root == tmp_path / f"{STAMP}-3" and list(root.iterdir()) == []
    assert (tmp_path / STAMP).read_text() == "someone's notes"


def test_an_output_that_is_a_file_is_one_error(tmp_path):
    (tmp_path / "runs").write_text("")
    with pytest.raises(ConfigError, match="--output"):
        new_run_root(tmp_path / "runs", STAMP)
