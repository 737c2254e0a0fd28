"""Value-based advantage estimators (turn GAE, boundary, ppo_critic) against hand-computed cases and a
CleanRL-style GAE oracle, and the registry contract every estimator keeps (test_group_advantages.py: the
group-relative ones)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
import torch
from advantage_batches import make_batch, random_batch

from trainer_client.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    ValueSource,
    batch_normalize,
    get_estimator,
    token_mask_from_lengths,
    turn_gae,
    two_boundary_gae,
)

T = torch.tensor


def cleanrl_gae(rewards, values, terminated, last_value, gamma, lam):
    """CleanRL ppo.py's backward GAE loop over one episode of Python floats (the oracle)."""
    advantages = [0.0] * len(rewards)
    lastgaelam = 0.0
    for t in reversed(range(len(rewards))):
        if t == len(rewards) - 1:
            nextnonterminal, nextvalues = (0.0 if terminated else 1.0), last_value
        else:
            nextnonterminal, nextvalues = 1.0, values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    return advantages


# ---------------------------------------------------------------------------------------------------
# turn_gae and batch_normalize
# ---------------------------------------------------------------------------------------------------


def test_turn_gae_with_gamma_lam_one_gives_monte_carlo_returns():
    rewards = T([[0.0, -0.01, 1.0], [0.0, 1.0, 0.0]])
    values = T([[0.3, 0.1, 0.9], [0.5, 0.2, 7.0]])
    mask = T([[True, True, True], [True, True, False]])
    advantages, returns = turn_gae(rewards, values, mask, T([True, True]), None, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, T([[0.99, 0.99, 1.0], [1.0, 1.0, 0.0]]))
    torch.testing.assert_close(advantages, T([[0.69, 0.89, 0.1], [0.5, 0.8, 0.0]]))


def test_turn_gae_hand_computed_discounted_case():
    # delta = (0.04, 0.12, 0.2); A_2 = 0.2, A_1 = 0.12 + 0.45 * 0.2, A_0 = 0.04 + 0.45 * 0.21
    advantages, returns = turn_gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.8]]), T([[True, True, True]]),
                                   T([True]), T([123.0]), gamma=0.9, lam=0.5)
    torch.testing.assert_close(advantages, T([[0.1345, 0.21, 0.2]]))
    torch.testing.assert_close(returns, T([[0.6345, 0.81, 1.0]]))


def test_truncated_episode_bootstraps_from_last_values_and_terminated_does_not():
    rewards, values, mask = T([[0.0, 0.0]] * 2), T([[0.2, 0.3]] * 2), T([[True, True]] * 2)
    advantages, returns = turn_gae(rewards, values, mask, T([False, True]), T([0.5, 0.5]), gamma=1.0, lam=1.0)
    torch.testing.assert_close(advantages, T([[0.3, 0.2], [-0.2, -0.3]]))
    torch.testing.assert_close(returns, T([[0.5, 0.5], [0.0, 0.0]]))


def test_turn_gae_needs_last_values_when_an_episode_was_cut():
    with pytest.raises(ValueError, match="last_values is required"):
        turn_gae(T([[1.0]]), T([[0.0]]), T([[True]]), T([False]), None, 0.9, 0.9)


def test_turn_gae_ignores_whatever_padding_holds():
    rewards = T([[1.0, math.nan, math.nan]])
    values = T([[0.25, math.nan, math.inf]])
    advantages, returns = turn_gae(rewards, values, T([[True, False, False]]), T([False]), T([0.5]), 0.5, 0.9)
    torch.testing.assert_close(advantages, T([[1.0, 0.0, 0.0]]))  # 1 + 0.5 * 0.5 - 0.25
    torch.testing.assert_close(returns, T([[1.25, 0.0, 0.0]]))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("gamma", "lam"), [(0.95, 0.95), (1.0, 1.0), (0.99, 0.0), (0.5, 1.0)])
