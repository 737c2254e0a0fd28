"""The learner's optimizer steps, and the PPO epochs on them: the actor (with the boundary readout's V and Q)
and a separate critic. SFT (trainer_client/sft.py) runs the same steps.

One optimizer step per mini-batch of turn samples, its gradient accumulated over micro-batches that fit a token
budget (memory):

    for mini, micro in optimizer_steps(optimizer, samples, epoch_batches(len(samples), 256, epochs), 16384):
        for indices, share in micro:          # forward + backward of each micro-batch, loss scaled by share
            ...
        clip the gradients                    # then the step happens when the loop moves on

A mini-batch's loss is the same whatever its micro-batching: each micro-batch's token-mean (or
sequence-mean) is weighted by its share of the mini-batch's tokens (or sequences) before backward. Under
torchrun each rank takes its share of the micro-batches (trainer_client/distributed.py): `share` is 0 for a
padding pass that only keeps the ranks' collectives in step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer_client.algorithms import (
    Advantages, EstimatorNeeds, LossConfig, TurnBatch, ValueSource, policy_objective, value_loss,
)
from trainer_client.distributed import mean_metrics, rank_share
from trainer_client.policy import TokenBatch, TurnSample, micro_batches
from trainer_client.readout import Readout

# ---- the optimizer steps ------------------------------------------------------------------------------


def mini_batches(n: int, size: int, generator: torch.Generator | None = None) -> list[Tensor]:
    """A shuffled partition of range(n) into chunks of `size` (the last may be smaller)."""
    order = torch.randperm(n, generator=generator)
    return list(order.split(max(1, size)))


def epoch_batches(n: int, size: int, epochs: int) -> Iterator[Tensor]:
    """PPO's mini-batches: each epoch a fresh shuffled partition of the n samples."""
    for _ in range(epochs):
        yield from mini_batches(n, size)


def optimizer_steps(optimizer: torch.optim.Optimizer, samples: Sequence[TurnSample], batches: Iterable[Tensor],
                    micro_batch_tokens: int, after_step: Callable[[], None] | None = None,
                    ) -> Iterator[tuple[Tensor, list[tuple[Tensor, float]]]]:
    """For each mini-batch (sample indices): zero the gradients, yield (mini-batch, [(micro-batch indices, this
    rank's loss scale)]) for the caller's backward passes and clipping, then step the optimizer (and
    `after_step`, e.g. a learning-rate schedule) when the caller asks for the next one."""
    for mini in batches:
        optimizer.zero_grad(set_to_none=True)
        lengths = [len(samples[i]) for i in mini.tolist()]
        yield mini, [(mini[group], share) for group, share in rank_share(micro_batches(lengths, micro_batch_tokens))]
        optimizer.step()
        if after_step is not None:
            after_step()


# ---- what the actor's update compares against ---------------------------------------------------------


@dataclass(frozen=True)
class UpdateTargets:
    """Everything the update compares against, in the [N, ...] sample layout (see turn_batch.py)."""

    old_log_probs: Tensor            # [N, L]
    response_mask: Tensor            # [N, L] bool
    advantages: Tensor               # [N, L]
    ref_log_probs: Tensor | None     # [N, L], when the KL term is on
    old_values: Tensor | None        # [N] boundary V, when the policy learns values
    old_q_values: Tensor | None      # [N] boundary Q
    returns: Tensor | None           # [N] target of V
    q_returns: Tensor | None         # [N] target of Q, when the advantage reads Q (else Q is not trained)


def update_targets(batch: TurnBatch, advantages: Advantages, old: Readout, ref: Readout | None,
                   needs: EstimatorNeeds, actor_skips: Tensor | None = None) -> UpdateTargets:
    """The estimator's [B, T, ...] outputs in the update's [N, ...] sample layout. actor_skips [N] bool: samples
    whose tokens the actor's loss leaves out (their V and Q still learn)."""
    mask, width = batch.mask, old.log_probs.shape[1]
    boundary = needs.values is ValueSource.BOUNDARY
    response_mask = old.response_mask
    if actor_skips is not None:
        response_mask = response_mask & ~actor_skips.to(response_mask.device)[:, None]
    return UpdateTargets(
        old_log_probs=old.log_probs,
        response_mask=response_mask,
        advantages=advantages.advantages[mask][:, :width],
        ref_log_probs=ref.log_probs if ref is not None else None,
        old_values=old.values if boundary else None,
        old_q_values=old.q_values if boundary else None,
        returns=advantages.returns[mask] if boundary else None,
        q_returns=advantages.q_returns[mask] if boundary and advantages.q_returns is not None else None,
    )


