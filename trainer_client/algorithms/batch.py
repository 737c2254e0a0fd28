"""The per-turn batch every advantage estimator reads, and the advantages it returns.

Plain tensors in validated frozen dataclasses, plus the GiGPO anchor-id builder; no models, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

import torch
from torch import Tensor


def check_left_aligned(mask: Tensor, name: str) -> None:
    """Raise unless `mask` (bool, any shape) is True on a prefix of its last dim and False after."""
    if mask.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor, got {mask.dtype}")
    if mask.shape[-1] > 1 and (mask[..., 1:] & ~mask[..., :-1]).any():
        raise ValueError(f"{name} must be left-aligned: True entries first, padding after")


def _check_shape(tensor: Tensor | None, shape: tuple[int, ...], name: str) -> None:
    if tensor is not None and tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")


def _check_float(tensor: Tensor | None, name: str) -> None:
    if tensor is not None and not tensor.is_floating_point():
        raise ValueError(f"{name} must be a float tensor, got {tensor.dtype}")


def _check_integer(tensor: Tensor | None, name: str) -> None:
    if tensor is not None and (tensor.is_floating_point() or tensor.dtype == torch.bool):
        raise ValueError(f"{name} must be an integer tensor, got {tensor.dtype}")


@dataclass(frozen=True, eq=False)  # tensors have no single truth value to compare
class TurnBatch:
    """B episodes padded to T turns, each turn's response padded to L tokens.

    One turn is one (prompt, response) step sample: the prompt shows the state s_t, the response is the
    action a_t. Turn-level tensors are [B, T]; padded turns (mask False) may hold any value. Which of the
    optional fields an estimator reads is declared by its `needs(cfg)` (see advantages.py).
    """

    rewards: Tensor  # [B, T] float: env reward of each turn (success 1.0 at the last turn, else 0)
    penalties: Tensor  # [B, T] float >= 0: format penalty of each turn (0.01 when invalid on the {0,1} scale)
    mask: Tensor  # [B, T] bool: real turns, left-aligned; every episode has at least one
    terminated: Tensor  # [B] bool: ended by the env, not cut by the turn limit
    group_ids: Tensor  # [B] integer: episodes of the same task in the same iteration share an id
    token_mask: Tensor  # [B, T, L] bool: real response tokens of each turn, left-aligned, >= 1 per real turn
    values: Tensor | None = None  # [B, T] V(s_t) at the last prompt token: boundary readout or separate critic
    q_values: Tensor | None = None  # [B, T] Q(s_t, a_t) at the last response token (boundary readout)
    last_values: Tensor | None = None  # [B] V of the state after the last real turn (bootstrap if truncated)
    token_values: Tensor | None = None  # [B, T, L] separate critic's V before each response token (verl form)
    anchor_ids: Tensor | None = None  # [B, T] integer: id of the raw observation of each turn (GiGPO), -1 pad
    entropy: Tensor | None = None  # [B, T] mean token entropy of each response under the old policy (EMPG)

    def __post_init__(self) -> None:
        if self.mask.dim() != 2:
            raise ValueError(f"mask must be [B, T], got shape {list(self.mask.shape)}")
        batch_size, num_turns = self.mask.shape
        turn_shape = (batch_size, num_turns)
        check_left_aligned(self.mask, "mask")
        if not self.mask[:, 0].all():
            raise ValueError("every episode needs at least one real turn (mask[:, 0] must be True)")
        for name in ("rewards", "penalties", "values", "q_values", "entropy"):
            _check_shape(getattr(self, name), turn_shape, name)
            _check_float(getattr(self, name), name)
        if (self.penalties[self.mask] < 0).any():
            raise ValueError("penalties must be >= 0 (they are subtracted from the reward)")
        for name in ("terminated", "last_values"):
            _check_shape(getattr(self, name), (batch_size,), name)
        _check_shape(self.group_ids, (batch_size,), "group_ids")
        _check_shape(self.anchor_ids, turn_shape, "anchor_ids")
        _check_integer(self.group_ids, "group_ids")
        _check_integer(self.anchor_ids, "anchor_ids")
        _check_float(self.last_values, "last_values")
        if self.terminated.dtype != torch.bool:
            raise ValueError(f"terminated must be a bool tensor, got {self.terminated.dtype}")
        if self.token_mask.dim() != 3 or tuple(self.token_mask.shape[:2]) != turn_shape:
            raise ValueError(f"token_mask must be [B, T, L] with [B, T] = {list(turn_shape)}, "
                             f"got {list(self.token_mask.shape)}")
        check_left_aligned(self.token_mask, "token_mask")
        if not torch.equal(self.token_mask.any(dim=-1), self.mask):
            raise ValueError("token_mask must have at least one token on every real turn and none on padded turns")
        _check_shape(self.token_values, tuple(self.token_mask.shape), "token_values")
        _check_float(self.token_values, "token_values")

    @property
    def episode_rewards(self) -> Tensor:
        """[B] undiscounted sum of env rewards over each episode's real turns (verl-agent's episode_rewards)."""
        return torch.where(self.mask, self.rewards, 0.0).sum(dim=1)


@dataclass(frozen=True, eq=False)
class Advantages:
    """What an estimator returns: per-token advantages and, for critics, the value targets.

    Turn-level estimators broadcast a turn's advantage over its response tokens. Every tensor is zero on
    padded turns and padded tokens.
    """

    advantages: Tensor  # [B, T, L]
    # Targets for the values the estimator consumed: [B, T] for V at the turn boundary (boundary readout,
    # separate critic `turn` form) or [B, T, L] for the separate critic's token values (`verl` form);
    # None for critic-free estimators.
    returns: Tensor | None = None
    q_returns: Tensor | None = None  # [B, T] targets for Q(s_t, a_t); boundary estimator when it reads Q
    raw_std: Tensor | None = None  # scalar: the batch std the normalization divided by, before its floor


def pad_turns(per_episode: Sequence[Sequence[float]], fill: float = 0.0,
              dtype: torch.dtype = torch.float32) -> Tensor:
    """Ragged per-episode turn values -> [B, T_max], `fill` after each episode's last turn."""
    num_turns = max((len(episode) for episode in per_episode), default=0)
    padded = torch.full((len(per_episode), num_turns), fill, dtype=dtype)
    for b, episode in enumerate(per_episode):
        padded[b, :len(episode)] = torch.tensor(list(episode), dtype=dtype)
    return padded


