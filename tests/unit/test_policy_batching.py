"""TokenBatch positions (step layout) and micro-batching by token budget, on hand-made cases."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trainer_client.policy import TokenBatch, TurnSample, micro_batches


def test_positions_of_a_hand_made_batch():
    batch = TokenBatch.from_samples([TurnSample((10, 11, 12), (20, 21)), TurnSample((10,), (30, 31, 32, 33))], pad_id=0)
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21], [10, 30, 31, 32, 33]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert batch.predicting_positions[0, :2].tolist() == [2, 3]   # 12 predicts 20, 20 predicts 21
    assert batch.predicting_positions[1].tolist() == [0, 1, 2, 3]
    assert batch.response_ids[batch.response_mask].tolist() == [20, 21, 30, 31, 32, 33]
    assert batch.v_positions.tolist() == [2, 0]    # last prompt token
    assert batch.q_positions.tolist() == [4, 4]    # last response token


def test_right_padding():
    batch = TokenBatch.from_samples([TurnSample((1, 2), (3,)), TurnSample((1, 2, 3, 4), (5, 6))], pad_id=9)
    assert batch.input_ids[0].tolist() == [1, 2, 3, 9, 9, 9]
    assert batch.attention_mask[0].tolist() == [1, 1, 1, 0, 0, 0]


def test_empty_parts_are_refused():
    with pytest.raises(ValueError):
        TurnSample((), (1,))
    with pytest.raises(ValueError):
        TurnSample((1,), ())
    with pytest.raises(ValueError):
        TokenBatch.from_samples([], pad_id=0)


def test_micro_batches_hand_case():
    # Lengths 5, 4, 3, 2, 1 under a budget of 8 padded tokens: [5], [4, 3], [2, 1] -> 5, 8, 4 tokens.
    assert micro_batches([3, 5, 1, 4, 2], max_tokens=8) == [[1], [3, 0], [4, 2]]


def test_an_oversized_sample_gets_its_own_micro_batch():
    assert micro_batches([50, 2, 2], max_tokens=10) == [[0], [1, 2]]
    with pytest.raises(ValueError):
        micro_batches([1], max_tokens=0)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(1, 120))
def test_micro_batches_cover_every_sample_once_within_budget(lengths, budget):
    groups = micro_batches(lengths, budget)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        padded = len(group) * max(lengths[i] for i in group)
        assert padded <= budget or len(group) == 1


def test_to_moves_every_tensor():
    batch = TokenBatch.from_samples([TurnSample((1,), (2,))], pad_id=0).to("cpu")
    assert all(t.device == torch.device("cpu") for t in (batch.input_ids, batch.response_lengths))
