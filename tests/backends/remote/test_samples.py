"""Sampled sequences, stop reasons and stop lists converted to ours (no SDK needed)."""

from __future__ import annotations

import pytest

from retool.backends.remote import samples
from retool.errors import BackendError
from retool.types import SamplerStop


@pytest.mark.parametrize(
    ("raw", "count", "expected"),
    [
        ("stop", 3, SamplerStop.STOP),  # tinker and pytrio
        ("length", 8, SamplerStop.LENGTH),
        ("eos", 3, SamplerStop.STOP),
        ("max_tokens", 8, SamplerStop.LENGTH),
        ("", 8, SamplerStop.LENGTH),  # pytrio's default: read from the length
        ("", 3, SamplerStop.STOP),
        (None, 3, SamplerStop.STOP),
    ],
)
def test_stop_reasons_map_to_ours(raw, count, expected):
    assert samples.stop_reason(raw, count, 8, "pytrio") is expected


def test_an_aborted_sequence_is_an_error_for_the_rollout_to_retry():
    with pytest.raises(BackendError, match="reason 'abort'"):
        samples.stop_reason("abort", 2, 8, "pytrio")
    with pytest.raises(BackendError, match="no logprobs"):
        samples.sequence([1, 2], None, None, "stop", 8, "tinker")
    with pytest.raises(BackendError, match="2 tokens but 1 logprobs"):
        samples.sequence([1, 2], [-0.1], None, "stop", 8, "tinker")
    with pytest.raises(BackendError, match="non-finite"):
        samples.sequence([1], [float("nan")], None, "stop", 8, "tinker")


def test_mixed_stops_become_strings_because_each_sdk_takes_one_kind():
    class Tok:
        def convert_ids_to_tokens(self, i):
            return {2: "<|im_end|>", 7: "```"}[i]

    assert samples.split_stops((), Tok()) is None
    assert samples.split_stops((2, 7), Tok()) == [2, 7]
    assert samples.split_stops(("```output",), Tok()) == ["```output"]
    assert samples.split_stops((2, "```output", 7), Tok()) == ["```output", "<|im_end|>", "```"]