def test_turn_gae_matches_cleanrl_loop_on_random_batches(seed, gamma, lam):
    batch = random_batch(seed)
    advantages, returns = turn_gae(batch.rewards, batch.values, batch.mask, batch.terminated, batch.last_values,
                                   gamma, lam)
    for b in range(batch.mask.shape[0]):
        n = int(batch.mask[b].sum())
        expected = cleanrl_gae(batch.rewards[b, :n].tolist(), batch.values[b, :n].tolist(),
                               bool(batch.terminated[b]), float(batch.last_values[b]), gamma, lam)
        torch.testing.assert_close(advantages[b, :n], T(expected, dtype=torch.float64))
        torch.testing.assert_close(returns[b, :n], advantages[b, :n] + batch.values[b, :n])
        assert (advantages[b, n:] == 0).all() and (returns[b, n:] == 0).all()


def test_turn_gae_rejects_a_mask_with_holes():
    with pytest.raises(ValueError, match="left-aligned"):
        turn_gae(T([[0.0, 1.0]]), T([[0.0, 0.0]]), T([[False, True]]), T([True]), None, 1.0, 1.0)


def test_batch_normalize_counts_each_turn_once():
    # Turn advantages 1 and 3, answered with 1 and 3 tokens. Each turn once: mean 2, std sqrt(2).
    # Each token once would give mean 2.5, std 1, i.e. -1.5 and 0.5.
    advantages, mask = T([[1.0, 3.0]]), T([[True, True]])
    torch.testing.assert_close(batch_normalize(advantages, mask), T([[-1.0, 1.0]]) / math.sqrt(2))

    batch = make_batch([[0.0, 0.0]], response_lengths=[[1, 3]], values=[[-1.0, -3.0]], q_values=[[0.0, 0.0]])
    cfg = AdvantageConfig(gamma=1.0, lam=1.0)  # advantages 0 - V: 1 and 3
    per_turn = ADVANTAGE_ESTIMATORS["boundary"](batch, cfg).advantages
    torch.testing.assert_close(per_turn[0, :, 0], T([-1.0, 1.0]) / math.sqrt(2))
    per_token = ADVANTAGE_ESTIMATORS["boundary"](batch, dataclasses.replace(cfg, normalize_by="token")).advantages
    torch.testing.assert_close(per_token[0, :, 0], T([-1.5, 0.5]))
    torch.testing.assert_close(per_token[0, 1], T([0.5, 0.5, 0.5]))


def test_batch_normalize_gives_zero_mean_unit_std_over_real_entries_only():
    advantages = T([[2.0, 4.0, 100.0], [6.0, -50.0, 9.0]])
    mask = T([[True, True, False], [True, False, False]])
    normalized = batch_normalize(advantages, mask)
    torch.testing.assert_close(normalized[mask], T([-1.0, 0.0, 1.0]))
    assert (normalized[~mask] == 0).all()


# ---------------------------------------------------------------------------------------------------
# boundary (ours) and ppo_critic
# ---------------------------------------------------------------------------------------------------


def test_two_boundary_hand_computed_and_its_two_collapses():
    rewards, values, q_values = T([[0.0, 1.0]]), T([[0.2, 0.5]]), T([[0.4, 0.9]])
    mask, terminated = T([[True, True]]), T([True])
    # t=1: d_a = 0.4, d_e = 0.1, A = 0.45; t=0: d_a = 0.2, d_e = 0.1, A = 0.2 + 0.5 * (0.1 + 0.45)
    half = two_boundary_gae(rewards, values, q_values, mask, terminated, None, 1.0, 1.0, lam_a=0.5)
    torch.testing.assert_close(half, T([[0.475, 0.45]]))

    batch = random_batch(seed=3)
    gae, _ = turn_gae(batch.rewards, batch.values, batch.mask, batch.terminated, batch.last_values, 0.9, 0.8)
    as_gae = two_boundary_gae(batch.rewards, batch.values, batch.q_values, batch.mask, batch.terminated,
                              batch.last_values, 0.9, 0.8, lam_a=1.0)
    as_q_minus_v = two_boundary_gae(batch.rewards, batch.values, batch.q_values, batch.mask, batch.terminated,
                                    batch.last_values, 0.9, 0.8, lam_a=0.0)
    torch.testing.assert_close(as_gae, gae)
    torch.testing.assert_close(as_q_minus_v, torch.where(batch.mask, batch.q_values - batch.values, 0.0))


