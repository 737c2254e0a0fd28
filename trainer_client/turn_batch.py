"""From played episodes to the learner's two layouts: N turn samples, and the TurnBatch the estimator reads.

N turn samples are listed episode by episode, turn by turn. That is exactly the order of the True entries of
TurnBatch.mask, so `x[batch.mask] = flat` and `flat = x[batch.mask]` move between the [N, ...] sample layout
(the readouts of trainer_client/readout.py, the update) and the [B, T, ...] episode layout (the estimator)
without bookkeeping.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

from trainer_client.algorithms import EstimatorNeeds, TurnBatch, assign_anchor_ids, pad_turns
from trainer_client.policy import TokenBatch, TurnSample, micro_batches, pad_id
from trainer_client.readout import Readout, estimator_values
from trainer_client.rollout import EpisodeRecord


def turn_samples(episodes: Sequence[EpisodeRecord]) -> list[TurnSample]:
    return [TurnSample(t.prompt_ids, t.response_ids) for e in episodes for t in e.turns]


@torch.no_grad()
def with_trunk_features(policy, samples: Sequence[TurnSample], micro_batch_tokens: int,
                        only: Collection[int] | None = None) -> list[TurnSample]:
    """The samples again, each carrying the output of the policy's frozen lower layers for its tokens
    (Policy.trunk_features), computed once in micro-batches: later passes run only the trained top layers.
    `only`: just the micro-batches holding these indices (the others come back as they were)."""
    out = list(samples)
    for group in micro_batches([len(s) for s in samples], micro_batch_tokens):
        if only is not None and not any(i in only for i in group):
            continue
        chosen = [samples[i] for i in group]
        features = policy.trunk_features(TokenBatch.from_samples(chosen, pad_id(policy.tokenizer))).cpu()
        for row, (i, s) in enumerate(zip(group, chosen)):
            out[i] = TurnSample(s.prompt_ids, s.response_ids, trunk=features[row, :len(s)])
    return out


def scatter_turns(flat: Tensor, mask: Tensor) -> Tensor:
    """[N, ...] sample layout -> [B, T, ...] episode layout (zeros on padded turns)."""
    out = torch.zeros((*mask.shape, *flat.shape[1:]), dtype=flat.dtype)
    out[mask] = flat
    return out


def turn_batch(episodes: Sequence[EpisodeRecord], old: Readout, needs: EstimatorNeeds,
               critic_token_values: Tensor | None = None, last_values: Tensor | None = None,
               anchor_similarity: float = 1.0) -> TurnBatch:
    """The estimator's input, with exactly the optional fields `needs` asks for (anchor_similarity: see
    assign_anchor_ids)."""
    mask = pad_turns([[1.0] * len(e.turns) for e in episodes]).bool()
    lengths = old.response_mask.sum(-1)
    token_mask = scatter_turns(old.response_mask, mask)
    fields: dict[str, Tensor | None] = {
        name: scatter_turns(values, mask) for name, values in estimator_values(old, critic_token_values, needs).items()}
    if needs.entropy:
        fields["entropy"] = scatter_turns((old.entropy * old.response_mask).sum(-1) / lengths.clamp(min=1), mask)
    if needs.anchor_ids:
        fields["anchor_ids"] = assign_anchor_ids([[t.observation for t in e.turns] for e in episodes],
                                                 [e.task.group_id for e in episodes], anchor_similarity)
    if needs.last_values:
        if last_values is None:
            raise ValueError("this estimator bootstraps truncated episodes: pass last_values")
        fields["last_values"] = last_values
    return TurnBatch(
        rewards=pad_turns([[t.reward for t in e.turns] for e in episodes]),
        penalties=pad_turns([[t.penalty for t in e.turns] for e in episodes]),
        mask=mask,
        terminated=torch.tensor([e.terminated for e in episodes], dtype=torch.bool),
        group_ids=torch.tensor([e.task.group_id for e in episodes], dtype=torch.long),
        token_mask=token_mask,
        **fields,
    )
