"""The actor update's value handling: separate gradient clips, the detached-readout ablation, the measured
gradient sources, and a Q that trains only when the advantage reads it; and the epochs' early stop at target_kl.

Each case runs one real PPO update (SGD, so a weight's change is -lr x its clipped gradient) on toy-env turns.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from policy_fixtures import micro_checkpoint, turn_samples  # noqa: F401  (fixture)

from trainer_client.algorithms import LossConfig
from trainer_client.readout import policy_readout
from trainer_client.policy import Policy
from trainer_client.update import UpdateTargets, past_target_kl, ppo_policy_update

N = 8


def one_update(checkpoint, returns: float, *, grad_clip: float, value_grad_clip: float = 1e9,
               loss_cfg: LossConfig = LossConfig(kl_coef=0.0, entropy_coef=0.0), q_returns: float | None = None,
               measure: bool = False, epochs: int = 1, mini_batch_turns: int = N, target_kl: float = 0.0):
    """(backbone weights before, after, value rows before, after, metrics) of one update whose V targets
    are all `returns` (the rows start at 0, so a large target means a large value error)."""
    torch.manual_seed(0)
    policy = Policy.load(checkpoint)
    samples = turn_samples(policy, N)
    old = policy_readout(policy, samples, 4096)
    generator = torch.Generator().manual_seed(1)
    targets = UpdateTargets(
        old_log_probs=old.log_probs, response_mask=old.response_mask,
        advantages=torch.randn(old.log_probs.shape, generator=generator) * old.response_mask,
        ref_log_probs=None, old_values=old.values, old_q_values=old.q_values,
        returns=torch.full((N,), returns),
        q_returns=None if q_returns is None else torch.full((N,), q_returns))
    before = [p.detach().clone() for p in policy.model.parameters()]
    rows_before = policy.value_rows.detach().clone()
    optimizer = torch.optim.SGD(policy.parameter_groups(1.0, 1.0), lr=1.0)
    torch.manual_seed(2)
    metrics = ppo_policy_update(policy, optimizer, samples, targets, loss_cfg, epochs=epochs,
                                mini_batch_turns=mini_batch_turns, micro_batch_tokens=4096, grad_clip=grad_clip,
                                value_grad_clip=value_grad_clip, pad_id=policy.tokenizer.pad_token_id,
                                measure_gradient_sources=measure, target_kl=target_kl)
    after = [p.detach().clone() for p in policy.model.parameters()]
    return before, after, rows_before, policy.value_rows.detach().clone(), metrics


def step_norm(before, after) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a - b) for a, b in zip(after, before)])))


def test_a_large_value_error_does_not_shrink_the_policy_step(micro_checkpoint):  # noqa: F811
    """The rows' gradient grows with the value error; with one joint clip it would eat the policy's share.
    With the readout detached, the backbone step must be the same whatever the value targets are."""
    detached = LossConfig(kl_coef=0.0, entropy_coef=0.0, value_backbone_grad=False)
    small = one_update(micro_checkpoint, 0.0, grad_clip=0.05, loss_cfg=detached)
    large = one_update(micro_checkpoint, 1000.0, grad_clip=0.05, loss_cfg=detached)
    assert large[4]["values/grad_norm"] > 100 * max(small[4]["values/grad_norm"], 1e-3)
    for a, b in zip(small[1], large[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert step_norm(large[0], large[1]) == pytest.approx(0.05, rel=1e-3)  # the clip acted on the policy alone


def test_each_part_is_clipped_to_its_own_bound(micro_checkpoint):  # noqa: F811
    before, after, rows_before, rows_after, metrics = one_update(micro_checkpoint, 1000.0, grad_clip=0.03,
                                                                 value_grad_clip=0.2)
    assert metrics["policy/grad_norm"] > 0.03 and metrics["values/grad_norm"] > 0.2  # pre-clip norms, logged
    assert step_norm(before, after) == pytest.approx(0.03, rel=1e-3)
    assert float(torch.linalg.vector_norm(rows_after - rows_before)) == pytest.approx(0.2, rel=1e-3)


def test_gradient_sources_measure_what_each_loss_sends_into_the_backbone(micro_checkpoint):  # noqa: F811
    shared = one_update(micro_checkpoint, 5.0, grad_clip=1e9, measure=True)[4]
    assert shared["grad/backbone_from_policy_loss"] > 0
    # Rows at 0 send no gradient into the backbone on the first step; the measure must say so, exactly.
    assert shared["grad/backbone_from_value_loss"] == 0.0
    # Once the rows are non-zero the value loss reaches the backbone, unless the readout is detached.
    policy_with_rows = one_update(micro_checkpoint, 5.0, grad_clip=1e9)
    assert float(policy_with_rows[3].abs().sum()) > 0


def test_q_trains_only_when_it_has_a_target(micro_checkpoint):  # noqa: F811
    _, _, rows_before, rows_after, metrics = one_update(micro_checkpoint, 1.0, grad_clip=1e9)
    assert torch.equal(rows_after[1], rows_before[1]) and not torch.equal(rows_after[0], rows_before[0])
    assert "loss/q_value" not in metrics
    _, _, rows_before, rows_after, metrics = one_update(micro_checkpoint, 1.0, grad_clip=1e9, q_returns=1.0)
    assert not torch.equal(rows_after[1], rows_before[1]) and "loss/q_value" in metrics


def test_value_loss_reaches_the_backbone_unless_the_readout_is_detached(micro_checkpoint, tmp_path):  # noqa: F811
    """From a checkpoint whose value rows are non-zero: the measured value-loss gradient into the backbone is
    positive with the shared representation and exactly 0 with the detached readout."""
    torch.manual_seed(0)
    policy = Policy.load(micro_checkpoint)
    with torch.no_grad():
        policy.value_rows.normal_(0.0, 0.5)
    policy.save(tmp_path / "rows")
    shared = one_update(tmp_path / "rows", 5.0, grad_clip=1e9, measure=True)[4]
    detached = one_update(tmp_path / "rows", 5.0, grad_clip=1e9, measure=True,
                          loss_cfg=dataclasses.replace(LossConfig(kl_coef=0.0, entropy_coef=0.0),
                                                       value_backbone_grad=False))[4]
    assert shared["grad/backbone_from_value_loss"] > 0
    assert detached["grad/backbone_from_value_loss"] == 0.0
    assert detached["grad/backbone_from_policy_loss"] == pytest.approx(shared["grad/backbone_from_policy_loss"])


def test_target_kl_is_passed_at_one_and_a_half_times_it():
    assert past_target_kl(0.031, 0.02) and not past_target_kl(0.029, 0.02)
    assert not past_target_kl(100.0, 0.0)   # 0: off


def test_target_kl_ends_the_epochs_before_the_first_step_past_it(micro_checkpoint):  # noqa: F811
    """4 epochs of 2-turn mini-batches are 16 steps. The first mini-batch is scored by the policy that sampled
    (KL 0) and steps; a step of SGD at lr 1 moves the policy past any small target, so the update ends there,
    and its weights are those of one step."""
    full = one_update(micro_checkpoint, 0.0, grad_clip=1.0, epochs=4, mini_batch_turns=2)
    assert full[4]["policy/update_steps"] == 16
    stopped = one_update(micro_checkpoint, 0.0, grad_clip=1.0, epochs=4, mini_batch_turns=2, target_kl=1e-4)
    assert stopped[4]["policy/update_steps"] == 1 and stopped[4]["policy/approx_kl"] > 1.5e-4
    one_step = one_update(micro_checkpoint, 0.0, grad_clip=1.0, epochs=1, mini_batch_turns=2, target_kl=1e-4)
    for a, b in zip(stopped[1], one_step[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
