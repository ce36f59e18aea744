"""RL step time and sampler tok/s of the demo with each sampler engine, as ratios to ours.

    flock /tmp/retool-bench.lock .venv/bin/python bench/sampler_engines.py [--steps 3]
        [--engines local,server,merged,lora] [--config configs/demo.toml]
        [--init-from CHECKPOINT] [--set section.key=value ...]
    flock /tmp/retool-bench.lock .venv/bin/python bench/sampler_engines.py --workload eval
        [--model SFT_CHECKPOINT] [--config configs/demo.toml]

``--workload eval`` times the demo's evaluation instead (``demo.eval_limit``
problems of ``demo`` x ``demo.eval_n`` samples, at ``demo.eval_temperature``
and ``demo.eval_top_p``, tool mode): ``retool eval`` of ``--model`` (default
the config's base model; the demo evaluates its SFT checkpoint, give it when
one is at hand) with ``sampler.engine = "local"`` and then ``"vllm"``, each in
a fresh process, in one run. Wall time is the whole command (model load, a
vLLM engine's start and an adapter's export included: what the demo pays per
evaluation); ``eval s`` and tok/s are the evaluation's own (its summary).

One run of this script trains the same config, seeds and questions for
``--steps`` steps with each engine, each in a fresh subprocess (so no engine's
threads, imports or caches help or slow another):

* ``local``: our own sampler (``sampler.engine = "local"``), the baseline;
* ``merged`` / ``lora``: vLLM in the trainer's process
  (``sampler.engine = "vllm"``), weights synced each step by reloading the
  merged weights in place, or by a new ``LoRARequest`` per step;
* ``server``: ``vllm serve`` on 127.0.0.1, started here on the same cores
  (:class:`vllm_launcher.ServerProcess`, from the base model
  exported as safetensors), the adapter published each step
  (``sampler.urls``, ``sampler.sync = "lora"``).

Step 1 also pays for the engine's start (the first snapshot starts an
in-process engine), so the table's figures are medians over steps 2..N and
start-up is printed on its own: for in-process engines, step 1's snapshot
phase; for the server, the time until ``/v1/models`` answered (that server
starts once per deployment, not per run). ``sampler tok/s`` is the rollout's
``rollout/tokens_per_s`` (sampled tokens over the rollout phase, tool calls
included: what a step sees). The engines sample different tokens from the same
seeds (their random streams differ), so trajectories and their lengths differ
too; the sampled token counts are printed beside the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENGINES = {
    "local": ["sampler.engine=local"],
    "merged": ["sampler.engine=vllm", "sampler.sync=merged"],
    "lora": ["sampler.engine=vllm", "sampler.sync=lora"],
    "server": ["sampler.engine=vllm", "sampler.sync=lora"],  # + sampler.urls
}


def child(args: argparse.Namespace) -> None:
    """Train ``--steps`` steps with one engine; write the metrics lines and wall time."""
    from retool.config import load_config
    from retool.training.loop import train

    overrides = [f"train.steps={args.steps}", "train.save_every=0", *args.set]
    overrides += ENGINES[args.child]
    if args.url:
        overrides.append(f"sampler.urls={args.url}")
    config = load_config(args.config, overrides)
    with tempfile.TemporaryDirectory(prefix=f"retool-bench-vllm-{args.child}-") as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        train(config, run_dir=str(run_dir), progress=False, init_from=args.init_from)
        wall = time.perf_counter() - started
        lines = [
            json.loads(line)
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
    Path(args.out).write_text(json.dumps({"wall_s": wall, "steps": lines}))


def export_base(config_path: str, overrides: list[str], target: Path) -> tuple[Path, object]:
    """The config's base model as an HF safetensors directory ``vllm serve`` can load."""
    from retool.backends.local.models import load_model, load_tokenizer
    from retool.backends.vllm.sync import export_model
    from retool.config import load_config

    config = load_config(config_path, overrides)
    name = config.model.base_model
    export_model(load_model(name), load_tokenizer(name), target, merged=False)
    return target, config


def run_child(engine: str, args: argparse.Namespace, out: Path, url: str | None = None) -> dict:
    argv = [sys.executable, __file__, "--child", engine, "--out", str(out)]
    argv += ["--steps", str(args.steps), "--config", args.config]
    if args.init_from:
        argv += ["--init-from", args.init_from]
    for item in args.set:
        argv += ["--set", item]
    if url:
        argv += ["--url", url]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        return {"error": f"exit {done.returncode}: {tail}", "wall_s": time.perf_counter() - started}
    return json.loads(out.read_text())


EVAL_ENGINES = ("local", "vllm")
EVAL_HEADER = ["engine", "wall s", "eval s", "sampled tok", "tok/s", "wall speed-up",
               "tok/s ratio", "average@n", "load avg (1 min)"]  # fmt: skip


