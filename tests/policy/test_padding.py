"""`right_padded`, the one padding of ragged per-token lists the trainer and the mismatch replay share."""

import torch

from policy.logprobs import right_padded


def test_right_padded_places_each_row_and_masks_the_rest():
    values, mask = right_padded([[1.0, 2.0], [], [3.0, 4.0, 5.0]])
    assert values.tolist() == [[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [3.0, 4.0, 5.0]]
    assert mask.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_right_padded_to_a_given_width_and_dtype():
    values, mask = right_padded([[0.5], [0.25, 0.125]], width=4, dtype=torch.float64)
    assert values.shape == mask.shape == (2, 4) and values.dtype == torch.float64
    assert values[1, :2].tolist() == [0.25, 0.125] and mask.sum().item() == 3


def test_right_padded_of_nothing_has_one_empty_column():
    values, mask = right_padded([[], []])
    assert values.shape == (2, 1) and mask.sum().item() == 0
