import pytest

from retool.demo_step import DemoTrajectory, build_datum


def test_datum_matches_the_reference_worked_example():
    # Chapter 7.8 of the reference: two turns, one observation, A = 0.75.
    p1, c1, l1 = [101, 102, 103], [201, 202, 90], [-0.1, -0.2, -0.3]
    d2, c2, l2 = [91, 301, 302, 303, 104], [401, 402], [-0.4, -0.5]
    trajectory = DemoTrajectory(0, [p1, p1 + c1 + d2], [c1, c2], [l1, l2], advantage=0.75)
    datum = build_datum(trajectory)
    full = p1 + c1 + d2 + c2
    assert datum.model_input.to_ints() == full[:-1]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == full[1:]
    old = [0.0] * 3 + l1 + [0.0] * 5 + l2
    adv = [0.0] * 3 + [0.75] * 3 + [0.0] * 5 + [0.75] * 2
    assert datum.loss_fn_inputs["logprobs"].tolist() == pytest.approx(old[1:])
    assert datum.loss_fn_inputs["advantages"].tolist() == pytest.approx(adv[1:])
    assert sum(a != 0 for a in adv[1:]) == len(c1) + len(c2)


def test_datum_refuses_a_prompt_that_rewrites_history():
    trajectory = DemoTrajectory(0, [[1, 2], [1, 9, 5]], [[3], [4]], [[-0.1], [-0.2]], advantage=1.0)
    with pytest.raises(ValueError, match="does not extend"):
        build_datum(trajectory)


def test_model_step_runs_end_to_end_on_the_tiny_model(tmp_path):
    from retool.config import load_config
    from retool.data.demo import demo_problems
    from retool.demo_step import model_step

    config = load_config(
        None, ["model.base_model=tiny-random", "model.lora_rank=4", f"train.run_dir={tmp_path}"]
    )
    lines = []
    problems = demo_problems("dev")
    report = model_step(
        config,
        problems[:2],
        group_size=2,
        demonstrations=problems[2:4],
        cold_start_steps=1,
        log=lines.append,
    )
    assert report.trajectories == 4
    assert any(line.startswith("[cold-start] step 1/1") for line in lines)
    assert any(line.startswith("[train]") for line in lines)
