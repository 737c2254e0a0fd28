"""The separate critic (ppo_critic baseline): same backbone as the policy, scalar head, own optimizer."""

from __future__ import annotations

import torch
from policy_fixtures import micro_checkpoint, policy, turn_samples  # noqa: F401  (fixtures)

from trainer_client.policy import Critic, TokenBatch


def test_critic_loads_the_policy_backbone_with_a_zero_head(policy, micro_checkpoint):
    critic = Critic.load(micro_checkpoint)
    for name, tensor in critic.backbone.state_dict().items():
        assert torch.equal(tensor, policy.model.model.state_dict()[name]), name
    batch = TokenBatch.from_samples(turn_samples(policy, 4), policy.tokenizer.pad_token_id)
    assert torch.equal(critic(batch), torch.zeros(batch.response_mask.shape))


def test_values_sit_at_the_positions_before_each_response_token(policy, micro_checkpoint):
    critic = Critic.load(micro_checkpoint)
    torch.nn.init.normal_(critic.value_head.weight)
    batch = TokenBatch.from_samples(turn_samples(policy, 5), policy.tokenizer.pad_token_id)
    values = critic(batch)                                                            # [N, L]
    with torch.no_grad():
        hidden = critic.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        every_position = critic.value_head(hidden).squeeze(-1)                        # [N, T]
    for row in range(len(values)):
        p, r = int(batch.prompt_lengths[row]), int(batch.response_lengths[row])
        torch.testing.assert_close(values[row, :r], every_position[row, p - 1:p + r - 1], atol=1e-5, rtol=0)
        torch.testing.assert_close(values[row, 0], every_position[row, p - 1])        # the turn boundary
        assert torch.equal(values[row, r:], torch.zeros_like(values[row, r:]))


def test_own_optimizer_fits_returns_and_leaves_the_policy_alone(policy, micro_checkpoint):
    critic = Critic.load(micro_checkpoint)
    policy_before = {k: v.clone() for k, v in policy.state_dict().items()}
    batch = TokenBatch.from_samples(turn_samples(policy, 8), policy.tokenizer.pad_token_id)
    returns = torch.linspace(0, 1, 8)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = ((critic(batch)[:, 0] - returns) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(torch.equal(v, policy_before[k]) for k, v in policy.state_dict().items())


def test_save_and_load_give_identical_values(policy, micro_checkpoint, tmp_path):
    critic = Critic.load(micro_checkpoint)
    torch.nn.init.normal_(critic.value_head.weight)
    batch = TokenBatch.from_samples(turn_samples(policy, 4), policy.tokenizer.pad_token_id)
    before = critic(batch)
    critic.save(tmp_path)
    assert torch.equal(Critic.load(tmp_path)(batch), before)
