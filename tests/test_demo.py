"""``retool demo``: the whole method end to end, and the settings it refuses."""

import json
from types import SimpleNamespace

import pytest

from retool.cli import main
from retool.cli.demo import QUICK, _held_out, _plan, quick
from retool.config import load_config
from retool.data.demo import demo_problems

TINY = [
    'model.base_model="tiny-random"',
    "model.lora_rank=4",
    "train.questions_per_batch=2",
    "rollout.group_size=2",
    "rollout.max_assistant_tokens=16",
    "demo.eval_limit=2",
    "demo.eval_n=2",
    "demo.sft_steps=1",
    "demo.sft_batch=2",
    "demo.rl_steps=1",
]


def _sets(values):
    return [a for v in values for a in ("--set", v)]


def test_demo_runs_base_sft_rl_evaluations_on_both_held_out_splits_and_report(tmp_path, capsys):
    argv = ["demo", "--config", "configs/demo.toml", *_sets(TINY)]
    code = main([*argv, "--output", str(tmp_path), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "self-check: 7/7 reference trajectories scored +1" in out
    (root,) = tmp_path.iterdir()
    for split, suffix in (("demo:test", ""), ("demo:paraphrase", "-paraphrase")):
        problems = set()
        for label in ("base", "sft", "rl"):
            lines = (root / "eval" / f"{label}{suffix}.jsonl").read_text().splitlines()
            assert len(lines) == 1 + 2 * 2 + 1  # header, 2 problems x 2 samples, summary
            rows = [json.loads(line) for line in lines[1:-1]]
            problems.add(tuple(sorted({row["problem_id"] for row in rows})))
            assert f"--dataset {split} --val-n 2 --output {root / 'eval' / label}{suffix}" in out
        # every policy saw the same problems of the split
        (ids,) = problems
        assert all(i.startswith(f"demo-{split.partition(':')[2]}-") for i in ids)
    # every phase is a command the user could type, printed before it runs
    for command in ("$ retool eval", "$ retool sft make-demos", "$ retool sft", "$ retool train"):
        assert command in out
    assert f"--init-from {root / 'sft'}" in out
    results = out[out.index("held-out results") :]
    for split in ("demo:test", "demo:paraphrase"):
        table = results[results.index(f"\n{split}: 2 problems x 2 samples") :].splitlines()
        assert [line.split()[0] for line in table[4:7]] == ["base", "SFT", "RL"]
        assert f"paired comparison on {split}, RL against SFT" in out
    # what 2 problems x 2 samples can show, said in words, with the long run pointed to
    assert "RL - SFT on demo:paraphrase: " in out and "make demo-long" in out
    compare = [line for line in out.splitlines() if line.startswith("$ retool eval compare")]
    assert compare == [
        f"$ retool eval compare {root / 'eval' / 'sft'}{s}.jsonl {root / 'eval' / 'rl'}{s}.jsonl"
        for s in ("", "-paraphrase")
    ]
    rl = [json.loads(line) for line in (root / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rl] == [1] and rl[0]["rollout/trajectories"] == 4
    assert (root / "report" / "report.html").is_file()


def test_check_only_runs_the_self_check_and_writes_nothing(tmp_path, capsys):
    code = main(["demo", "--check-only", "--output", str(tmp_path), *_sets(TINY)])
    assert code == 0
    assert "self-check: 7/7" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_both_held_out_splits_are_planned_and_an_empty_paraphrase_dataset_drops_one():
    config = load_config("configs/demo.toml", TINY)
    assert _held_out(config) == [
        ("eval_dataset", "demo:test"),
        ("paraphrase_dataset", "demo:paraphrase"),
    ]
    evaluations = [p.what for p in _plan(config, {"demo:test": 2, "demo:paraphrase": 3})[1::2]]
    assert len(evaluations) == 3
    for what in evaluations:
        assert what.endswith(
            "2 problems of demo:test and 3 problems of demo:paraphrase x 2 samples"
        )
    config = load_config("configs/demo.toml", [*TINY, 'demo.paraphrase_dataset=""'])
    assert _held_out(config) == [("eval_dataset", "demo:test")]


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ('data.train="/nonexistent/train.jsonl"', "data.train"),
        ('model.backend="tinker"', "model.backend"),
        ('demo.eval_dataset="demo:train"', "demo.eval_dataset"),
        ('demo.paraphrase_dataset="demo:train"', "demo.paraphrase_dataset"),
        ('data.train="demo:paraphrase"', "data.train"),
        ('data.train="demo:test"', "data.train"),
        ('data.train="demo"', "data.train"),
        ("demo.eval_n=0", "demo.eval_n"),
        ("demo.sft_learning_rate=nan", "demo.sft_learning_rate"),
    ],
)
def test_settings_the_demo_cannot_honour_are_refused_before_anything_runs(
    tmp_path, capsys, setting, named
):
    code = main(["demo", "--output", str(tmp_path), *_sets([*TINY, setting])])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and named in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_training_on_the_varied_split_refuses_evaluating_on_the_problems_it_rephrases(
    tmp_path, capsys
):
    varied = 'data.train="demo:varied"'
    on_train = 'demo.eval_dataset="demo:train"'
    code = main(["demo", "--output", str(tmp_path), *_sets([*TINY, varied, on_train])])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "demo.eval_dataset" in err
    assert list(tmp_path.iterdir()) == []
    # nor may the learning curve measure the training problems
    curve = ["train.eval_every=1", 'train.eval_dataset="demo:train"']
    code = main(["demo", "--output", str(tmp_path), *_sets([*TINY, varied, *curve])])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "train.eval_dataset" in err
    code = main(["demo", "--output", str(tmp_path), *_sets([*TINY, *curve])])
    assert code == 2 and "train.eval_dataset" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # with the held-out splits it passes the checks: the self-check runs and nothing is written
    code = main(["demo", "--check-only", "--output", str(tmp_path), *_sets([*TINY, varied])])
    assert code == 0 and list(tmp_path.iterdir()) == []


def test_quick_settings_win_over_the_config_and_set():
    config = quick(load_config("configs/demo.toml", TINY))  # TINY sets every QUICK key
    assert {key: getattr(config.demo, key) for key in QUICK} == QUICK
    assert config.rollout.max_assistant_tokens == 16  # what --quick leaves alone stays
    what = [p.what for p in _plan(config, {"demo:test": 8, "demo:paraphrase": 8})]
    assert f"{QUICK['sft_steps']} SFT steps x {QUICK['sft_batch']} demonstrations" in what
    assert f"{QUICK['rl_steps']} RL step x 2 questions x 2 samples, ppo loss" in what


@pytest.mark.slow(seconds=110)
def test_demo_on_smollm2(tmp_path, capsys):
    # The real model through every phase (the GGUF weights, its chat template, SFT,
    # RL, evaluations), as small as it goes: one held-out split (the tiny-random demo
    # above checks both tables) and one step of each; about a minute on 2 cores.
    # float32 as every test: "auto" would measure bf16 on an AVX-512/AMX host and
    # compile its trainer there (tens of seconds the demo's own run pays, not this test)
    small = _sets(
        [
            "model.dtype=float32",
            'demo.paraphrase_dataset=""',
            "demo.eval_limit=2",
            "demo.eval_n=2",
            "demo.sft_steps=1",
            "demo.sft_batch=2",
            "demo.rl_steps=1",
            "rollout.max_assistant_tokens=32",
            "rollout.group_size=2",
            "train.questions_per_batch=2",
        ]
    )
    code = main(["demo", "--output", str(tmp_path), "--no-progress", *small])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    results = out[out.index("held-out results") :]
    assert "demo:paraphrase" not in results
    table = results[results.index("\ndemo:test: 2 problems x 2 samples") :].splitlines()
    assert [line.split()[0] for line in table[4:7]] == ["base", "SFT", "RL"]
    (root,) = tmp_path.iterdir()
    assert (root / "report" / "report.html").is_file()
    rl = [json.loads(line) for line in (root / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rl] == [1] and rl[0]["rollout/trajectories"] == 4


def test_the_long_runs_shape_skips_the_base_model_and_draws_a_learning_curve(
    tmp_path, capsys, monkeypatch
):
    """configs/demo-long.toml's switches, with the commands recorded rather than run (the
    loop's own evaluations are tested in tests/training/test_loop.py): no base-model
    evaluation, and the RL command gets train.eval_every and eval_at_start from the
    effective config, its plan counting their evaluations."""
    import retool.cli.demo as demo_cli

    ran = []
    passed = SimpleNamespace(ok=True, correct=7, total=7, tool_calls=7, tokens=0, failures=[])
    monkeypatch.setattr(demo_cli, "run_selfcheck", lambda *a, **k: passed)
    monkeypatch.setattr(demo_cli, "_command", ran.append)
    monkeypatch.setattr(demo_cli, "_results", lambda *a, **k: None)  # reads what nothing wrote
    argv = ["demo", "--config", "configs/demo-long.toml", "--output", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "base model" not in out
    assert "16 RL steps x 12 questions x 4 samples, ppo loss, 5 evaluations on demo:dev" in out
    assert "40 problems of demo:test and 120 problems of demo:paraphrase x 2 samples" in out
    models = [a[a.index("--model") + 1] for a in ran if a[0] == "eval"]
    (root,) = tmp_path.iterdir()
    assert models == [str(root / "sft")] * 2 + [str(root / "rl")] * 2  # SFT, RL; no base
    (train,) = [a for a in ran if a[0] == "train"]
    assert "train.steps=16" in train and f"--init-from={root / 'sft'}" in "=".join(train)
    effective = load_config(str(root / "config.toml"))
    assert (effective.train.eval_every, effective.train.eval_at_start) == (4, True)
    assert (effective.train.eval_dataset, effective.train.eval_n) == ("demo:dev", 2)
    assert effective.demo.evaluate_base is False


def test_the_demo_says_what_its_sample_can_show_and_points_to_the_long_run():
    from retool.cli.demo import what_it_shows
    from retool.evaluation import Comparison

    def pair(low, high, problems=28):
        return Comparison(
            a="sft.jsonl", b="rl.jsonl", n=4, problems=problems, left_out_a=0,
            left_out_b=0, average_at_n_a=0.33, average_at_n_b=0.38, difference=0.054,
            difference_ci=(low, high), p_value=0.36, p_value_method="exact",
            pass_at_n_a=0.5, pass_at_n_b=0.6, solved_only_by_a=(), solved_only_by_b=(),
        )  # fmt: skip

    noise = what_it_shows("demo:paraphrase", pair(-0.027, 0.152), 120)
    assert "+5.4 points, 95% paired interval [-2.7, +15.2]: it includes 0" in noise
    assert "28 problems x 4 samples cannot tell" in noise and "make demo-long" in noise
    # every problem evaluated (the long demo itself): no pointer to itself
    assert "make demo-long" not in what_it_shows("demo:paraphrase", pair(-0.02, 0.1, 120), 120)
    assert "above 0, RL's gain holds" in what_it_shows("demo:test", pair(0.01, 0.1), 40)
    assert "below 0" in what_it_shows("demo:test", pair(-0.2, -0.01), 40)


def test_on_unseen_phrasings_the_demo_also_resamples_whole_phrasings():
    from retool.cli.demo import _phrasings, what_it_shows
    from retool.evaluation import Comparison, ProblemPair

    mapped = _phrasings("demo:paraphrase")
    assert mapped == {p.id: p.template for p in demo_problems("paraphrase")}
    assert _phrasings("demo:test") is None and _phrasings("data/paraphrase.jsonl") is None
    # 5 phrasings x 8 problems: RL gained a sample on four phrasings, lost both on one
    pairs = tuple(
        ProblemPair(f"q{t}-{i}", *((2, 0) if t == 4 else (0, 1)))
        for t in range(5)
        for i in range(8)
    )
    phrasings = {pair.problem_id: pair.problem_id.split("-")[0] for pair in pairs}
    compared = Comparison(
        a="sft.jsonl", b="rl.jsonl", n=2, problems=40, left_out_a=0, left_out_b=0,
        average_at_n_a=0.2, average_at_n_b=0.4, difference=0.2,
        difference_ci=(0.05, 0.3), p_value=0.04, p_value_method="exact", pass_at_n_a=0.2,
        pass_at_n_b=0.8, solved_only_by_a=(), solved_only_by_b=(), pairs=pairs,
    )  # fmt: skip
    said = what_it_shows("demo:paraphrase", compared, 40, phrasings)
    assert "above 0, RL's gain holds at this sample size (40 problems x 2 samples)" in said
    assert "Resampling its 5 phrasings rather than its problems" in said
    assert "which includes 0: 5 phrasings cannot show that the change carries over" in said
    # a problem the map lacks is a phrasing of its own, not a crash at the end of a run
    del phrasings["q0-0"]
    assert "Resampling its 6 phrasings" in what_it_shows("demo:paraphrase", compared, 40, phrasings)
    # too few phrasings, or one problem each: nothing more to say than over problems
    four = {pair.problem_id: min(pair.problem_id[:2], "q3") for pair in pairs}
    assert "phrasings" not in what_it_shows("demo:paraphrase", compared, 40, four)
    each = {pair.problem_id: pair.problem_id for pair in pairs}
    assert "phrasings" not in what_it_shows("demo:paraphrase", compared, 40, each)
    assert "phrasings" not in what_it_shows("demo:test", compared, 40)
