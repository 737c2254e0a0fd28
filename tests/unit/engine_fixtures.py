"""Shared by the engine-backend tests: make the value rows win every unmasked argmax, and move the weights."""

from __future__ import annotations

import torch
from policy_fixtures import turn_samples

from trainer_client.policy import Policy, TokenBatch


@torch.no_grad()
def make_value_rows_dominant(policy: Policy, scale: float = 1000.0) -> None:
    """Point both value rows along the mean hidden state and write them into the output layer: unmasked,
    the reserved ids would then be the argmax at (nearly) every position."""
    batch = TokenBatch.from_samples(turn_samples(policy, 8), policy.tokenizer.pad_token_id)
    hidden = policy.model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    direction = hidden[batch.attention_mask.bool()].mean(0)
    policy.value_rows.copy_(torch.stack([direction, direction]) * scale / direction.norm())
    policy.write_value_rows()


@torch.no_grad()
def reserved_win_share(policy: Policy) -> float:
    """Share of positions whose unmasked argmax is a reserved id."""
    batch = TokenBatch.from_samples(turn_samples(policy, 4), policy.tokenizer.pad_token_id)
    logits = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return float((logits[batch.attention_mask.bool()].argmax(-1) >= policy.n_policy_tokens).float().mean())


@torch.no_grad()
def perturb(policy: Policy, scale: float = 0.05, seed: int = 0) -> None:
    """Move every weight, as a (large) update would."""
    generator = torch.Generator().manual_seed(seed)
    for parameter in policy.model.parameters():
        parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * scale)
