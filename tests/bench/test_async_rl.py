"""bench/async_rl.py's fake remote service is sound: every call waits its round trip
(the sleeps recorded, not timed), trainer calls run one at a time in submission order
with their real results, and the rate and expectation arithmetic are right."""

from __future__ import annotations

import asyncio
import threading

import bench.async_rl as bench
import pytest

from retool.types import Future


class Recorder:
    """A trainer/sampler stand-in that records calls and the thread they ran on."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        self.calls.append(f"fb{data}")
        return Future.completed(f"fb{data}:{loss_fn}")

    def optim_step(self, adam_params):
        self.calls.append("optim")
        return Future.completed("stepped")

    def save_weights_and_get_sampling_client(self, name=None):
        self.calls.append("snapshot")
        return Recorder()

    def sample(self, prompt, num_samples, sampling_params):
        self.calls.append(f"sample{prompt}")
        return Future.completed(f"sampled{prompt}x{num_samples}")

    async def sample_async(self, prompt, num_samples, sampling_params):
        self.calls.append(f"sample{prompt}")
        return f"sampled{prompt}x{num_samples}"

    def get_tokenizer(self):
        return "tokenizer"

    @property
    def max_context_tokens(self):
        return 77


@pytest.fixture
def sleeps(monkeypatch):
    """Every sleep of the bench's module recorded (and not slept)."""
    recorded: list[float] = []
    lock = threading.Lock()

    def sleep(seconds):
        with lock:
            recorded.append(seconds)

    async def async_sleep(seconds):
        recorded.append(seconds)

    monkeypatch.setattr(bench, "sleep", sleep)
    monkeypatch.setattr(bench, "sleep_async", async_sleep)
    return recorded


def test_trainer_calls_wait_a_round_trip_each_in_submission_order(sleeps):
    inner = Recorder()
    trainer = bench.FarTrainer(inner, 0.25)
    futures = [trainer.forward_backward(i, "ppo") for i in range(3)]
    futures.append(trainer.optim_step(None))
    assert [f.result(timeout=10) for f in futures] == ["fb0:ppo", "fb1:ppo", "fb2:ppo", "stepped"]
    assert inner.calls == ["fb0", "fb1", "fb2", "optim"]
    sampler = trainer.save_weights_and_get_sampling_client()
    assert sleeps == [0.25] * 5  # four calls and the snapshot, one round trip each
    assert isinstance(sampler, bench.FarSampler) and sampler.latency == 0.25
    assert trainer.get_tokenizer() == "tokenizer" and trainer.max_context_tokens == 77


def test_trainer_errors_come_back_through_the_future(sleeps):
    class Failing(Recorder):
        def optim_step(self, adam_params):
            raise RuntimeError("the service went away")

    trainer = bench.FarTrainer(Failing(), 0.1)
    with pytest.raises(RuntimeError, match="went away"):
        trainer.optim_step(None).result(timeout=10)


def test_every_sample_request_waits_a_round_trip(sleeps):
    inner = Recorder()
    sampler = bench.FarSampler(inner, 0.5)
    assert asyncio.run(sampler.sample_async("p", 4, None)) == "sampledpx4"
    assert sampler.sample("q", 2, None).result(timeout=10) == "sampledqx2"
    assert inner.calls == ["samplep", "sampleq"]
    assert sleeps == [0.5, 0.5]
    assert sampler.get_tokenizer() == "tokenizer" and sampler.max_context_tokens == 77


def test_the_service_puts_its_training_and_sampling_clients_far_away():
    class Service:
        def create_lora_training_client(self, base_model, rank=32, seed=None):
            return Recorder()

        def create_training_client_from_state_with_optimizer(self, path):
            return Recorder()

        def create_sampling_client(self, model_path=None, base_model=None):
            return Recorder()

        numerics = "recorded"

    service = bench.FarService(Service(), 0.2)
    assert isinstance(service.create_lora_training_client("m", rank=4), bench.FarTrainer)
    assert isinstance(
        service.create_training_client_from_state_with_optimizer("x"), bench.FarTrainer
    )
    assert isinstance(service.create_sampling_client(base_model="m"), bench.FarSampler)
    assert service.numerics == "recorded"


def test_far_service_patches_open_service_and_restores_it():
    from retool.training import session

    original = session.open_service
    with bench.far_service(0.1):
        assert session.open_service is not original
    assert session.open_service is original


def test_rate_and_expected_ratio():
    measured = bench.Measured(0, [], commits=[10.0, 13.0, 16.0], wall_s=20.0)
    assert bench.steps_per_minute(measured) == pytest.approx(20.0)  # 2 steps in 6 s
    lines = [
        {"time/rollout_s": 9.0, "time/step_s": 9.0, "time/training_s": 0.0},  # first: left out
        {"time/rollout_s": 2.0, "time/step_s": 5.0, "time/training_s": 2.0},
        {"time/rollout_s": 2.0, "time/step_s": 5.0, "time/training_s": 2.0},
    ]
    full, narrow = bench.expected_ratio(lines)
    assert full == pytest.approx(5.0 / 3.0)  # rollout 2 s, the rest of the step 3 s
    assert narrow == pytest.approx(2.0)  # rollout 2 s, training 2 s
