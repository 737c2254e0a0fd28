"""Group-relative advantage estimators (grpo, rloo, gigpo, empg) against hand-computed cases."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
import torch
from advantage_batches import make_batch

from trainer_client.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    assign_anchor_ids,
)

T = torch.tensor


def two_episode_group():
    # One task group: episode A succeeds in 3 turns (turn 1 invalid), episode B fails in 2 turns.
    return make_batch([[0.0, 0.0, 1.0], [0.0, 0.0]], penalties=[[0.0, 0.01, 0.0], [0.0, 0.0]], groups=[4, 4])


def test_grpo_statistics_over_all_turn_samples_of_the_group():
    scores = [1.0, 0.99, 1.0, 0.0, 0.0]  # episode reward - that turn's penalty
    mean, std = statistics.mean(scores), statistics.stdev(scores)
    result = ADVANTAGE_ESTIMATORS["grpo"](two_episode_group(), AdvantageConfig())
    expected = [(s - mean) / (std + 1e-6) for s in scores]
    torch.testing.assert_close(result.advantages[..., 0], T([expected[:3], expected[3:] + [0.0]]))
    without_std = ADVANTAGE_ESTIMATORS["grpo"](two_episode_group(), AdvantageConfig(grpo_norm_by_std=False))
    torch.testing.assert_close(without_std.advantages[0, :, 0], T([s - mean for s in scores[:3]]))


def test_grpo_trajectory_form_counts_each_episode_once():
    result = ADVANTAGE_ESTIMATORS["grpo"](two_episode_group(), AdvantageConfig(group_form="trajectory"))
    penalized_returns = [0.99, 0.0]
    z = (0.99 - 0.495) / (statistics.stdev(penalized_returns) + 1e-6)
    torch.testing.assert_close(result.advantages[..., 0], T([[z, z, z], [-z, -z, 0.0]]))


def test_rloo_leaves_one_turn_sample_out_as_verl_agent():
    result = ADVANTAGE_ESTIMATORS["rloo"](two_episode_group(), AdvantageConfig())
    scores = [1.0, 0.99, 1.0, 0.0, 0.0]
    expected = [s - (sum(scores) - s) / 4 for s in scores]  # mean of the group's 4 other turn samples
    torch.testing.assert_close(result.advantages[..., 0], T([expected[:3], expected[3:] + [0.0]]))
    torch.testing.assert_close(result.advantages[0, 0, 0], T(0.5025))  # (1 - 0.598) * 5 / 4


def test_rloo_trajectory_form_leaves_one_episode_out():
    result = ADVANTAGE_ESTIMATORS["rloo"](two_episode_group(), AdvantageConfig(group_form="trajectory"))
    torch.testing.assert_close(result.advantages[..., 0], T([[0.99] * 3, [-0.99, -0.99, 0.0]]))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_singleton_group_keeps_its_raw_score_as_verl_or_gets_zero(name):
    # Episode 0 is alone in its group with one turn; episodes 1-2 form a normal group.
    batch = make_batch([[1.0], [0.0, 1.0], [0.0]], groups=[0, 1, 1])
    as_verl = ADVANTAGE_ESTIMATORS[name](batch, AdvantageConfig())
    expected = 1.0 / (1.0 + 1e-6) if name == "grpo" else 1.0  # verl: mean 0, std 1
    torch.testing.assert_close(as_verl.advantages[0, 0, 0], T(expected))
    as_zero = ADVANTAGE_ESTIMATORS[name](batch, AdvantageConfig(singleton_group="zero"))
    assert as_zero.advantages[0].eq(0).all()
    torch.testing.assert_close(as_zero.advantages[1:], as_verl.advantages[1:])


def test_one_episode_group_over_turn_samples_is_not_a_singleton_and_centres_to_zero():
    batch = make_batch([[0.0, 0.0, 1.0]], groups=[0])
    for name in ("grpo", "rloo"):
        assert ADVANTAGE_ESTIMATORS[name](batch, AdvantageConfig()).advantages.eq(0).all()


def gigpo_batch():
    # Group 0: A sees s0 s1 s2 and succeeds; B sees s0 s3 s1 and fails. Group 1: C sees s0 and succeeds.
    observations = [["s0", "s1", "s2"], ["s0", "s3", "s1"], ["s0"]]
    groups = [0, 0, 1]
    return make_batch([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0]], groups=groups,
                      anchor_ids=assign_anchor_ids(observations, groups))


def test_gigpo_mean_norm_anchor_groups_within_each_task_group():
    result = ADVANTAGE_ESTIMATORS["gigpo"](gigpo_batch(), AdvantageConfig(gigpo_mode="mean_norm"))
    # Step returns (gamma 0.95): A = 0.9025, 0.95, 1; B = 0, 0, 0; C = 1.
    # Anchor groups: s0 {A0, B0}, s1 {A1, B2}, s2 {A2}, s3 {B1}; C's s0 is in another task group.
    step = [[0.45125, 0.475, 0.0], [-0.45125, 0.0, -0.475], [0.0, 0.0, 0.0]]
    episode = [[0.5] * 3, [-0.5] * 3, [1.0, 0.0, 0.0]]  # C: a one-sample group keeps its score (verl)
    torch.testing.assert_close(result.advantages[..., 0], T(episode) + T(step))


def test_gigpo_mean_std_norm_and_step_weight():
    cfg = AdvantageConfig(gigpo_mode="mean_std_norm", gigpo_step_weight=0.5)
    result = ADVANTAGE_ESTIMATORS["gigpo"](gigpo_batch(), cfg)
    pair = 1 / math.sqrt(2)  # a z-scored pair of distinct values is +-1/sqrt(2) (unbiased std)
    episode = 0.5 / (statistics.stdev([1, 1, 1, 0, 0, 0]) + 1e-6)
    expected_a = [episode + 0.5 * pair, episode + 0.5 * pair, episode]
    torch.testing.assert_close(result.advantages[0, :, 0], T(expected_a), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.advantages[1, 1, 0], T(-episode), atol=1e-5, rtol=1e-5)


def test_gigpo_step_returns_include_the_penalty_of_that_turn():
    batch = dataclasses.replace(gigpo_batch(), penalties=T([[0.01, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    cfg = AdvantageConfig(gigpo_mode="mean_norm", gigpo_step_weight=1.0)
    with_penalty = ADVANTAGE_ESTIMATORS["gigpo"](batch, cfg).advantages
    without = ADVANTAGE_ESTIMATORS["gigpo"](gigpo_batch(), cfg).advantages
    # A0's step return drops by 0.01 (0.005 after centring with B0) and its episode score by 0.01.
    episode_shift = 0.01 - 0.01 / 6
    torch.testing.assert_close(with_penalty[0, 0, 0] - without[0, 0, 0], T(-0.005 - episode_shift))


def test_assign_anchor_ids_per_group_with_padding_and_similarity():
    observations = [["kitchen", "fridge"], ["kitchen"], ["fridge"], ["You see a fridge 1."]]
    ids = assign_anchor_ids(observations, [0, 0, 1, 1])
    assert ids.tolist() == [[0, 1], [0, -1], [0, -1], [1, -1]]
    similar = assign_anchor_ids([["You see a fridge 1."], ["You see a fridge 2."]], [0, 0], similarity=0.9)
    assert similar.tolist() == [[0], [0]]
    assert assign_anchor_ids([["You see a fridge 1."], ["You see a fridge 2."]], [0, 0]).tolist() == [[0], [1]]


def test_empg_modulation_hand_computed():
    # Group: A succeeds in 2 turns, B fails in 1. GRPO over turn samples: scores 1, 1, 0.
    batch = make_batch([[0.0, 1.0], [0.0]], groups=[0, 0], entropy=[[0.5, 1.5], [1.0]])
    cfg = AdvantageConfig(empg_k=1.0, empg_k_f=2.0, empg_zeta=0.1)
    std = statistics.stdev([1, 1, 0])
    grpo_a, grpo_b = (1 / 3) / (std + 1e-6), (-2 / 3) / (std + 1e-6)
    # H_norm = (0, 1 | 0.5); g = exp(-H_norm) / its mean; f = exp(-2 H_norm), taken from the NEXT turn.
    confidence = [1.0, math.exp(-1.0), math.exp(-0.5)]
    g = [c / (statistics.mean(confidence) + 1e-8) for c in confidence]
    modulated = [g[0] * grpo_a + 0.1 * math.exp(-2.0), g[1] * grpo_a, g[2] * grpo_b]
    centred = [m - statistics.mean(modulated) for m in modulated]
    result = ADVANTAGE_ESTIMATORS["empg"](batch, cfg)
    torch.testing.assert_close(result.advantages[..., 0], T([centred[:2], [centred[2], 0.0]]))
    scaled = ADVANTAGE_ESTIMATORS["empg"](batch, dataclasses.replace(cfg, empg_final_norm="mean_std"))
    expected = [c / (statistics.stdev(modulated) + 1e-8) for c in centred]
    torch.testing.assert_close(scaled.advantages[..., 0], T([expected[:2], [expected[2], 0.0]]))


def test_empg_without_entropy_spread_or_bonus_is_centred_grpo():
    batch = make_batch([[0.0, 1.0], [0.0]], groups=[0, 0], entropy=[[0.7, 0.7], [0.7]])
    cfg = AdvantageConfig(empg_zeta=0.0)
    grpo = ADVANTAGE_ESTIMATORS["grpo"](batch, cfg).advantages[..., 0]
    empg = ADVANTAGE_ESTIMATORS["empg"](batch, cfg).advantages[..., 0]
    torch.testing.assert_close(empg, torch.where(batch.mask, grpo - grpo[batch.mask].mean(), 0.0))
