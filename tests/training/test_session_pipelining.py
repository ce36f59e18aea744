"""An update's trainer calls are all submitted before the first result is awaited.

A recording trainer stands for a remote service: its futures are answered
only when the session first waits on one, and it logs every submission and
every wait. Against it, :meth:`Session.update` must submit each
``forward_backward`` in micro-batch order and then the ``optim_step``, before
any ``.result()``; failures must surface as they did when each call was
awaited in turn. On the local backend (``tiny-random``) the pipelined update
must give the very numbers and weights of the serial calls.
"""

from __future__ import annotations

import concurrent.futures

import pytest

from retool.errors import BackendError
from retool.training.datum import TrainingDatum
from retool.training.metrics import merge_trainer_metrics
from retool.training.session import LoopState, Phases, Session
from retool.types import AdamParams, ForwardBackwardOutput, Future, OptimStepOutput
from tests.builders import policy_datum

ADAM = AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)


class Watched(Future):
    """A future that logs each wait on it and lets the service answer then."""

    def __init__(self, inner, name: str, service: Recorder) -> None:
        super().__init__(inner)
        self.name, self.service = name, service

    def result(self, timeout=None):
        self.service.log.append(f"await {self.name}")
        self.service.answer()
        return super().result(timeout)


class Recorder:
    """A trainer whose replies arrive only once somebody waits (a service far away).

    ``refuse``: indices of ``forward_backward`` calls that fail as they are
    submitted (a local backend's error, a check before any request);
    ``fail``: indices that the service fails later, when it answers.
    """

    def __init__(self, state: LoopState, refuse=(), fail=()) -> None:
        self.state, self.refuse, self.fail = state, set(refuse), set(fail)
        self.log: list[str] = []
        self.data: list[list] = []  # each forward_backward's datums, in submission order
        self.consistent_at_optim: bool | None = None
        self._unanswered: list[tuple[concurrent.futures.Future, object]] = []

    def answer(self) -> None:
        for inner, value in self._unanswered:
            if isinstance(value, BaseException):
                inner.set_exception(value)
            else:
                inner.set_result(value)
        self._unanswered.clear()

    def _later(self, name: str, value: object) -> Watched:
        inner: concurrent.futures.Future = concurrent.futures.Future()
        self._unanswered.append((inner, value))
        return Watched(inner, name, self)

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        index = len(self.data)
        self.data.append(list(data))
        self.log.append(f"submit fb{index}")
        if index in self.refuse:
            return Future.failed(BackendError(f"fb{index} refused"))
        if index in self.fail:
            return self._later(f"fb{index}", BackendError(f"fb{index} failed on the service"))
        tokens = sum(d.model_input.length for d in data)
        metrics = {
            "loss:sum": -float(index + 1) * tokens,
            "loss_tokens": float(tokens),
            "ratio_max": 1.0 + index,
            "approx_kl": 0.01 * (index + 1),
        }
        return self._later(f"fb{index}", ForwardBackwardOutput((), metrics))

    def optim_step(self, adam_params):
        self.log.append("submit optim")
        self.consistent_at_optim = self.state.consistent
        return self._later("optim", OptimStepOutput({"grad_norm": 0.5, "step": 1.0}))


def bare_session(trainer) -> Session:
    """A session with only what its training calls read: the trainer, Adam, the state."""
    session = Session.__new__(Session)
    session.trainer, session.adam, session.state = trainer, ADAM, LoopState()
    return session


def NO_HOLD() -> None:
    """The ``hold`` of a step with no interrupt guard."""


def micro_batches(*sizes: int) -> list[list[TrainingDatum]]:
    out, token = [], 100
    for size in sizes:
        batch = []
        for _ in range(size):
            tokens = list(range(token, token + 4 + len(batch)))
            token += 7
            batch.append(TrainingDatum(policy_datum(tokens, 1.0), len(tokens) - 1, 3))
        out.append(batch)
    return out


def test_an_update_submits_every_call_in_order_before_the_first_wait():
    session = bare_session(None)
    trainer = session.trainer = Recorder(session.state)
    batches = micro_batches(2, 1, 3)
    trained, optim = session.update(4, batches, "ppo", {"clip": 1.0}, Phases(), NO_HOLD)
    assert trainer.log == [
        "submit fb0",
        "submit fb1",
        "submit fb2",
        "submit optim",
        "await fb0",
        "await fb1",
        "await fb2",
        "await optim",
    ]
    assert trainer.data == [[d.datum for d in b] for b in batches]  # each micro-batch, in order
    assert trainer.consistent_at_optim is False  # weights count as ahead before it is sent
    assert session.state.consistent is False
    assert optim == {"optim/grad_norm": 0.5, "optim/step": 1.0}
    assert trained["train/micro_batches"] == 3.0 and trained["train/datums"] == 6.0
    assert trained["train/update_skipped"] == 0.0


