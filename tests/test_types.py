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
    ],
)
def test_sampling_params_validation(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        SamplingParams(**kwargs)


def test_sampled_sequence_alignment():
    with pytest.raises(ValueError, match="logprobs"):
        SampledSequence(tokens=(1, 2), logprobs=(-0.1,))


def test_adam_params_validation():
    with pytest.raises(ConfigError, match="beta2"):
        AdamParams(beta2=1.0)


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
