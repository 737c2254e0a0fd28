"""The policy's distribution over its vocabulary: masking of reserved ids, temperature, top-p, entropy.

Shared by the trainer's forward and the sampler, so the log-probs a backend reports for its samples
are the ones the trainer computes for the same tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def policy_log_probs(logits: Tensor, n_policy_tokens: int, temperature: float = 1.0) -> Tensor:
    """log_softmax over ids < n_policy_tokens only, in fp32: [..., V] -> [..., n_policy_tokens].

    Ids >= n_policy_tokens (the two value ids and any other spare row of the output layer) are out
    of the softmax, i.e. their probability is exactly 0 and they do not enter the normalizer, so
    training the value rows never moves the policy. temperature <= 0 means greedy: temperature 1.
    """
    if logits.shape[-1] < n_policy_tokens:
        raise ValueError(f"logits have {logits.shape[-1]} ids, fewer than the {n_policy_tokens} policy ids")
    scaled = logits[..., :n_policy_tokens].float()
    if temperature > 0:
        scaled = scaled / temperature
    return torch.log_softmax(scaled, dim=-1)


def entropy_from_log_probs(log_probs: Tensor) -> Tensor:
    """Entropy of each distribution over the last axis: [..., V] -> [...]."""
    return -(log_probs.exp() * log_probs).sum(-1)


def top_p_filter(log_probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely ids whose probability reaches top_p; -inf elsewhere.

    [B, V] -> [B, V]. The most likely id is always kept, so top_p near 0 is greedy.
    """
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_p == 1:
        return log_probs
    sorted_log_probs, order = log_probs.sort(dim=-1, descending=True)
    probability_before = sorted_log_probs.exp().cumsum(-1) - sorted_log_probs.exp()
    sorted_log_probs = sorted_log_probs.masked_fill(probability_before >= top_p, float("-inf"))
    return torch.empty_like(log_probs).scatter_(-1, order, sorted_log_probs)
