"""Where V (and Q) come from: how the learner reads them, and when the sampler's reading stands in for its own.

Each estimator says where its values come from (`EstimatorNeeds.values`, a ValueSource). Everything here runs
without grad over the N turn samples of one batch (the [N, ...] layout of trainer_client/turn_batch.py):

1. The policy's own values (BOUNDARY, ours): V is the logit of a reserved output row at the last prompt token,
   Q of the other at the last response token (trainer_client/policy/model.py owns the rows). `policy_readout`
   reads them in the pass that also gives the old log-probs and entropies: our values cost no extra forward.
2. A separate critic (CRITIC_TURN, CRITIC_TOKEN: the ppo_critic baselines): `critic_readout`, its value before
   each response token; column 0 is the turn's V.
3. The sampler's: generation already computed the log-probs, the entropies and, at its prefill, V
   (`sampler_readout`). Never Q: generation does not feed the last response token back through the model.
4. The drift check: `readout_drift` measures the sampler's reading against the learner's. `old_policy_readout`
   runs the learner's pass until one full comparison shows the two agree (SAMPLER_READOUT_TOLERANCE); from then
   on it takes the sampler's and saves a whole no-grad pass per iteration.
5. Bootstrap values: V of the state after the last turn of a truncated episode, read by the model the turns'
   values come from (`bootstrap_values`).
6. What the estimator receives: `estimator_values` picks the value fields of the TurnBatch from the readouts.

From there, V is trained: the estimator's returns (trainer_client/algorithms/advantages.py) become the update's
targets (trainer_client/update.py: update_targets), and V and Q learn in the policy's own backward pass
(ppo_policy_update, with algorithms/losses.py's value_loss); a separate critic learns in critic_update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer_client.algorithms import EstimatorNeeds, ValueSource, masked_mean
from trainer_client.distributed import rank_share, sum_across_ranks
from trainer_client.policy import TokenBatch, TurnSample, micro_batches, pad_id
from trainer_client.rollout import EpisodeRecord
from trainer_client.timing import Timer

# Mean absolute difference (log-prob per token, V per turn) below which the sampler's readout is the learner's.
SAMPLER_READOUT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Readout:
    """Per-sample tensors of one no-grad pass, padded to the longest response L of all N samples."""

    log_probs: Tensor       # [N, L]
    entropy: Tensor         # [N, L]
    response_mask: Tensor   # [N, L] bool
    values: Tensor          # [N] V at the last prompt token (boundary readout)
    q_values: Tensor        # [N] Q at the last response token (zeros from the sampler)


def _pad_columns(x: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


@torch.no_grad()
def read_in_micro_batches(samples: Sequence[TurnSample], forward: Callable[[TokenBatch], dict[str, Tensor]],
                          pad: int, micro_batch_tokens: int) -> dict[str, Tensor]:
    """Run `forward` over micro-batches of `samples` and stitch its outputs back in sample order.

    `forward` returns a dict of [n] or [n, L_micro] tensors; [n, L] ones are padded to the global L.
    """
    width = max(len(s.response_ids) for s in samples)
    parts: dict[str, list[tuple[list[int], Tensor]]] = {}
    for group, share in rank_share(micro_batches([len(s) for s in samples], micro_batch_tokens)):
        outputs = forward(TokenBatch.from_samples([samples[i] for i in group], pad))
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


# ---- 1. the policy's own values -----------------------------------------------------------------------


def policy_readout(policy, samples: Sequence[TurnSample], micro_batch_tokens: int,
                   temperature: float = 1.0) -> Readout:
    """Old log-probs (at `temperature`), entropies, V and Q from the policy, in one pass (no separate
    value model). Also the reference's readout, for the KL term."""
    def forward(batch: TokenBatch) -> dict[str, Tensor]:
        out = policy(batch, temperature)
        return {"log_probs": out.log_probs, "entropy": out.entropy, "response_mask": out.response_mask,
                "values": out.values, "q_values": out.q_values}

    r = read_in_micro_batches(samples, forward, pad_id(policy.tokenizer), micro_batch_tokens)
    return Readout(r["log_probs"], r["entropy"], r["response_mask"], r["values"], r["q_values"])


# ---- 2. a separate critic -----------------------------------------------------------------------------