# ---- the PPO epochs -----------------------------------------------------------------------------------


def _weight(indices: Tensor, mask: Tensor, whole: Tensor, loss_cfg: LossConfig) -> float:
    """This micro-batch's share of its mini-batch, in the unit the loss averages over."""
    if loss_cfg.aggregation == "token-mean":
        return float(mask[indices].sum()) / max(1.0, float(mask[whole].sum()))
    return len(indices) / len(whole)


def _accumulate(metrics: dict[str, list[float]], name: str, value: Tensor | float | None) -> None:
    if value is not None:
        metrics[name].append(float(value))


def clip_groups(optimizer: torch.optim.Optimizer) -> tuple[list[Tensor], list[Tensor]]:
    """(model parameters, value-row parameters) as the optimizer holds them (Policy.parameter_groups names
    them). Read from the optimizer, not the module: under FSDP2 the root unit's module attributes are
    unsharded temporaries after a forward, and their .grad stays empty. An optimizer without named groups
    is clipped as one."""
    groups = {group.get("name"): group["params"] for group in optimizer.param_groups}
    if "backbone" in groups:
        return list(groups["backbone"]), list(groups.get("value_rows", []))
    return [p for group in optimizer.param_groups for p in group["params"]], []


def gradient_sources(losses: dict[str, Tensor], parameters: Sequence[Tensor]) -> dict[str, float]:
    """Norm of the gradient each loss alone sends into `parameters` (graphs kept for the real backward)."""
    norms = {}
    for name, loss in losses.items():
        grads = torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True)
        norms[name] = float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads if g is not None] or [torch.zeros(())])))
    return norms


def past_target_kl(approx_kl: float, target_kl: float) -> bool:
    """Whether a mini-batch has moved the policy too far from the one that sampled to step on it (the 1.5 x
    target margin is SB3's and CleanRL's). target_kl 0: never."""
    return target_kl > 0 and approx_kl > 1.5 * target_kl


