import asyncio
import concurrent.futures

import numpy as np
import pytest

from retool.errors import ConfigError
from retool.types import (
    AdamParams,
    Datum,
    Future,
    ModelInput,
    SampledSequence,
    SamplingParams,
    TensorData,
)


def test_model_input_round_trip():
    mi = ModelInput.from_ints([5, 6, 7])
    assert mi.to_ints() == [5, 6, 7]
    assert mi.length == 3
    assert mi.append([8]).to_ints() == [5, 6, 7, 8]


def test_tensor_data_numpy_round_trip():
    array = np.arange(6, dtype=np.float32).reshape(2, 3) / 3
    td = TensorData.from_numpy(array)
    assert td.dtype == "float32" and td.shape == (2, 3)
    np.testing.assert_allclose(td.to_numpy(), array)
    assert TensorData.from_numpy(np.array([1, 2])).dtype == "int64"
    assert TensorData.from_numpy(np.array([1, 2])).tolist() == [1, 2]


def test_tensor_data_rejects_bad_shape():
    with pytest.raises(ConfigError, match="shape"):
        TensorData(data=(1.0, 2.0), dtype="float32", shape=(3,))


def test_datum_checks_lengths():
    mi = ModelInput.from_ints([1, 2, 3])
    Datum(mi, {"target_tokens": TensorData.from_list([2, 3, 4], "int64")})
    with pytest.raises(ConfigError, match="target_tokens"):
        Datum(mi, {"target_tokens": TensorData.from_list([2, 3], "int64")})


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_tokens": "256"}, "max_tokens must be an integer .* got the string '256'"),
        ({"max_tokens": 2**30}, r"max_tokens must be <= 2\*\*20"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"temperature": float("nan")}, "temperature .* got nan"),
        ({"temperature": 1e9}, "temperature must be <= 100"),
        ({"top_p": float("nan")}, "top_p"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"seed": "7"}, "seed"),
        ({"stop": [None]}, "stop token id"),
        ({"stop": ["ok", ""]}, "stop must not contain an empty string"),
        ({"stop": 3.5}, "stop must be a sequence"),
    ],
)
def test_sampling_params_validation(kwargs, field):
    with pytest.raises(ConfigError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_sampling_params_normalises_stop():
    assert SamplingParams(stop="</s>").stop == ("</s>",)
    assert SamplingParams(stop=["a", 2]).stop == ("a", 2)
    assert SamplingParams(stop=[np.int64(7)]).stop == (7,)


def test_sampled_sequence_alignment():
    with pytest.raises(ValueError, match="logprobs"):
        SampledSequence(tokens=(1, 2), logprobs=(-0.1,))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"beta2": 1.0}, "beta2"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"learning_rate": "1e-4"}, "learning_rate must be a finite number .* the string"),
        ({"eps": 0}, "eps must be > 0"),
        ({"weight_decay": -0.1}, "weight_decay must be >= 0"),
        ({"grad_clip_norm": float("nan")}, "grad_clip_norm"),
    ],
)
def test_adam_params_validation(kwargs, message):
    with pytest.raises(ConfigError, match=f"AdamParams.{message}"):
        AdamParams(**kwargs)


def test_future_result_and_await():
    inner = concurrent.futures.Future()
    fut = Future(inner)
    assert not fut.done()
    inner.set_result(41)
    assert fut.result() == 41

    async def waiter():
        return await Future.completed(7)

    assert asyncio.run(waiter()) == 7
    with pytest.raises(KeyError):
        Future.run(lambda: {}["x"]).result()
