"""``sampler.engine = "vllm"`` under torchrun: servers only, the in-process engine refused.

The in-process engine exports and reloads ``trainer.model``, which under
torchrun is rank 0's shard; a run that used it would sample from a fraction of
the weights. What a careless user would do: launch such a config with torchrun.
It must end at start, with one line and no run directory.
"""

from __future__ import annotations

import pytest

from retool.backends.local.distributed import refuse_in_process_vllm
from retool.errors import ConfigError
from tests.builders import run_toml
from tests.distributed.common import torchrun


def test_refused_only_in_process_and_only_under_torchrun(monkeypatch):
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    refuse_in_process_vllm([])  # one process: the engine reads the whole model
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    refuse_in_process_vllm(["http://127.0.0.1:8000"])  # servers: adapters from the full copy
    with pytest.raises(ConfigError, match=r"torchrun \(2 ranks\).*sampler\.urls"):
        refuse_in_process_vllm([])


@pytest.mark.slow  # starts two ranks
def test_torchrun_with_the_in_process_engine_stops_at_start(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(run_toml(sampler={"engine": "vllm", "sync": "merged"}))
    run = tmp_path / "run"
    args = ("train", "--config", str(config), "--no-progress", "--run-dir", str(run))
    ran = torchrun("-m", "retool", *args, timeout=180)
    assert ran.returncode != 0
    ours = [line for line in ran.stderr.splitlines() if line.startswith("retool:")]
    assert len(ours) == 1 and "sampler.urls" in ours[0], ran.stderr[-2000:]
    assert "src/retool/" not in ran.stderr  # no traceback of ours (torchrun adds its report)
    assert not run.exists()  # refused before the run directory is made
