"""From played episodes to what the update needs: turn samples, the no-grad readout, and the TurnBatch.

Layout: N turn samples listed episode by episode, turn by turn. That is exactly the order of the True
entries of TurnBatch.mask, so `x[batch.mask] = flat` and `flat = x[batch.mask]` move between the
[N, ...] sample layout and the [B, T, ...] episode layout without bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer_client.algorithms import (
    EstimatorNeeds, TurnBatch, ValueSource, assign_anchor_ids, masked_mean, pad_turns,
)
from trainer_client.distributed import rank_share, sum_across_ranks
from trainer_client.policy import TokenBatch, TurnSample, micro_batches
from trainer_client.rollout import EpisodeRecord


def turn_samples(episodes: Sequence[EpisodeRecord]) -> list[TurnSample]:
    return [TurnSample(t.prompt_ids, t.response_ids) for e in episodes for t in e.turns]


@dataclass(frozen=True)
class Readout:
    """Per-sample tensors of one no-grad pass, padded to the longest response L of all N samples."""

    log_probs: Tensor       # [N, L]
    entropy: Tensor         # [N, L]
    response_mask: Tensor   # [N, L] bool
    values: Tensor          # [N] V at the last prompt token (boundary readout), or the critic's turn value
    q_values: Tensor        # [N] Q at the last response token (zeros for a critic)
    token_values: Tensor    # [N, L] a critic's value before each response token (zeros for the policy)


def _pad_columns(x: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


@torch.no_grad()
def read(samples: Sequence[TurnSample], forward: Callable[[TokenBatch], dict[str, Tensor]], pad_id: int,
         micro_batch_tokens: int) -> dict[str, Tensor]:
    """Run `forward` over micro-batches of `samples` and stitch its outputs back in sample order.

    `forward` returns a dict of [n] or [n, L_micro] tensors; [n, L] ones are padded to the global L.
    """
    width = max(len(s.response_ids) for s in samples)
    parts: dict[str, list[tuple[list[int], Tensor]]] = {}
    for group, share in rank_share(micro_batches([len(s) for s in samples], micro_batch_tokens)):
        outputs = forward(TokenBatch.from_samples([samples[i] for i in group], pad_id))
        for name, value in outputs.items():
            value = value.detach().float().cpu() if value.is_floating_point() else value.cpu()
            if share == 0:  # a padding pass (FSDP ranks forward equally often): the owning rank has the values
                value = torch.zeros_like(value)
            parts.setdefault(name, []).append((group, _pad_columns(value, width) if value.dim() == 2 else value))
    stitched = {}
    for name, pieces in parts.items():
        first = pieces[0][1]
        out = torch.zeros((len(samples), *first.shape[1:]), dtype=first.dtype)
        for group, value in pieces:
            out[group] = value
        stitched[name] = sum_across_ranks(out)   # ranks filled disjoint rows
    return stitched


@torch.no_grad()
def with_trunk_features(policy, samples: Sequence[TurnSample], micro_batch_tokens: int) -> list[TurnSample]:
    """The samples again, each carrying the output of the policy's frozen lower layers for its tokens
    (Policy.trunk_features), computed once in micro-batches: later passes run only the trained top layers."""
    out = list(samples)
    for group in micro_batches([len(s) for s in samples], micro_batch_tokens):
        chosen = [samples[i] for i in group]
        features = policy.trunk_features(TokenBatch.from_samples(chosen, pad_id(policy.tokenizer))).cpu()
        for row, (i, s) in enumerate(zip(group, chosen)):
            out[i] = TurnSample(s.prompt_ids, s.response_ids, trunk=features[row, :len(s)])
    return out


def policy_readout(policy, samples: Sequence[TurnSample], micro_batch_tokens: int,
                   temperature: float = 1.0) -> Readout:
    """Old log-probs (at `temperature`), entropies, V and Q from the policy, in one pass (no separate
    value model)."""
    def forward(batch: TokenBatch) -> dict[str, Tensor]:
        out = policy(batch, temperature)
        return {"log_probs": out.log_probs, "entropy": out.entropy, "response_mask": out.response_mask,
                "values": out.values, "q_values": out.q_values}

    r = read(samples, forward, pad_id(policy.tokenizer), micro_batch_tokens)
    return Readout(r["log_probs"], r["entropy"], r["response_mask"], r["values"], r["q_values"],
                   torch.zeros_like(r["log_probs"]))


def sampler_readout(episodes: Sequence[EpisodeRecord], needs: EstimatorNeeds) -> Readout | None:
    """The readout the sampler already made while drawing the turns: its log-probs (at the sampling
    temperature), its entropies and V from the prefill's reserved logit. None where it lacks something
    `needs` asks for, and always for Q: Q is read at the last response token, which generation never feeds
    back through the model."""
    turns = [t for e in episodes for t in e.turns]
    lacking = ((needs.values is ValueSource.BOUNDARY and any(t.sampled_value is None for t in turns))
               or (needs.entropy and any(len(t.sampled_entropies) != len(t.response_ids) for t in turns)))
    if needs.q_values or lacking:
        return None
    width = max(len(t.response_ids) for t in turns)
    log_probs, entropy = torch.zeros(len(turns), width), torch.zeros(len(turns), width)
    response_mask = torch.zeros(len(turns), width, dtype=torch.bool)
    for row, turn in enumerate(turns):
        n = len(turn.response_ids)
        log_probs[row, :n] = torch.tensor(turn.sampled_log_probs)
        response_mask[row, :n] = True
        if turn.sampled_entropies:
            entropy[row, :n] = torch.tensor(turn.sampled_entropies)
    values = torch.tensor([t.sampled_value or 0.0 for t in turns])
    return Readout(log_probs, entropy, response_mask, values, torch.zeros(len(turns)), torch.zeros_like(log_probs))


def readout_drift(sampled: Readout, old: Readout, needs: EstimatorNeeds) -> dict[str, float]:
    """Mean |sampler's - learner's| log-prob per response token, and V per turn where the estimator reads it:
    near 0 when generation and learning run the same weights at the same temperature (a stale or
    mismatched sampler, e.g. another dtype, shows up here)."""
    drift = {"policy/sampler_drift": float(masked_mean((old.log_probs - sampled.log_probs).abs(), old.response_mask))}
    if needs.values is ValueSource.BOUNDARY:
        drift["values/sampler_drift"] = float((old.values - sampled.values).abs().mean())
    return drift


def critic_readout(critic, samples: Sequence[TurnSample], pad: int, micro_batch_tokens: int) -> Tensor:
    """[N, L]: the critic's value before each response token; column 0 is its turn value V(s_t)."""
    return read(samples, lambda batch: {"token_values": critic(batch)}, pad, micro_batch_tokens)["token_values"]


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


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
    fields: dict[str, Tensor | None] = {}
    if needs.values is ValueSource.BOUNDARY:
        fields["values"], fields["q_values"] = scatter_turns(old.values, mask), scatter_turns(old.q_values, mask)
    elif needs.values is ValueSource.CRITIC_TURN:
        fields["values"] = scatter_turns(critic_token_values[:, 0], mask)
    elif needs.values is ValueSource.CRITIC_TOKEN:
        fields["token_values"] = scatter_turns(critic_token_values, mask)
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