def test_hold_is_called_once_just_before_the_optim_step_is_submitted():
    session = bare_session(None)
    trainer = session.trainer = Recorder(session.state)
    session.update(
        1, micro_batches(1, 1), "ppo", None, Phases(), lambda: trainer.log.append("hold")
    )
    assert trainer.log == [
        *("submit fb0", "submit fb1", "hold", "submit optim"),
        *("await fb0", "await fb1", "await optim"),
    ]


def test_an_update_that_trains_nothing_never_holds():
    session = bare_session(None)
    trainer = session.trainer = Recorder(session.state)
    session.update(1, [], "ppo", None, Phases(), lambda: trainer.log.append("hold"))
    assert trainer.log == []


def test_the_metrics_are_those_of_the_serial_calls():
    batches = micro_batches(2, 3, 1, 2)
    session = bare_session(None)
    session.trainer = Recorder(session.state)
    trained, _ = session.update(1, batches, "ppo", None, Phases(), NO_HOLD)
    serial = Recorder(LoopState())  # what Session.forward_backward did before: wait on each
    outputs = [
        serial.forward_backward([d.datum for d in b], "ppo", None).result().metrics for b in batches
    ]
    expected = {f"train/{k}": v for k, v in merge_trainer_metrics(outputs).items()}
    assert {k: v for k, v in trained.items() if k in expected} == expected
    assert trained["train/tokens"] == sum(d.num_tokens for b in batches for d in b)
    assert trained["train/loss_tokens"] == sum(o["loss_tokens"] for o in outputs)


def test_a_failure_at_submission_submits_nothing_after_it():
    session = bare_session(None)
    trainer = session.trainer = Recorder(session.state, refuse={1})
    with pytest.raises(BackendError, match="fb1 refused"):
        session.update(1, micro_batches(1, 1, 1), "ppo", None, Phases(), NO_HOLD)
    assert trainer.log == ["submit fb0", "submit fb1", "await fb0"]  # no fb2, no optim_step
    assert session.state.consistent is True  # the emergency checkpoint still saves


def test_a_late_failure_surfaces_first_in_order_with_the_optim_step_already_sent():
    session = bare_session(None)
    trainer = session.trainer = Recorder(session.state, fail={1, 2})
    with pytest.raises(BackendError, match="fb1 failed on the service"):  # not fb2's
        session.update(1, micro_batches(1, 1, 1), "ppo", None, Phases(), NO_HOLD)
    assert trainer.log[:4] == ["submit fb0", "submit fb1", "submit fb2", "submit optim"]
    assert "await optim" not in trainer.log
    assert session.state.consistent is False  # the service may have stepped: no emergency save


def test_an_update_with_nothing_to_train_submits_nothing():
    session = bare_session(None)
    trainer = session.trainer = Recorder(session.state)
    trained, optim = session.update(1, [], "ppo", None, Phases(), NO_HOLD)
    assert trainer.log == [] and optim == {} and trained["train/update_skipped"] == 1.0
    assert session.state.consistent is True


def test_train_pipelines_every_update_the_first_included():
    session = bare_session(None)
    trainer = session.trainer = Recorder(session.state)
    updates = [micro_batches(1, 1), micro_batches(2, 1), micro_batches(1)]
    done = session.train(2, updates, "ppo", None, Phases(), lambda: trainer.log.append("hold"))
    assert trainer.log == [
        *("submit fb0", "submit fb1", "hold", "submit optim", "await fb0", "await fb1"),
        "await optim",
        *("submit fb2", "submit fb3", "hold", "submit optim", "await fb2", "await fb3"),
        "await optim",
        *("submit fb4", "hold", "submit optim", "await fb4", "await optim"),
    ]
    assert done.metrics["train/updates"] == 3.0 and done.metrics["train/micro_batches"] == 5.0
    assert done.first["train/micro_batches"] == 2.0  # the first update's own, for the mismatch


def test_the_local_backend_gives_the_serial_numbers_and_weights(tmp_path):
    torch = pytest.importorskip("torch")
    from retool.backends.local import LocalServiceClient

    batches = micro_batches(2, 1, 2)
    service = LocalServiceClient(
        device="cpu", dtype="float32", compile="off", checkpoint_root=tmp_path
    )
    serial = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    piped = service.create_lora_training_client("tiny-random", rank=4, seed=0)
    for _ in range(2):  # LoRA's B starts at zero: the second update moves A too
        outputs = [
            serial.forward_backward([d.datum for d in b], "importance_sampling").result().metrics
            for b in batches
        ]
        optim = serial.optim_step(ADAM).result().metrics
        session = bare_session(piped)
        trained, piped_optim = session.update(
            1, batches, "importance_sampling", None, Phases(), NO_HOLD
        )
        merged = {f"train/{k}": v for k, v in merge_trainer_metrics(outputs).items()}
        assert {k: v for k, v in trained.items() if k in merged} == merged
        assert piped_optim == {f"optim/{k}": v for k, v in optim.items()}
    for (name, a), (_, b) in zip(
        serial.model.named_parameters(), piped.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
