"""The trainer's forward pass helpers: right padding and the shared prefix's length."""

from __future__ import annotations

import torch

from retool.backends.local.forward import pad_batch, shared_prefix_length
from retool.types import Datum, ModelInput, TensorData


def _datum(tokens):
    return Datum(
        ModelInput.from_ints(tokens[:-1]),
        {"target_tokens": TensorData.from_list(tokens[1:], "int64")},
    )


def test_padding_goes_right_and_the_mask_ignores_a_pad_id_that_is_a_real_token():
    pad = 5  # also a token of the first datum: the mask, not the id, says what is padding
    batch = pad_batch([_datum([4, 5, 6, 7]), _datum([8, 9])], pad, torch.device("cpu"))
    assert batch.lengths == (3, 1)
    assert batch.input_ids.tolist() == [[4, 5, 6], [8, pad, pad]]
    assert batch.targets.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert batch.mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.input_ids.dtype == batch.targets.dtype == torch.long


def test_shared_prefix_length():
    ids = torch.tensor([[1, 2, 3, 4, 0], [1, 2, 3, 9, 9], [1, 2, 3, 4, 5]])
    assert shared_prefix_length(ids, [4, 5, 5]) == 3
    assert shared_prefix_length(ids[[0, 2]], [4, 5]) == 4  # the shorter row's whole length
    assert shared_prefix_length(ids[[2, 2]], [5, 5]) == 4  # identical rows: one token left
    assert shared_prefix_length(ids[:1], [4]) == 0
    # rows that differ at their first token share nothing
    assert shared_prefix_length(torch.tensor([[1, 2], [2, 2]]), [2, 2]) == 0