def critic_readout(critic, samples: Sequence[TurnSample], pad: int, micro_batch_tokens: int) -> Tensor:
    """[N, L]: the critic's value before each response token; column 0 is its turn value V(s_t)."""
    read = read_in_micro_batches(samples, lambda batch: {"token_values": critic(batch)}, pad, micro_batch_tokens)
    return read["token_values"]


# ---- 3. the sampler's ---------------------------------------------------------------------------------


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
    return Readout(log_probs, entropy, response_mask, values, torch.zeros(len(turns)))


# ---- 4. the drift check, and the old-policy readout it decides ------------------------------------------


def readout_drift(sampled: Readout, old: Readout, needs: EstimatorNeeds) -> dict[str, float]:
    """Mean |sampler's - learner's| log-prob per response token, and V per turn where the estimator reads it:
    near 0 when generation and learning run the same weights at the same temperature (a stale or
    mismatched sampler, e.g. another dtype, shows up here)."""
    drift = {"policy/sampler_drift": float(masked_mean((old.log_probs - sampled.log_probs).abs(), old.response_mask))}
    if needs.values is ValueSource.BOUNDARY:
        drift["values/sampler_drift"] = float((old.values - sampled.values).abs().mean())
    return drift


def old_policy_readout(policy, episodes: Sequence[EpisodeRecord], samples: Sequence[TurnSample],
                       needs: EstimatorNeeds, *, sampler_exact: bool | None, micro_batch_tokens: int,
                       temperature: float, timer: Timer) -> tuple[Readout, dict[str, float], bool | None]:
    """Old log-probs, entropies, V and Q: the sampler's, once `sampler_exact` says an earlier iteration showed
    they are the policy's own (a whole no-grad pass saved), else a pass of the policy. Each recomputed readout
    also logs its drift from the sampler's. Returns (readout, drift, sampler_exact): the flag is decided by
    the first full comparison (None until then) and kept after (a sampler in another dtype, or vLLM's kernels,
    differ for good)."""
    sampled = sampler_readout(episodes, needs)
    if sampled is not None and sampler_exact:
        return sampled, {}, sampler_exact
    with timer("old_log_prob"):  # at the sampling temperature, as the sampler drew the tokens
        old = policy_readout(policy, samples, micro_batch_tokens, temperature)
    if sampled is None:   # the log-probs alone (every backend reports them)
        return old, readout_drift(sampler_readout(episodes, EstimatorNeeds()), old, EstimatorNeeds()), sampler_exact
    drift = readout_drift(sampled, old, needs)
    if sampler_exact is None:
        sampler_exact = max(drift.values()) <= SAMPLER_READOUT_TOLERANCE
    return old, drift, sampler_exact


# ---- 5. bootstrap values ------------------------------------------------------------------------------


def bootstrap_values(policy, critic, episodes: Sequence[EpisodeRecord], needs: EstimatorNeeds,
                     micro_batch_tokens: int) -> Tensor:
    """[B] V of the state after the last turn for truncated episodes (0 for the others), read by the
    model the estimator takes its values from: the policy's boundary readout or the separate critic."""
    values = torch.zeros(len(episodes))
    cut = [i for i, e in enumerate(episodes) if e.final_prompt_ids]
    if cut:
        eos = (policy.tokenizer.eos_token_id,)  # V is read before the response: any one token will do
        probes = [TurnSample(episodes[i].final_prompt_ids, eos) for i in cut]
        if needs.values is ValueSource.BOUNDARY:
            values[cut] = policy_readout(policy, probes, micro_batch_tokens).values
        else:
            values[cut] = critic_readout(critic, probes, pad_id(policy.tokenizer), micro_batch_tokens)[:, 0]
    return values


# ---- 6. what the estimator receives -------------------------------------------------------------------


def estimator_values(old: Readout, critic_token_values: Tensor | None, needs: EstimatorNeeds) -> dict[str, Tensor]:
    """The TurnBatch's value fields in the [N, ...] sample layout, from where `needs` says the values come:
    V and Q of the policy's readout, the critic's turn value (column 0), or its value before every token."""
    if needs.values is ValueSource.BOUNDARY:
        return {"values": old.values, "q_values": old.q_values}
    if needs.values is ValueSource.CRITIC_TURN:
        return {"values": critic_token_values[:, 0]}
    if needs.values is ValueSource.CRITIC_TOKEN:
        return {"token_values": critic_token_values}
    return {}
