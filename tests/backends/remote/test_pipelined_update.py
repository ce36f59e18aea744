"""A pipelined update through the real SDKs: the service gets the calls in order, once each.

:meth:`retool.training.session.Session.update` submits every
``forward_backward`` of an update and its ``optim_step`` before it waits on
any; this relies on each SDK sending one training client's requests in the
order they were made. Against the fake PyTRIO and Tinker services: the
service receives each micro-batch's call, in order, then one ``optim_step``;
the metrics are those of the same calls awaited one by one; and a micro-batch
the adapter refuses before any request stops the update before anything
after it (its ``optim_step`` above all) is sent.
"""

from __future__ import annotations

import pytest

from retool.backends import service_client
from retool.config import ModelConfig
from retool.errors import BackendError
from retool.training.datum import TrainingDatum
from retool.training.session import LoopState, Phases, Session
from retool.types import AdamParams
from tests.backends.remote.test_pytrio import CLIP, DATUMS, rl_datum

ADAM = AdamParams(learning_rate=1e-3)
OPTIM = {"pytrio": "optimize_step", "tinker": "optim_step"}
MICRO_BATCHES = [
    [TrainingDatum(DATUMS[0], DATUMS[0].model_input.length, 4)],
    [TrainingDatum(DATUMS[1], DATUMS[1].model_input.length, 3)],
    [TrainingDatum(d, d.model_input.length, 3) for d in DATUMS],
]


def open_service(backend, request, tmp_path):
    fake = request.getfixturevalue(f"fake_{backend}")
    base = "Qwen/Qwen3-4B" if backend == "pytrio" else fake.base_model
    config = ModelConfig(backend=backend, base_model=base, lora_rank=8)
    return fake, base, service_client(config, tmp_path / "checkpoints")


def bare_session(trainer) -> Session:
    """A session with only what its training calls read: the trainer, Adam, the state."""
    session = Session.__new__(Session)
    session.trainer, session.adam, session.state = trainer, ADAM, LoopState()
    return session


def training_calls(fake, backend) -> list[str]:
    return [c for c in fake.calls if c in ("forward_backward", OPTIM[backend])]


@pytest.mark.parametrize("backend", ["pytrio", "tinker"])
def test_the_service_gets_every_call_in_order_and_the_serial_metrics(backend, request, tmp_path):
    fake, base, service = open_service(backend, request, tmp_path)
    try:
        serial = service.create_lora_training_client(base, rank=8, seed=3)
        outputs = [
            serial.forward_backward([d.datum for d in batch], "ppo", CLIP).result().metrics
            for batch in MICRO_BATCHES
        ]
        serial.optim_step(ADAM).result()
        fake.calls.clear()
        session = bare_session(service.create_lora_training_client(base, rank=8, seed=3))
        trained, optim = session.update(1, MICRO_BATCHES, "ppo", CLIP, Phases(), lambda: None)
    finally:
        service.close()
    assert training_calls(fake, backend) == ["forward_backward"] * 3 + [OPTIM[backend]]
    assert optim["optim/step"] == 1.0
    assert trained["train/loss:sum"] == pytest.approx(sum(o["loss:sum"] for o in outputs))
    assert trained["train/loss_tokens"] == sum(o["loss_tokens"] for o in outputs)
    assert trained["train/ratio_max"] == pytest.approx(max(o["ratio_max"] for o in outputs))


@pytest.mark.parametrize("backend", ["pytrio", "tinker"])
def test_a_micro_batch_refused_before_any_request_stops_the_update(backend, request, tmp_path):
    fake, base, service = open_service(backend, request, tmp_path)
    limit = fake.max_seq_len if backend == "pytrio" else fake.max_context_length
    long = rl_datum([5] * limit, [20, 21], [-0.5, -0.5], 1.0)  # longer than the service takes
    batches = [MICRO_BATCHES[0], [TrainingDatum(long, long.model_input.length, 2)]]
    batches.append(MICRO_BATCHES[1])
    try:
        session = bare_session(service.create_lora_training_client(base, rank=8, seed=3))
        fake.calls.clear()
        with pytest.raises(BackendError, match="datum 0 has .* tokens, more than"):
            session.update(1, batches, "ppo", CLIP, Phases(), lambda: None)
    finally:
        service.close()
    assert training_calls(fake, backend) == ["forward_backward"]  # no third call, no optim_step
    assert session.state.consistent is True  # the weights never moved: a checkpoint may save
