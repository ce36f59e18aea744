"""Dynamic sampling in the rollout engine, against a scripted sampler (text mode, no tools).

A question marked ``alike`` is answered the same way by every member of its
group (an uninformative group); one marked ``mixed`` is answered right by
member 0 only. The tests pin the rule of the scheduler's docstring: the
slots run are the shortest prefix of ``batch + reserve`` holding
``len(batch)`` informative groups (or all of it), whatever the timing, and
only informative groups train.
"""

from __future__ import annotations

import random

import pytest

from retool.config import RolloutConfig, load_config
from retool.data.examples import MathExample
from retool.errors import ConfigError
from retool.rollout import rollout_batch, sample_seed
from retool.rollout.result import informative
from tests.builders import scripted_rollout
from tests.rollout.fakes import ScriptedSampler, answer_text


def question(name: str, kind: str) -> MathExample:
    return MathExample(name, f"Question {name}: say 7 ({kind}).", "7")


def script(call) -> str:
    if "(alike)" in call.prompt_text or call.index == 0:
        return answer_text("7")
    return answer_text("8")


def config(**overrides) -> RolloutConfig:
    base = dict(
        group_size=3,
        max_trajectory_tokens=1024,
        max_assistant_tokens=64,
        max_tool_response_tokens=64,
        dynamic_sampling=True,
        max_oversample=8,
    )
    return scripted_rollout(**{**base, **overrides})


@pytest.fixture
def run(smol_tokenizer):
    def run(batch, reserve, cfg, delay=None, **kwargs):
        sampler = ScriptedSampler(smol_tokenizer, script, delay=delay)
        result = rollout_batch(
            sampler, smol_tokenizer, None, batch, cfg, step=3, reserve=reserve, **kwargs
        )
        return result, sampler

    return run


def asked(sampler) -> list[str]:
    """The question names of the first-turn requests, in the order they were made."""
    names = []
    for request in sampler.requests:
        text = sampler.tokenizer.decode(request.prompt)
        names.append(text.split("Question ", 1)[1].split(":", 1)[0])
    return names


def slots(result) -> list[str]:
    return [members[0].example.id for members in result.groups()]


def facts(result):
    return [
        (t.example.id, t.question_index, t.group_index, t.reward, t.advantage, t.final_text)
        for t in result.trajectories
    ]


def test_uninformative_groups_are_filtered_from_training(run):
    batch = [question("a", "mixed"), question("b", "alike")]
    result, _ = run(batch, [], config(max_oversample=0))
    assert slots(result) == ["a", "b"]  # nothing to refill from
    assert [informative(g) for g in result.groups()] == [True, False]
    assert result.training_trajectories() == result.groups()[0]
    assert all(t.advantage == 0.0 for t in result.groups()[1])
    assert any(t.advantage != 0.0 for t in result.groups()[0])
    metrics = result.metrics()
    assert metrics["rollout/filtered_groups"] == 1.0
    assert metrics["rollout/extra_questions"] == 0.0


def test_each_filtered_group_draws_the_next_reserve_question_until_enough_are_informative(run):
    batch = [question("a", "alike"), question("b", "mixed")]
    reserve = [question("r0", "alike"), question("r1", "mixed"), question("r2", "mixed")]
    result, sampler = run(batch, reserve, config())
    assert slots(result) == ["a", "b", "r0", "r1"]  # r2 was never needed
    assert "r2" not in asked(sampler)
    assert [informative(g) for g in result.groups()] == [False, True, False, True]
    assert [t.example.id for t in result.training_trajectories()] == ["b"] * 3 + ["r1"] * 3
    assert [t.question_index for t in result.groups()[3]] == [3, 3, 3]
    # An extra question's seed comes from its slot, like any other question's.
    (r1_request,) = [r for r, n in zip(sampler.requests, asked(sampler), strict=True) if n == "r1"]
    assert r1_request.params.seed == sample_seed(42, 3, 3, -1, 0)
    metrics = result.metrics()
    assert metrics["rollout/filtered_groups"] == 2.0
    assert metrics["rollout/extra_questions"] == 2.0
    assert metrics["rollout/trajectories"] == 12.0


def test_the_refill_stops_at_max_oversample(run):
    batch = [question("a", "alike"), question("b", "alike")]
    reserve = [question("r0", "alike")]  # the loop passes max_oversample questions
    result, sampler = run(batch, reserve, config(max_oversample=1))
    assert slots(result) == ["a", "b", "r0"]
    assert result.training_trajectories() == []  # nothing informative: the step trains nothing
    assert result.metrics()["rollout/filtered_groups"] == 3.0
    assert result.metrics()["rollout/extra_questions"] == 1.0
    assert len(sampler.requests) == 3


def test_which_extras_run_does_not_depend_on_timing(run):
    rng = random.Random(5)
    kinds = ["alike", "mixed"]
    batch = [question(f"b{i}", rng.choice(kinds)) for i in range(4)]
    reserve = [question(f"r{i}", rng.choice(kinds)) for i in range(6)]
    candidates = batch + reserve
    # The rule, computed directly: the shortest prefix with len(batch) informative groups.
    needed, expected = len(batch), []
    for example in candidates:
        expected.append(example.id)
        needed -= "(mixed)" in example.question
        if needed == 0:
            break
    results = []
    for seed in range(4):  # other delays, other completion orders
        jitter = random.Random(seed)
        delays = {e.id: jitter.uniform(0, 0.02) for e in candidates}

        def delay(call, delays=delays):
            return delays[call.prompt_text.split("Question ", 1)[1].split(":", 1)[0]]

        result, sampler = run(batch, reserve, config(max_in_flight_samples=2), delay)
        assert slots(result) == expected
        assert sorted(asked(sampler)) == sorted(expected)  # nothing sampled for nothing
        results.append(facts(result))
    assert all(r == results[0] for r in results[1:])


def test_a_resumed_step_reuses_journaled_reserve_groups_and_runs_the_same_slots(run):
    batch = [question("a", "alike"), question("b", "mixed")]
    reserve = [question("r0", "alike"), question("r1", "mixed")]
    first, _ = run(batch, reserve, config())
    reuse = {0: first.groups()[0], 2: first.groups()[2]}  # what a journal kept
    again, sampler = run(batch, reserve, config(), reuse=reuse)
    assert asked(sampler) == ["b", "r1"]  # the reused groups are not sampled again
    assert facts(again) == facts(first)
    with pytest.raises(ValueError, match="slot below 4"):
        run(batch, reserve, config(), reuse={4: first.groups()[0]})


def test_off_it_neither_filters_nor_draws_extras(run):
    batch = [question("a", "alike"), question("b", "mixed")]
    result, sampler = run(batch, [question("r0", "mixed")], config(dynamic_sampling=False))
    assert slots(result) == ["a", "b"] and asked(sampler) == ["a", "b"]
    assert len(result.training_trajectories()) == 6
    assert "rollout/filtered_groups" not in result.metrics()


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^rollout.max_oversample must be >= 0 and <= 65536"):
        RolloutConfig(max_oversample=-1)
    with pytest.raises(ConfigError, match=r"rollout.dynamic_sampling needs rollout.group_size"):
        RolloutConfig(dynamic_sampling=True, group_size=1)
    path = tmp_path / "run.toml"
    path.write_text('[rollout]\ndynamic_sampling = "yes"\n')
    with pytest.raises(ConfigError, match=r"rollout.dynamic_sampling must be true or false"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^--set rollout.max_oversample=2.5: "):
        load_config(None, ["rollout.max_oversample=2.5"])