def eval_workload(args: argparse.Namespace) -> None:
    """``retool eval`` of the demo's evaluation with each engine (see the module docstring)."""
    from retool.config import load_config

    config = load_config(args.config, args.set)
    demo = config.demo
    model = args.model or config.model.base_model
    print(f"host: {os.cpu_count()} CPUs; load average at start {os.getloadavg()}", flush=True)
    problems = demo.eval_limit or "all"
    print(f"retool eval --model {model}: {problems} problems of demo x {demo.eval_n}, "
          f"temperature {demo.eval_temperature}, top_p {demo.eval_top_p}")  # fmt: skip
    print("| " + " | ".join(EVAL_HEADER) + " |")
    print("|" + " --- |" * len(EVAL_HEADER), flush=True)
    base: dict | None = None
    with tempfile.TemporaryDirectory(prefix="retool-bench-eval-") as tmp:
        for engine in EVAL_ENGINES:
            out = Path(tmp) / f"{engine}.jsonl"
            argv = [sys.executable, "-c", "import sys; from retool.cli import main; "
                    "sys.exit(main(sys.argv[1:]))", "eval", "--config", args.config,
                    "--model", model, "--dataset", "demo", "--val-n", str(demo.eval_n),
                    "--temperature", repr(demo.eval_temperature), "--top-p",
                    repr(demo.eval_top_p), "--output", str(out), "--no-progress",
                    "--set", f"sampler.engine={engine}"]  # fmt: skip
            if demo.eval_limit:
                argv += ["--limit", str(demo.eval_limit)]
            for item in args.set:
                argv += ["--set", item]
            started = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True)
            wall = time.perf_counter() - started
            if done.returncode != 0:
                tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                print(f"| {engine} | failed: exit {done.returncode}: {tail[:300]} |", flush=True)
                continue
            summary = json.loads(out.read_text().splitlines()[-1])["summary"]
            result = {"wall": wall, **summary}
            base = base or result
            cells = [
                engine,
                f"{wall:.1f}",
                f"{summary['wall_s']:.1f}",
                str(summary["sampled_tokens"]),
                f"{summary['tokens_per_s']:.1f}",
                f"{base['wall'] / wall:.2f}x",
                f"{summary['tokens_per_s'] / base['tokens_per_s']:.2f}x",
                f"{summary['average_at_n']:.3f}",
                f"{os.getloadavg()[0]:.1f}",
            ]
            print("| " + " | ".join(cells) + " |", flush=True)
    print("speed-ups against the first row (ours); the engines draw different random streams")
    print(f"load average at the end: {os.getloadavg()}")


def median(lines: list[dict], key: str) -> float:
    values = [float(m.get(key, 0.0)) for m in lines]
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--engines", default="local,server,merged,lora")
    parser.add_argument("--init-from", default=None, help="checkpoint to start from (e.g. SFT)")
    parser.add_argument("--set", action="append", default=[], help="config override")
    parser.add_argument("--child", choices=sorted(ENGINES), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=["rl", "eval"], default="rl")
    parser.add_argument("--model", help="--workload eval: the model (default: the base model)")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.workload == "eval":
        eval_workload(args)
        return
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 carries the engine start-up)")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engines {unknown}; choose from {sorted(ENGINES)}")

    print(f"host: {os.cpu_count()} CPUs; load average at start {os.getloadavg()}", flush=True)
    print(f"{args.steps} steps of {args.config} per engine; medians of steps 2..{args.steps}")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + " --- |" * len(HEADER), flush=True)
    baseline: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="retool-bench-vllm-") as tmp:
        root = Path(tmp)
        for engine in engines:  # each row printed when its engine is done
            out = root / f"{engine}.json"
            startup = None
            if engine != "server":
                result = run_child(engine, args, out)
            else:
                result, startup = run_server(args, root, out)
            if engine == "local" and "steps" in result:
                baseline = result["steps"][1:]
            print(row(engine, result, startup, baseline), flush=True)
    print("step speed-up = local step s / engine step s; tok/s ratio = engine / local")
    print(f"load average at the end: {os.getloadavg()}")


HEADER = [
    "engine",
    "start-up s",
    "step s",
    "snapshot s",
    "rollout s",
    "training s",
    "sampled tok",
    "sampler tok/s",
    "step speed-up",
    "tok/s ratio",
    "reward",
    "load avg (1 min)",
]


def run_server(args: argparse.Namespace, root: Path, out: Path) -> tuple[dict, float | None]:
    """Start ``vllm serve`` from the exported base model, train against it, stop it."""
    from retool.backends.vllm.sync import lora_rank_slot
    from vllm_launcher import ServerProcess, server_env  # this script's folder: sys.path[0]

    model_dir, config = export_base(args.config, args.set, root / "base")
    server = ServerProcess(
        model_dir,
        root / "server.log",
        env=server_env(config.sampler.threads_bind),
        dtype=config.sampler.dtype,
        max_model_len=config.sampler.max_model_len or config.train.max_train_tokens,
        max_lora_rank=lora_rank_slot(config.model.lora_rank),
        kv_cache_gb=config.sampler.kv_cache_gb,
        enforce_eager=config.sampler.enforce_eager,
    )
    try:
        server.start(timeout=1200)
        return run_child("server", args, out, url=server.url), server.startup_s
    except Exception as exc:  # a bench reports what failed and goes on
        return {"error": f"{type(exc).__name__}: {exc}"}, None
    finally:
        server.stop()


def row(engine: str, result: dict, startup: float | None, baseline: list[dict]) -> str:
    if "error" in result:
        return f"| {engine} | failed: {result['error'][:300]} |"
    lines = result["steps"]
    later = lines[1:]
    if startup is None:
        start = f"{float(lines[0].get('time/snapshot_s', 0.0)):.1f} (step 1 snapshot)"
    else:
        start = f"{startup:.1f} (server)"
    step_s = median(later, "time/step_s")
    rate = median(later, "rollout/tokens_per_s")
    base_step = median(baseline, "time/step_s") if baseline else float("nan")
    base_rate = median(baseline, "rollout/tokens_per_s") if baseline else float("nan")
    cells = [
        engine,
        start,
        f"{step_s:.1f}",
        f"{median(later, 'time/snapshot_s'):.2f}",
        f"{median(later, 'time/rollout_s'):.1f}",
        f"{median(later, 'time/training_s'):.1f}",
        f"{median(later, 'rollout/sampled_tokens'):.0f}",
        f"{rate:.0f}",
        f"{base_step / step_s:.2f}x",
        f"{rate / base_rate:.2f}x",
        f"{median(later, 'reward/mean'):+.2f}",
        f"{os.getloadavg()[0]:.1f}",
    ]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from rerunning this
    main()
