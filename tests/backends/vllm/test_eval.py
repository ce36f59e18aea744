"""``retool eval`` through vLLM (``sampler.engine = "vllm"``): our rows, seeds, resume.

Three engine starts in all (each 20-50 s on a loaded 2-core host): the
evaluation, its resume, and one engine on a LoRA sampler checkpoint (the
export to a temporary directory) for the seeds. Text mode and short answers
keep the sampling itself short; ``tiny_llama`` (64-wide heads: vLLM's CPU
kernels refuse tiny-random's 16) writes nonsense, which is all a contract
check needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool.backends.local import LocalServiceClient
from retool.backends.vllm import EngineOptions
from retool.backends.vllm.model_sampler import VllmModelSampler, open_model_sampler
from retool.evaluation import load_results
from retool.evaluation.results import ROW_KEYS
from retool.types import ModelInput, SamplerStop, SamplingParams
from tests.evaluation.test_evaluate import retool_eval

pytestmark = pytest.mark.slow
SHORT = (
    "--dataset", "demo", "--limit", "2", "--val-n", "2", "--mode", "text", "--no-progress",
    "--set", "rollout.max_assistant_tokens=16", "--set", "rollout.max_trajectory_tokens=1024",
)  # fmt: skip
VLLM = ("--set", "sampler.engine=vllm", "--set", "sampler.max_model_len=1024")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_evaluation_through_vllm_writes_our_rows_and_finishes_a_partial_file(
    tiny_llama, tmp_path, capsys
):
    ours, theirs = tmp_path / "local.jsonl", tmp_path / "vllm.jsonl"
    assert retool_eval("--model", str(tiny_llama), "--output", str(ours), *SHORT) == 0
    assert retool_eval("--model", str(tiny_llama), "--output", str(theirs), *SHORT, *VLLM) == 0
    out = capsys.readouterr()
    assert "sampler engine: vllm" in out.err
    local, vllm = load_results(ours), load_results(theirs)
    # the same row fields, and the samples of every problem, from either engine
    assert [tuple(r) for r in vllm.rows] == [ROW_KEYS] * 4 == [tuple(r) for r in local.rows]
    assert sorted((r["problem_index"], r["sample_index"]) for r in vllm.rows) == [
        (0, 0), (0, 1), (1, 0), (1, 1)
    ]  # fmt: skip
    assert all(0 < r["sampled_tokens"] <= 16 for r in vllm.rows)
    assert vllm.summary is not None and vllm.summary["samples"] == 4
    # the header says vLLM sampled it (ours: no entry); all else equal
    assert vllm.settings.pop("sampler") == {"engine": "vllm", "dtype": "float32"}
    assert "sampler" not in local.settings
    assert vllm.settings == local.settings

    # A killed evaluation: problem 0 complete, one sample of problem 1, a torn line.
    lines = theirs.read_text().splitlines(keepends=True)
    kept = [line for line in lines[1:-1] if json.loads(line)["problem_index"] == 0]
    partial = [line for line in lines[1:-1] if json.loads(line)["problem_index"] == 1][:1]
    theirs.write_text("".join([lines[0], *kept, *partial]) + '{"problem_id": "demo-te')
    # ours may not finish a file vLLM began (another random stream): refused, untouched
    before = theirs.read_bytes()
    assert retool_eval("--model", str(tiny_llama), "--output", str(theirs), *SHORT) == 2
    assert "sampler" in capsys.readouterr().err
    assert theirs.read_bytes() == before

    assert retool_eval("--model", str(tiny_llama), "--output", str(theirs), *SHORT, *VLLM) == 0
    assert "1 of 2 problems done" in capsys.readouterr().err
    resumed = load_results(theirs)
    assert resumed.summary is not None and resumed.summary["samples"] == 4
    rows = {(r["problem_index"], r["sample_index"]): r for r in resumed.rows}
    assert sorted(rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # problem 0 was kept as written, not sampled again; problem 1 was sampled whole
    assert [rows[(0, i)] for i in range(2)] == sorted(
        (json.loads(line) for line in kept), key=lambda r: r["sample_index"]
    )
    assert rows[(1, 0)]["session"] == rows[(1, 1)]["session"] != rows[(0, 0)]["session"]


def test_a_lora_checkpoint_is_exported_sampled_by_seed_and_removed(tiny_llama, tmp_path):
    service = LocalServiceClient(device="cpu", dtype="float32", checkpoint_root=tmp_path / "ckpt")
    trainer = service.create_lora_training_client(str(tiny_llama), rank=4, seed=0)
    checkpoint = trainer.save_weights_for_sampler("adapter").result().path
    assert not (Path(checkpoint) / "config.json").exists()  # an adapter: vLLM cannot read it
    work = tmp_path / "work"
    options = EngineOptions(dtype="float32", max_model_len=8192, max_num_seqs=4)
    sampler = open_model_sampler(str(checkpoint), options, work)
    try:
        assert isinstance(sampler, VllmModelSampler)
        assert sampler.max_context_tokens == 4096  # lowered to the model's positions
        assert sampler.export_dir is not None and sampler.export_dir.parent == work

        def sample(seed: int) -> list[tuple[int, ...]]:
            params = SamplingParams(max_tokens=12, temperature=1.0, seed=seed)
            response = sampler.sample(ModelInput.from_ints(list(range(100, 120))), 3, params)
            sequences = response.result(300).sequences
            for s in sequences:
                assert (
                    len(s.logprobs) == len(s.tokens) == 12 and s.stop_reason == SamplerStop.LENGTH
                )
                assert all(lp <= 0 for lp in s.logprobs)
            return [tuple(s.tokens) for s in sequences]

        first = sample(7)
        assert sample(7) == first  # the request's seed decides the tokens
        assert sample(8) != first
        assert len(set(first)) > 1  # n samples of one request are not copies
    finally:
        sampler.close()
    assert not work.exists()  # the export deleted, its root with it
    sampler.close()  # idempotent
