"""PPO losses and metrics against hand-computed values: clip regions, aggregation, KL, value clipping."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_client.algorithms import (
    LossConfig,
    aggregate,
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    explained_variance,
    kl_penalty,
    policy_objective,
    value_loss,
)

T = torch.tensor


def per_token_loss(ratio: float, advantage: float, dual_clip: float | None = 3.0) -> float:
    log_ratio = T([math.log(ratio)])
    return clipped_policy_loss(log_ratio, T([0.0]), T([advantage]), 0.2, dual_clip).item()


@pytest.mark.parametrize(("ratio", "advantage", "expected"), [
    (1.1, 2.0, -2.2),  # inside the trust region: -A r
    (1.5, 2.0, -2.4),  # A > 0, ratio too high: clipped at 1 + eps
    (0.5, 2.0, -1.0),  # A > 0, ratio low: the unclipped (pessimistic) term
    (1.5, -2.0, 3.0),  # A < 0, ratio high: unclipped, below the dual-clip cap 3|A| = 6
    (0.5, -2.0, 1.6),  # A < 0, ratio too low: clipped at 1 - eps
    (5.0, -2.0, 6.0),  # A < 0, ratio huge: dual clip caps the loss at 3|A|
])
def test_clipped_policy_loss_regions(ratio, advantage, expected):
    assert per_token_loss(ratio, advantage) == pytest.approx(expected, rel=1e-6)


def test_without_dual_clip_the_loss_grows_with_the_ratio():
    assert per_token_loss(5.0, -2.0, dual_clip=None) == pytest.approx(10.0, rel=1e-6)


def test_clipped_and_dual_clipped_regions_pass_no_gradient():
    log_probs = T([math.log(1.5), math.log(5.0), math.log(1.1)], requires_grad=True)
    clipped_policy_loss(log_probs, torch.zeros(3), T([2.0, -2.0, 2.0]), 0.2, 3.0).sum().backward()
    assert log_probs.grad[:2].eq(0).all()
    assert log_probs.grad[2].item() == pytest.approx(-2.0 * 1.1, rel=1e-6)  # d(-A r)/d log r = -A r


def test_token_mean_and_seq_mean_token_mean_aggregation():
    # Two responses: one token with loss 4, three tokens with loss 1; padding holds 100.
    losses = T([[4.0, 100.0, 100.0], [1.0, 1.0, 1.0]])
    mask = T([[True, False, False], [True, True, True]])
    assert aggregate(losses, mask, "token-mean").item() == pytest.approx(7 / 4)
    assert aggregate(losses, mask, "seq-mean-token-mean").item() == pytest.approx(2.5)


def test_seq_mean_skips_padded_turns_of_a_turn_layout():
    losses = T([[[2.0, 2.0], [9.0, 9.0]], [[4.0, 0.0], [0.0, 0.0]]])  # [B=2, T=2, L=2]
    mask = T([[[True, True], [False, False]], [[True, False], [False, False]]])
    assert aggregate(losses, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)


def test_kl_estimators_hand_computed_and_zero_at_identical_distributions():
    log_probs, ref_log_probs = T([math.log(0.5)]), T([math.log(0.25)])
    assert kl_penalty(log_probs, ref_log_probs, "kl").item() == pytest.approx(math.log(2))
    assert kl_penalty(log_probs, ref_log_probs, "mse").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(log_probs, ref_log_probs, "low_var_kl").item() == pytest.approx(0.5 + math.log(2) - 1)
    same = torch.log(torch.rand(16))
    for kind in ("low_var_kl", "kl", "mse"):
        assert kl_penalty(same, same.clone(), kind).eq(0).all()


def test_k3_is_never_negative():
    log_probs, ref_log_probs = torch.log(torch.rand(1000)), torch.log(torch.rand(1000))
    assert (kl_penalty(log_probs, ref_log_probs, "low_var_kl") >= 0).all()


def test_value_loss_hand_computed_with_and_without_clipping():
    old, mask = T([0.0, 0.9]), T([True, True])
    predictions, targets = T([0.3, 1.2]), T([1.0, 1.0])
    # Unclipped errors 0.49 and 0.04. Clipped at +-0.05: the first is held at 0.05 (error 0.9025, larger,
    # so it counts); the second is held at 0.95 (error 0.0025, smaller, so the unclipped 0.04 counts).
    assert value_loss(predictions, old, targets, mask).item() == pytest.approx(0.5 * (0.49 + 0.04) / 2)
    clipped = value_loss(predictions, old, targets, mask, clip=0.05)
    assert clipped.item() == pytest.approx(0.5 * (0.9025 + 0.04) / 2)


def test_value_loss_ignores_padding_and_works_on_turn_and_token_shapes():
    predictions = T([[1.0, 50.0], [0.0, 0.0]])
    targets = T([[0.0, 0.0], [2.0, 0.0]])
    mask = T([[True, False], [True, False]])
    assert value_loss(predictions, predictions, targets, mask).item() == pytest.approx(0.5 * (1 + 4) / 2)
    tokens = predictions.unsqueeze(-1).expand(2, 2, 3)
    token_targets, token_mask = targets.unsqueeze(-1).expand(2, 2, 3), mask.unsqueeze(-1).expand(2, 2, 3)
    assert value_loss(tokens, tokens, token_targets, token_mask).item() == pytest.approx(0.5 * (1 + 4) / 2)


def test_policy_objective_combines_the_terms():
    cfg = LossConfig(kl_coef=0.1, entropy_coef=0.01)
    log_probs = T([[math.log(1.1), math.log(1.5), 0.0]], requires_grad=True)
    old, advantages, mask = torch.zeros(1, 3), T([[2.0, 2.0, 9.0]]), T([[True, True, False]])
    ref, entropy = torch.zeros(1, 3), T([[1.0, 3.0, 0.0]])
    out = policy_objective(cfg, log_probs, old, advantages, mask, ref_log_probs=ref, entropy=entropy)
    pg = (-2.2 - 2.4) / 2
    kl = ((1 / 1.1 + math.log(1.1) - 1) + (1 / 1.5 + math.log(1.5) - 1)) / 2
    assert out.pg_loss.item() == pytest.approx(pg, rel=1e-6)
    assert out.kl.item() == pytest.approx(kl, rel=1e-5)
    assert out.entropy.item() == pytest.approx(2.0)
    assert out.loss.item() == pytest.approx(pg + 0.1 * kl - 0.01 * 2.0, rel=1e-5)
    assert out.clip_fraction.item() == pytest.approx(0.5)  # ratio 1.5 left [0.8, 1.2]; 1.1 did not
    out.loss.backward()
    assert log_probs.grad is not None and log_probs.grad[0, 2] == 0


def test_policy_objective_needs_the_tensors_its_coefficients_use():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), T([[True, True]]))
    with pytest.raises(ValueError, match="ref_log_probs is required"):
        policy_objective(LossConfig(kl_coef=0.01, entropy_coef=0.0), *args)
    with pytest.raises(ValueError, match="entropy is required"):
        policy_objective(LossConfig(kl_coef=0.0, entropy_coef=0.001), *args)
    off = policy_objective(LossConfig(kl_coef=0.0, entropy_coef=0.0), *args)
    assert off.kl is None and off.entropy is None and off.loss.item() == pytest.approx(-1.0)


def test_metrics_hand_computed():
    mask = T([True, True, True, False])
    log_probs, old = torch.log(T([1.0, 1.3, 0.7, 9.0])), torch.zeros(4)
    assert clip_fraction(log_probs, old, mask, 0.2).item() == pytest.approx(2 / 3)
    assert approx_kl(old, old, mask).item() == 0.0
    expected_kl = sum(r - 1 - math.log(r) for r in (1.0, 1.3, 0.7)) / 3
    assert approx_kl(log_probs, old, mask).item() == pytest.approx(expected_kl, rel=1e-5)


def test_explained_variance():
    targets, mask = T([1.0, 2.0, 3.0, 100.0]), T([True, True, True, False])
    assert explained_variance(targets.clone(), targets, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.0), targets, mask).item() == pytest.approx(0.0)
    # residuals (0, 0, 1): variance 2/9 against the targets' 2/3
    assert explained_variance(T([1.0, 2.0, 2.0, 0.0]), targets, mask).item() == pytest.approx(2 / 3)
    assert math.isnan(explained_variance(torch.zeros(4), torch.ones(4), mask).item())


def test_loss_config_rejects_bad_values():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="aggregation must be one of"):
        LossConfig(aggregation="sum")