def test_boundary_returns_lambda_returns_of_penalized_rewards_and_normalized_advantages():
    batch = make_batch([[0.0, 0.0, 1.0], [0.0, 0.0]], penalties=[[0.0, 0.01, 0.0], [0.0, 0.0]],
                       response_lengths=[[2, 1, 3], [1, 1]],
                       values=[[0.5, 0.5, 0.5], [0.5, 0.5]], q_values=[[0.0] * 3, [0.0] * 2])
    result = ADVANTAGE_ESTIMATORS["boundary"](batch, AdvantageConfig(gamma=1.0, lam=1.0))
    expected_returns = T([[0.99, 0.99, 1.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(result.returns, expected_returns)
    assert result.q_returns is None  # gae_v reads no Q, so Q gets no target and is not trained
    two_boundary = ADVANTAGE_ESTIMATORS["boundary"](batch, AdvantageConfig(gamma=1.0, lam=1.0,
                                                                           adv_mode="two_boundary"))
    torch.testing.assert_close(two_boundary.q_returns, expected_returns)
    raw = T([[0.49, 0.49, 0.5], [-0.5, -0.5, 0.0]])
    expected = batch_normalize(raw, batch.mask)
    torch.testing.assert_close(result.advantages, torch.where(batch.token_mask, expected.unsqueeze(-1), 0.0))
    assert result.advantages[0, 1, 1:].eq(0).all()  # padded tokens of a 1-token response


def test_boundary_truncation_is_terminal_unless_bootstrapping():
    batch = make_batch([[0.0, 0.0], [0.0, 0.0]], terminated=[False, True], values=[[0.2, 0.3], [0.2, 0.3]],
                       q_values=[[0.0, 0.0], [0.0, 0.0]])
    batch = dataclasses.replace(batch, last_values=T([0.5, 0.5]))
    cfg = AdvantageConfig(gamma=1.0, lam=1.0)
    as_terminal = ADVANTAGE_ESTIMATORS["boundary"](batch, cfg)
    torch.testing.assert_close(as_terminal.returns, T([[0.0, 0.0], [0.0, 0.0]]))
    bootstrapped = ADVANTAGE_ESTIMATORS["boundary"](batch, dataclasses.replace(cfg, bootstrap_truncated=True))
    torch.testing.assert_close(bootstrapped.returns, T([[0.5, 0.5], [0.0, 0.0]]))


def test_boundary_q_minus_v_mode_and_one_step_q_target():
    batch = make_batch([[0.0, 1.0], [0.0]], values=[[0.2, 0.5], [0.4]], q_values=[[0.4, 0.9], [0.1]])
    cfg = AdvantageConfig(gamma=0.9, lam=0.8, adv_mode="q_minus_v", q_target="one_step")
    result = ADVANTAGE_ESTIMATORS["boundary"](batch, cfg)
    q_minus_v = T([[0.2, 0.4], [-0.3, 0.0]])
    torch.testing.assert_close(result.advantages[..., 0], batch_normalize(q_minus_v, batch.mask))
    torch.testing.assert_close(result.q_returns, T([[0.45, 1.0], [0.0, 0.0]]))  # r + 0.9 V(s_{t+1})


def test_boundary_two_boundary_mode_uses_lam_a():
    batch = make_batch([[0.0, 1.0], [0.0]], values=[[0.2, 0.5], [0.4]], q_values=[[0.4, 0.9], [0.1]])
    cfg = AdvantageConfig(gamma=1.0, lam=1.0, adv_mode="two_boundary", lam_a=0.5)
    result = ADVANTAGE_ESTIMATORS["boundary"](batch, cfg)
    raw = T([[0.475, 0.45], [-0.3 + 0.5 * (0.0 - 0.1), 0.0]])
    torch.testing.assert_close(result.advantages[..., 0], batch_normalize(raw, batch.mask))


def verl_form_batch():
    # One success episode, two turns; turn 0 was invalid (penalty 0.01). Turn 0 has 3 tokens, turn 1 has 2.
    token_values = T([[[0.1, 0.2, 0.3], [0.5, 0.6, math.nan]]])
    return make_batch([[0.0, 1.0]], penalties=[[0.01, 0.0]], response_lengths=[[3, 2]], token_values=token_values)


def test_ppo_critic_verl_form_token_level_gae_within_each_turn():
    batch = verl_form_batch()
    result = ADVANTAGE_ESTIMATORS["ppo_critic"](batch, AdvantageConfig(ppo_critic_form="verl"))
    # gamma = lam = 1: every token's return is the turn's score (episode reward - its penalty).
    torch.testing.assert_close(result.returns, T([[[0.99, 0.99, 0.99], [1.0, 1.0, 0.0]]]))
    raw = [0.89, 0.79, 0.69, 0.5, 0.4]  # score - V before each token
    mean, std = statistics.mean(raw), statistics.stdev(raw)
    expected = T([[[(a - mean) / std for a in raw[:3]], [(a - mean) / std for a in raw[3:]] + [0.0]]])
    torch.testing.assert_close(result.advantages, expected)


def test_ppo_critic_verl_form_does_not_bootstrap_across_turns():
    batch = verl_form_batch()
    cfg = AdvantageConfig(ppo_critic_form="verl", token_gamma=0.9, token_lam=0.7)
    changed = dataclasses.replace(batch, token_values=batch.token_values.clone().index_fill_(1, T([1]), 5.0))
    first_turn = ADVANTAGE_ESTIMATORS["ppo_critic"](batch, cfg).returns[0, 0]
    torch.testing.assert_close(ADVANTAGE_ESTIMATORS["ppo_critic"](changed, cfg).returns[0, 0], first_turn)
    # Last token: 0.99; then 0.9 * 0.3 + 0.63 * (0.99 - 0.3) etc. (delta_t + 0.63 A_{t+1}, plus V_t)
    a2 = 0.99 - 0.3
    a1 = 0.9 * 0.3 - 0.2 + 0.63 * a2
    a0 = 0.9 * 0.2 - 0.1 + 0.63 * a1
    torch.testing.assert_close(first_turn, T([a0 + 0.1, a1 + 0.2, a2 + 0.3]))


def test_ppo_critic_turn_form_is_the_boundary_computation_over_critic_values():
    batch = random_batch(seed=5, dtype=torch.float32)
    cfg = AdvantageConfig(ppo_critic_form="turn", bootstrap_truncated=True)
    turn_form = ADVANTAGE_ESTIMATORS["ppo_critic"](batch, cfg)
    ours = ADVANTAGE_ESTIMATORS["boundary"](batch, cfg)
    torch.testing.assert_close(turn_form.advantages, ours.advantages)
    torch.testing.assert_close(turn_form.returns, ours.returns)
    assert turn_form.q_returns is None


# ---------------------------------------------------------------------------------------------------
# The registry contract: one signature, truthful needs, clear errors
# ---------------------------------------------------------------------------------------------------

CONFIG_VARIANTS = [
    AdvantageConfig(),
    AdvantageConfig(bootstrap_truncated=True, adv_mode="two_boundary", normalize_by="token"),
    AdvantageConfig(ppo_critic_form="turn", bootstrap_truncated=True, group_form="trajectory"),
    AdvantageConfig(gigpo_mode="mean_norm", singleton_group="zero", empg_final_norm="mean_std"),
]
OPTIONAL_FIELDS = ("values", "q_values", "last_values", "token_values", "anchor_ids", "entropy")


def test_registry_holds_every_estimator():
    assert sorted(ADVANTAGE_ESTIMATORS) == ["boundary", "empg", "gigpo", "grpo", "ppo_critic", "rloo"]
    with pytest.raises(ValueError, match=r"choose from \['boundary'"):
        get_estimator("ppo")


@pytest.mark.parametrize("cfg", CONFIG_VARIANTS)
@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_every_estimator_runs_on_exactly_what_it_declares(name, cfg):
    estimator, full = get_estimator(name), random_batch(seed=11)
    needed = estimator.needs(cfg).batch_fields
    only_needed = dataclasses.replace(full, **{f: None for f in OPTIONAL_FIELDS if f not in needed})
    result = estimator(only_needed, cfg)
    assert result.advantages.shape == full.token_mask.shape
    assert torch.isfinite(result.advantages).all()
    assert result.advantages[~full.token_mask].eq(0).all()
    if result.returns is not None:
        assert torch.isfinite(result.returns).all()
    for field in needed:
        with pytest.raises(ValueError, match=f"needs TurnBatch.{field}"):
            estimator(dataclasses.replace(only_needed, **{field: None}), cfg)


def test_needs_tell_the_loop_which_values_and_group_size():
    needs = {name: estimator.needs(AdvantageConfig()) for name, estimator in ADVANTAGE_ESTIMATORS.items()}
    assert needs["boundary"].values is ValueSource.BOUNDARY and needs["boundary"].group_size == 1
    assert needs["ppo_critic"].values is ValueSource.CRITIC_TOKEN
    turn_form = get_estimator("ppo_critic").needs(AdvantageConfig(ppo_critic_form="turn"))
    assert turn_form.values is ValueSource.CRITIC_TURN
    assert {needs[n].group_size for n in ("grpo", "rloo", "gigpo", "empg")} == {8}
    assert needs["gigpo"].anchor_ids and needs["empg"].entropy
    assert get_estimator("boundary").needs(AdvantageConfig(bootstrap_truncated=True)).last_values


def test_turn_batch_rejects_inconsistent_tensors():
    batch = make_batch([[0.0, 1.0]])
    with pytest.raises(ValueError, match="left-aligned"):
        dataclasses.replace(batch, mask=T([[False, True]]))
    with pytest.raises(ValueError, match="token_mask must have at least one token"):
        dataclasses.replace(batch, token_mask=token_mask_from_lengths([[2, 0]], num_tokens=2))
    with pytest.raises(ValueError, match=r"values must have shape \[1, 2\]"):
        dataclasses.replace(batch, values=T([[0.0, 1.0, 2.0]]))
    with pytest.raises(ValueError, match="penalties must be >= 0"):
        dataclasses.replace(batch, penalties=T([[0.0, -0.01]]))


def test_config_rejects_unknown_choices_and_out_of_range_values():
    with pytest.raises(ValueError, match="adv_mode must be one of"):
        AdvantageConfig(adv_mode="q_only")
    with pytest.raises(ValueError, match="gamma must be in"):
        AdvantageConfig(gamma=1.5)


def test_std_floor_keeps_value_noise_small_when_no_episode_scored():
    """All returns 0: the boundary advantages are value noise. z-scoring alone makes that noise unit-sized;
    the floor divides by max(std, floor) instead, so the policy step stays as small as the noise."""
    noise = [[0.01, -0.02, 0.015], [0.005, -0.01]]
    batch = make_batch([[0.0, 0.0, 0.0], [0.0, 0.0]], values=noise, q_values=[[0.0] * 3, [0.0] * 2])
    plain = ADVANTAGE_ESTIMATORS["boundary"](batch, AdvantageConfig(gamma=1.0, lam=1.0, norm_std_floor=0.0))
    assert float(plain.advantages[batch.token_mask].std()) == pytest.approx(1.0, rel=0.3)
    floored = ADVANTAGE_ESTIMATORS["boundary"](batch, AdvantageConfig(gamma=1.0, lam=1.0, norm_std_floor=0.1))
    raw = T([[-0.01, 0.02, -0.015], [-0.005, 0.01, 0.0]])  # GAE with gamma = lam = 1: -V_t + r, terminal 0
    mean = raw[batch.mask].mean()
    expected = torch.where(batch.mask, (raw - mean) / 0.1, 0.0)
    torch.testing.assert_close(floored.advantages[..., 0], expected)
    assert float(floored.raw_std) == pytest.approx(float(raw[batch.mask].std()))
    # With a real signal (one win) the std is above the floor, and the floor changes nothing.
    won = make_batch([[0.0, 0.0, 1.0], [0.0, 0.0]], values=noise, q_values=[[0.0] * 3, [0.0] * 2])
    torch.testing.assert_close(
        ADVANTAGE_ESTIMATORS["boundary"](won, AdvantageConfig(gamma=1.0, lam=1.0, norm_std_floor=0.1)).advantages,
        ADVANTAGE_ESTIMATORS["boundary"](won, AdvantageConfig(gamma=1.0, lam=1.0, norm_std_floor=0.0)).advantages)


def test_the_default_floor_is_on():
    assert AdvantageConfig().norm_std_floor == 0.2


def test_batch_normalize_std_floor():
    x, mask = T([[0.0, 0.02], [0.01, 0.0]]), torch.tensor([[True, True], [True, False]])
    torch.testing.assert_close(batch_normalize(x, mask, std_floor=0.5),
                               torch.where(mask, (x - 0.01) / (0.5 + 1e-8), 0.0))
    torch.testing.assert_close(batch_normalize(x, mask, std_floor=0.001), batch_normalize(x, mask))