def token_mask_from_lengths(response_lengths: Sequence[Sequence[int]], num_tokens: int | None = None) -> Tensor:
    """Response lengths per episode and turn -> TurnBatch.token_mask [B, T_max, L]; L defaults to the longest.

    Its `.any(-1)` is TurnBatch.mask.
    """
    lengths = pad_turns(response_lengths, dtype=torch.long)
    num_tokens = int(lengths.max()) if num_tokens is None else num_tokens
    if int(lengths.max()) > num_tokens:
        raise ValueError(f"a response has {int(lengths.max())} tokens, more than num_tokens={num_tokens}")
    return torch.arange(num_tokens) < lengths.unsqueeze(-1)


def assign_anchor_ids(observations: Sequence[Sequence[str]], group_ids: Sequence[int],
                      similarity: float = 1.0) -> Tensor:
    """GiGPO anchor states: one id per distinct raw observation within each task group.

    observations[b][t] is the raw env observation of turn t of episode b (no history, task or admissible
    actions). Turns of episodes in the same group get the same id when their observations are identical
    (similarity 1.0) or, below 1.0, when difflib's ratio to a cluster's first member reaches `similarity`
    (verl-agent's similarity mode, greedy in batch order). Returns [B, T_max] long, -1 on padding; ids
    are unique within a group only, as the estimators group by (group id, anchor id).
    """
    if not 0.0 < similarity <= 1.0:
        raise ValueError(f"similarity must be in (0, 1], got {similarity}")
    if len(observations) != len(group_ids):
        raise ValueError(f"{len(observations)} episodes of observations but {len(group_ids)} group ids")
    num_turns = max((len(episode) for episode in observations), default=0)
    anchor_ids = torch.full((len(observations), num_turns), -1, dtype=torch.long)
    clusters: dict[int, dict[str, int]] = {}  # group id -> {first observation of a cluster: its anchor id}
    for b, (episode, group) in enumerate(zip(observations, group_ids)):
        group_clusters = clusters.setdefault(int(group), {})
        for t, observation in enumerate(episode):
            anchor_ids[b, t] = _anchor_of(group_clusters, observation, similarity)
    return anchor_ids


def _anchor_of(clusters: dict[str, int], observation: str, similarity: float) -> int:
    anchor = clusters.get(observation)
    if anchor is None and similarity < 1.0:
        anchor = next((index for representative, index in clusters.items()
                       if SequenceMatcher(None, observation, representative).ratio() >= similarity), None)
    if anchor is None:
        anchor = clusters[observation] = len(clusters)
    return anchor