def ppo_policy_update(policy, optimizer: torch.optim.Optimizer, samples: Sequence[TurnSample],
                      targets: UpdateTargets, loss_cfg: LossConfig, *, epochs: int, mini_batch_turns: int,
                      micro_batch_tokens: int, grad_clip: float, pad_id: int, value_grad_clip: float = 1.0,
                      temperature: float = 1.0, measure_gradient_sources: bool = False,
                      target_kl: float = 0.0) -> dict[str, float]:
    """The actor's PPO epochs; with the boundary readout, V (and Q, when the advantage reads it) learn in
    the same backward pass. With `target_kl`, the epochs end before the first mini-batch whose approx KL to
    the sampling policy is past it (past_target_kl): that mini-batch does not step.

    The backbone and the two value rows are clipped apart: one joint clip would let the value error,
    whose gradient dwarfs the policy's at the start, shrink the policy step by a varying factor. With
    `measure_gradient_sources`, the first micro-batch also logs the norm of the backbone gradient that
    the policy loss and the value loss each send (two extra backward passes over it).
    """
    learn_values = targets.returns is not None
    learn_q = learn_values and targets.q_returns is not None
    backbone, value_rows = clip_groups(optimizer)
    measure = measure_gradient_sources   # on the first micro-batch this rank really computes, then off
    metrics: dict[str, list[float]] = defaultdict(list)
    steps = 0
    policy.train()
    for mini, micro in optimizer_steps(optimizer, samples, epoch_batches(len(samples), mini_batch_turns, epochs),
                                       micro_batch_tokens):
        total, kl_sum, kl_turns = 0.0, 0.0, 0
        for idx, share in micro:
            out = policy(TokenBatch.from_samples([samples[i] for i in idx.tolist()], pad_id), temperature,
                         detach_readout=not loss_cfg.value_backbone_grad)
            width = out.log_probs.shape[1]
            mask = targets.response_mask[idx, :width].to(out.log_probs.device)
            take = lambda x: None if x is None else x[idx, :width].to(out.log_probs.device)  # noqa: E731
            actor = policy_objective(loss_cfg, out.log_probs, take(targets.old_log_probs),
                                     take(targets.advantages), mask, take(targets.ref_log_probs), out.entropy)
            loss = actor.loss * _weight(idx, targets.response_mask, mini, loss_cfg)
            if learn_values:
                turns = torch.ones(len(idx), dtype=torch.bool)
                v_loss = value_loss(out.values.cpu(), targets.old_values[idx], targets.returns[idx], turns,
                                    loss_cfg.value_clip)
                values_loss = v_loss
                if learn_q:
                    q_loss = value_loss(out.q_values.cpu(), targets.old_q_values[idx], targets.q_returns[idx],
                                        turns, loss_cfg.value_clip)
                    values_loss = values_loss + q_loss
                values_part = loss_cfg.value_coef * values_loss * (len(idx) / len(mini))
                if measure and share:
                    measure = False
                    for name, norm in gradient_sources({"policy_loss": loss, "value_loss": values_part},
                                                       backbone).items():
                        _accumulate(metrics, f"grad/backbone_from_{name}", norm)
                loss = loss + values_part
            (loss * share).backward()
            if share == 0:  # a padding pass: keeps the ranks' FSDP collectives in step, counts for nothing
                continue
            total += float(loss.detach()) * share
            if learn_values:
                _accumulate(metrics, "loss/value", v_loss.detach())
            if learn_q:
                _accumulate(metrics, "loss/q_value", q_loss.detach())
            _accumulate(metrics, "loss/policy", actor.pg_loss)
            _accumulate(metrics, "loss/kl", actor.kl)
            _accumulate(metrics, "policy/entropy", actor.entropy)
            _accumulate(metrics, "policy/clip_fraction", actor.clip_fraction)
            _accumulate(metrics, "policy/approx_kl", actor.approx_kl)
            kl_sum, kl_turns = kl_sum + float(actor.approx_kl) * len(idx), kl_turns + len(idx)
        # `target_kl and` first: when it is off, no gather across the ranks per step
        if target_kl and past_target_kl(mean_metrics({"kl": kl_sum / max(1, kl_turns)})["kl"], target_kl):
            optimizer.zero_grad(set_to_none=True)   # leaving the loop here: this mini-batch does not step
            break
        steps += 1
        _accumulate(metrics, "loss/total", total)  # the mini-batch's loss (summed over ranks: see mean_metrics)
        _accumulate(metrics, "policy/grad_norm", torch.nn.utils.clip_grad_norm_(backbone, grad_clip))
        if learn_values and value_rows:
            _accumulate(metrics, "values/grad_norm", torch.nn.utils.clip_grad_norm_(value_rows, value_grad_clip))
    metrics["policy/update_steps"] = [steps]
    return mean_metrics({k: sum(v) / len(v) for k, v in metrics.items()})


def critic_update(critic, optimizer: torch.optim.Optimizer, samples: Sequence[TurnSample], old_values: Tensor,
                  returns: Tensor, value_mask: Tensor, loss_cfg: LossConfig, *, epochs: int,
                  mini_batch_turns: int, micro_batch_tokens: int, grad_clip: float, pad_id: int,
                  select: Callable[[Tensor], Tensor]) -> dict[str, float]:
    """The separate critic's epochs. `select` picks what it is trained on from its [n, L] output:
    column 0 (turn form) or every response position (verl's token form); `old_values`, `returns` and
    `value_mask` are in that same selected layout, [N] or [N, L]."""
    metrics: dict[str, list[float]] = defaultdict(list)
    critic.train()
    for mini, micro in optimizer_steps(optimizer, samples, epoch_batches(len(samples), mini_batch_turns, epochs),
                                       micro_batch_tokens):
        total = float(value_mask[mini].sum())
        for idx, share in micro:
            predicted = select(critic(TokenBatch.from_samples([samples[i] for i in idx.tolist()], pad_id))).cpu()
            cut = (slice(None),) if predicted.dim() == 1 else (slice(None), slice(0, predicted.shape[1]))
            mask = value_mask[idx][cut]
            loss = value_loss(predicted, old_values[idx][cut], returns[idx][cut], mask, loss_cfg.value_clip)
            (loss * float(mask.sum()) / max(1.0, total) * share).backward()
            if share:
                _accumulate(metrics, "critic/loss", loss.detach())
        _accumulate(metrics, "critic/grad_norm", torch.nn.utils.clip_grad_norm_(critic.parameters(), grad_clip))
    return mean_metrics({k: sum(v) / len(v) for k, v in metrics.items()})
