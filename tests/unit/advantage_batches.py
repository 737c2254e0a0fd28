"""TurnBatch builders for the advantage tests: ragged hand-written episodes, and random ones with every field."""

from __future__ import annotations

import torch

from trainer_client.algorithms import TurnBatch, pad_turns, token_mask_from_lengths

T = torch.tensor


def make_batch(rewards, *, penalties=None, terminated=None, groups=None, response_lengths=None, **turn_fields):
    """A TurnBatch from ragged per-episode lists; ragged turn fields (values, entropy, ...) get padded."""
    if response_lengths is None:
        response_lengths = [[2] * len(episode) for episode in rewards]
    token_mask = token_mask_from_lengths(response_lengths)
    for name, value in turn_fields.items():
        if isinstance(value, list):
            turn_fields[name] = pad_turns(value, dtype=torch.long if name == "anchor_ids" else torch.float32,
                                          fill=-1 if name == "anchor_ids" else 0.0)
    return TurnBatch(
        rewards=pad_turns(rewards),
        penalties=pad_turns(penalties if penalties is not None else [[0.0] * len(e) for e in rewards]),
        mask=token_mask.any(-1),
        terminated=T(terminated if terminated is not None else [True] * len(rewards)),
        group_ids=T(groups if groups is not None else list(range(len(rewards)))),
        token_mask=token_mask,
        **turn_fields,
    )


def random_batch(seed: int, num_episodes: int = 8, max_turns: int = 6, max_tokens: int = 5,
                 num_groups: int = 3, dtype: torch.dtype = torch.float64) -> TurnBatch:
    """Random ragged episodes with every optional field filled; padding holds NaN to catch leaks."""
    g = torch.Generator().manual_seed(seed)
    turns = torch.randint(1, max_turns + 1, (num_episodes,), generator=g)
    mask = torch.arange(max_turns) < turns[:, None]
    lengths = torch.randint(1, max_tokens + 1, (num_episodes, max_turns), generator=g) * mask
    token_mask = torch.arange(max_tokens) < lengths[..., None]

    def turn_noise(*shape):
        x = torch.rand(*shape, generator=g, dtype=dtype)
        return torch.where(mask if len(shape) == 2 else token_mask, x, torch.nan)

    return TurnBatch(
        rewards=turn_noise(num_episodes, max_turns),
        penalties=torch.where(torch.rand(num_episodes, max_turns, generator=g) < 0.3, 0.01, 0.0).to(dtype)
        .where(mask, torch.nan),
        mask=mask,
        terminated=torch.rand(num_episodes, generator=g) < 0.5,
        group_ids=torch.randint(0, num_groups, (num_episodes,), generator=g) * 10 + 7,  # ids need not be compact
        token_mask=token_mask,
        values=turn_noise(num_episodes, max_turns),
        q_values=turn_noise(num_episodes, max_turns),
        last_values=torch.rand(num_episodes, generator=g, dtype=dtype),
        token_values=turn_noise(num_episodes, max_turns, max_tokens),
        anchor_ids=torch.where(mask, torch.randint(0, 3, (num_episodes, max_turns), generator=g), -1),
        entropy=turn_noise(num_episodes, max_turns),
    )
