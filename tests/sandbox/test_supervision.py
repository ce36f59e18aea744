"""The call cannot turn its supervision against the trainer or forge its verdicts, as
an attacker plays it, for a root and for a non-root trainer (``trainer`` fixture,
see ``trainers.py``).

The scenarios run once per trainer (``supervision_scenarios.run_all``, about 20 s
each) and every test reads its facts. What each would catch: a helper (the
address-space pin) holding the set-up pipe's two descriptors, or without the
file-size, CPU or address-space limit; under a non-root trainer, SIGINT to the
init ending its call as a crash; 25 processes, each in a session of its own,
making the trainer's loop 13 times slower on a 2-core machine; and SIGKILL,
SIGXCPU and SIGXFSZ sent by the call to itself, or one byte written at the
cap's last offset, read as memory, timeout and output.
"""

from __future__ import annotations

import json

import pytest

from .trainers import scenario_results

# The trainer's speed beside a spinning call is a ratio of this machine's own
# speeds: a second test worker beside it would be measured as the call's doing.
pytestmark = pytest.mark.alone

MODULE = "supervision_scenarios"
LEVELS = ("auto", "none")


@pytest.fixture(scope="module")
def facts(trainer):
    return scenario_results(trainer, MODULE)


def _scenario(facts, name):
    found = facts[name]
    assert "scenario_error" not in found, found
    return found


# -- no helper of the call with weaker limits or more descriptors -------------------
@pytest.mark.parametrize("isolation", LEVELS)
def test_no_helper_of_a_call_has_weaker_limits_or_more_descriptors(facts, isolation):
    run = _scenario(facts, "helper_processes")[isolation]
    result = run["result"]
    assert result["ok"], result
    seen = json.loads(result["stdout"].splitlines()[0])
    own = seen["self"]
    assert own["Max file size"] == ["8388608", "8388608"] and own["Max open files"][0] == "64"
    if run["level"] == "full":  # fork mode: the address-space pin exists here
        assert seen["helpers"], "the pin was expected among the call's children"
    for helper in seen["helpers"]:
        assert "error" not in helper, helper
        assert helper["fds"] == [0, 1, 2], f"a helper holds more than stdio: {helper}"
        assert helper["limits"] == own, f"a helper has other limits than its call: {helper}"
    for proc in run["procs"] or []:  # the trainer's view, where it may look
        assert proc["fds"] == [0, 1, 2], proc
        assert proc["limits"] == run["procs"][0]["limits"], run["procs"]


# -- the call's init is out of its reach --------------------------------------------
@pytest.mark.parametrize("isolation", LEVELS)
@pytest.mark.parametrize("attack", ["kill_init", "drain_init", "kill_everything"])
def test_the_init_is_out_of_its_calls_reach(facts, isolation, attack):
    run = _scenario(facts, "init_reach")[isolation]
    if any("init out of its reach" in item for item in run["missing"]):
        pytest.skip("this host cannot hold it at this level, and says so in `missing`")
    result = run["results"][attack]
    # The code ran to its end and that is what is reported: not a crash, not
    # "the code did not run" (a verdict that would exclude the trajectory).
    assert result["ok"] and result["error_kind"] is None, result
    assert result["stdout"].endswith("ran to the end\n") and result.get("delivered", True)
    if attack == "drain_init":
        assert "opened 0 drained 0" in result["stdout"], result["stdout"]
    assert run["results"]["after"]["stdout"] == "42\n"


# -- CPU ---------------------------------------------------------------------------
def test_calls_are_never_more_important_than_the_trainer(facts):
    run = _scenario(facts, "cpu_share")
    policy, nice, lowered, realtime, nice_limit, _cpu = run["priority"]["stdout"].split()
    assert policy == "0", "the call runs under another policy than SCHED_OTHER"
    assert int(nice) >= min(19, run["trainer_nice"] + 10)
    assert lowered == "0" and realtime == "0" and nice_limit == "0"
    assert run["cpu"].startswith("cpu: "), run["cpu"]  # `check` says which level holds
    if run["trainer_realtime"]:  # started by a SCHED_FIFO trainer: still SCHED_OTHER
        assert policy == "0"


def test_the_trainer_keeps_its_speed_while_a_call_spins(facts):
    run = _scenario(facts, "cpu_share")
    assert run["spin"]["stdout"] == "spun\n", run["spin"]
    # A behaviour bound with room for a loaded machine, not a timing figure: a call
    # outranking the trainer measured 13x here.
    assert run["slowdown"] < 3.0, run
    if not any("cgroup cpu" in m or "a cgroup per call" in m for m in run["missing"]):
        assert run["cpu"].startswith("cpu: cgroup"), run["cpu"]  # the level that holds


# -- kinds only from the supervisor's facts ----------------------------------------
@pytest.mark.parametrize(
    "attack, signal",
    [("sigkill", "SIGKILL"), ("sigxcpu", "SIGXCPU"), ("sigxfsz", "SIGXFSZ")],
)
def test_a_signal_the_call_sends_itself_is_an_error_naming_it(facts, attack, signal):
    result = _scenario(facts, "own_verdicts")["results"][attack]
    assert result["error_kind"] == "error" and not result["timed_out"], result
    assert signal in result["text"]


@pytest.mark.parametrize("attack", ["sparse_stdout", "sparse_stderr", "exit137"])
def test_a_sparse_write_or_an_exit_status_is_no_output_or_memory_verdict(facts, attack):
    result = _scenario(facts, "own_verdicts")["results"][attack]
    assert result["error_kind"] == "error" and not result["timed_out"], result


def test_the_supervisors_own_facts_still_give_their_kinds(facts):
    results = _scenario(facts, "own_verdicts")["results"]
    assert results["flood"]["error_kind"] == "output"
    assert results["sleep"]["error_kind"] == "timeout" and results["sleep"]["timed_out"]
