"""The models of one algorithm and one learning step on finished episodes: readout, advantages, updates.

`learn` is steps 2-4 of a training iteration (trainer_client/train.py runs step 1, the rollout). Every
estimator goes through the same step; what it needs (which values, a reference, a critic) is declared by
its `needs`, never by `if algo == ...` branches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from trainer_client import distributed
from trainer_client.algorithms import (
    Advantages, EstimatorNeeds, ValueSource, explained_variance, get_estimator,
)
from trainer_client.experience import (
    Readout, critic_readout, pad_id, policy_readout, readout_drift, sampler_readout, turn_batch, turn_samples,
    with_trunk_features,
)
from trainer_client.policy import Critic, Policy, TurnSample
from trainer_client.policy.model import AdaptersOff
from trainer_client.rollout import EpisodeRecord
from trainer_client.timing import Timer
from trainer_client.train_config import TrainConfig
from trainer_client.update import UpdateTargets, critic_update, ppo_policy_update


@dataclass
class Learner:
    """What an algorithm trains and reads: the policy (its own critic, through the boundary readout), and
    what some baselines add: a frozen reference for the KL term, a separate critic with its own optimizer."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    reference: Policy | AdaptersOff | None = None
    critic: Critic | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    # Whether the sampler's readout equals this learner's own, so the old-policy pass can be skipped:
    # None until the first learn() compares them (a sampler in another dtype, or vLLM's kernels, differ).
    sampler_readout_exact: bool | None = None

    @property
    def pad(self) -> int:
        return pad_id(self.policy.tokenizer)


def load_learner(cfg: TrainConfig, needs: EstimatorNeeds, checkpoint: Path | None = None) -> Learner:
    """The models `cfg` and the estimator's `needs` call for, from cfg.model.path or a run checkpoint
    (whose optimizer states the caller restores)."""
    critic_load = cfg.model.load_kwargs()
    load = critic_load | dict(trainable_layers=cfg.model.trainable_layers)
    lora = cfg.model.lora
    if lora.enabled and distributed.world_size() > 1:
        raise ValueError("model.lora is not supported under torchrun yet: run LoRA on one device")
    # A LoRA run resumes from its base (cfg.model.path) plus the checkpoint's adapters, exactly; any other run
    # from the checkpoint's weights. Under torchrun every model is FSDP-sharded before an optimizer holds its
    # parameters (distributed.py).
    saved = checkpoint / "policy" if checkpoint else None
    policy = distributed.shard(Policy.load(
        cfg.model.path if lora.enabled or saved is None else saved, lora=lora,
        adapters_from=saved if lora.enabled else None, gradient_checkpointing=cfg.model.gradient_checkpointing,
        **load))
    learner = Learner(policy, torch.optim.AdamW(
        policy.parameter_groups(cfg.optim.lr, cfg.optim.value_lr, cfg.optim.weight_decay), eps=cfg.optim.adam_eps))
    if cfg.loss.kl_coef > 0 and lora.enabled:  # the starting policy is the base: no second copy
        learner.reference = AdaptersOff(policy)
    elif cfg.loss.kl_coef > 0:  # the frozen starting policy (the run's, not the resumed one's)
        learner.reference = distributed.shard(Policy.load(cfg.model.path, tokenizer=policy.tokenizer, **load))
        learner.reference.requires_grad_(False)
    if needs.values in (ValueSource.CRITIC_TURN, ValueSource.CRITIC_TOKEN):
        learner.critic = distributed.shard(Critic.load(checkpoint / "critic" if checkpoint else cfg.model.path,
                                                       gradient_checkpointing=cfg.model.gradient_checkpointing, **critic_load))
        learner.critic_optimizer = torch.optim.AdamW(learner.critic.parameters(), lr=cfg.optim.critic_lr,
                                                       eps=cfg.optim.adam_eps)
    return learner


def bootstrap_values(learner: Learner, episodes: list[EpisodeRecord], needs: EstimatorNeeds,
                     micro_batch_tokens: int) -> torch.Tensor:
    """[B] V of the state after the last turn for truncated episodes (0 for the others), read by the
    model the estimator takes its values from: the policy's boundary readout or the separate critic."""
    values = torch.zeros(len(episodes))
    cut = [i for i, e in enumerate(episodes) if e.final_prompt_ids]
    if cut:
        eos = (learner.policy.tokenizer.eos_token_id,)  # V is read before the response: any one token will do
        probes = [TurnSample(episodes[i].final_prompt_ids, eos) for i in cut]
        if needs.values is ValueSource.BOUNDARY:
            values[cut] = policy_readout(learner.policy, probes, micro_batch_tokens).values
        else:
            values[cut] = critic_readout(learner.critic, probes, learner.pad, micro_batch_tokens)[:, 0]
    return values


def update_targets(batch, advantages: Advantages, old, ref, needs) -> UpdateTargets:
    """The estimator's [B, T, ...] outputs in the update's [N, ...] sample layout."""
    mask, width = batch.mask, old.log_probs.shape[1]
    boundary = needs.values is ValueSource.BOUNDARY
    return UpdateTargets(
        old_log_probs=old.log_probs,
        response_mask=old.response_mask,
        advantages=advantages.advantages[mask][:, :width],
        ref_log_probs=ref.log_probs if ref is not None else None,
        old_values=old.values if boundary else None,
        old_q_values=old.q_values if boundary else None,
        returns=advantages.returns[mask] if boundary else None,
        q_returns=advantages.q_returns[mask] if boundary and advantages.q_returns is not None else None,
    )


def train_critic(learner: Learner, samples, batch, advantages: Advantages, critic_values, needs,
                 cfg: TrainConfig) -> dict[str, float]:
    token_level = needs.values is ValueSource.CRITIC_TOKEN
    returns = advantages.returns[batch.mask]                       # [N, L] (token form) or [N] (turn form)
    if token_level:
        old, mask, select = critic_values, batch.token_mask[batch.mask], (lambda out: out)
    else:
        old, mask, select = critic_values[:, 0], torch.ones(len(samples), dtype=torch.bool), (lambda out: out[:, 0])
    return critic_update(learner.critic, learner.critic_optimizer, samples, old, returns, mask, cfg.loss,
                         epochs=cfg.optim.epochs, mini_batch_turns=cfg.optim.mini_batch_turns,
                         micro_batch_tokens=cfg.optim.micro_batch_tokens, grad_clip=cfg.optim.grad_clip,
                         pad_id=learner.pad, select=select)


# Mean absolute difference (log-prob per token, V per turn) below which the sampler's readout is the learner's.
SAMPLER_READOUT_TOLERANCE = 1e-4


def old_policy_readout(learner: Learner, episodes: list[EpisodeRecord], samples, needs, cfg: TrainConfig,
                       timer: Timer) -> tuple[Readout, dict[str, float]]:
    """Old log-probs, entropies, V and Q: the sampler's, once the first iteration has shown they are this
    learner's own (it then skips a full no-grad pass per iteration), else a pass of the policy. Each
    recomputed readout also logs its drift from the sampler's."""
    sampled = sampler_readout(episodes, needs)
    if sampled is not None and learner.sampler_readout_exact:
        return sampled, {}
    with timer("old_log_prob"):  # at the sampling temperature, as the sampler drew the tokens
        old = policy_readout(learner.policy, samples, cfg.optim.micro_batch_tokens, cfg.rollout.temperature)
    if sampled is None:   # the log-probs alone (every backend reports them)
        return old, readout_drift(sampler_readout(episodes, EstimatorNeeds()), old, EstimatorNeeds())
    drift = readout_drift(sampled, old, needs)
    if learner.sampler_readout_exact is None:
        learner.sampler_readout_exact = max(drift.values()) <= SAMPLER_READOUT_TOLERANCE
    return old, drift


def value_metrics(batch, advantages: Advantages, needs) -> dict[str, float]:
    """How well the values explain their targets (before this iteration's update), and the batch std the
    advantages were divided by (before its floor)."""
    out = {} if advantages.raw_std is None else {"advantage/raw_std": float(advantages.raw_std)}
    if needs.values is ValueSource.NONE or advantages.returns is None:
        return out
    if needs.values is ValueSource.CRITIC_TOKEN:
        values, mask = batch.token_values, batch.token_mask
    else:
        values, mask = batch.values, batch.mask
    out |= {"values/explained_variance": float(explained_variance(values, advantages.returns, mask)),
            "values/mean": float(values[mask].mean())}
    if advantages.q_returns is not None:
        out["values/q_explained_variance"] = float(explained_variance(batch.q_values, advantages.q_returns, batch.mask))
    return out



def learn(learner: Learner, episodes: list[EpisodeRecord], cfg: TrainConfig, timer: Timer,
          iteration: int = 0) -> dict[str, float]:
    """Steps 2-4 of an iteration on finished episodes: readout, advantages, updates. Returns the metrics."""
    estimator = get_estimator(cfg.algo)
    needs = estimator.needs(cfg.advantage)
    samples, tokens = turn_samples(episodes), cfg.optim.micro_batch_tokens
    if learner.policy.trunk_layers:  # the frozen layers run once; every pass below starts from their output
        with timer("trunk"):
            samples = with_trunk_features(learner.policy, samples, tokens)

    # 2. Readout (no grad): old log-probs, entropy, and V, Q from the policy's own backbone. A stage an
    #    algorithm does not have (or skips) is not entered, so its time stays exactly 0.
    old, drift = old_policy_readout(learner, episodes, samples, needs, cfg, timer)
    ref = critic_values = last_values = None
    if learner.reference is not None:
        with timer("ref"):
            ref = policy_readout(learner.reference, samples, tokens, cfg.rollout.temperature)
    if learner.critic is not None:
        with timer("values"):
            critic_values = critic_readout(learner.critic, samples, learner.pad, tokens)
    if needs.last_values:
        with timer("values"):
            last_values = bootstrap_values(learner, episodes, needs, tokens)

    # 3. Advantages: one estimator signature for every algorithm.
    with timer("adv"):
        batch = turn_batch(episodes, old, needs, critic_values, last_values, cfg.advantage.anchor_similarity)
        advantages = estimator(batch, cfg.advantage)
        targets = update_targets(batch, advantages, old, ref, needs)
    metrics = value_metrics(batch, advantages, needs) | drift

    # 4. Updates: a separate critic on its own, then the actor (+ V and Q with the readout).
    if learner.critic is not None:
        with timer("update_critic"):
            metrics |= train_critic(learner, samples, batch, advantages, critic_values, needs, cfg)
    with timer("update_actor"):
        metrics |= ppo_policy_update(
            learner.policy, learner.optimizer, samples, targets, cfg.loss, epochs=cfg.optim.epochs,
            mini_batch_turns=cfg.optim.mini_batch_turns, micro_batch_tokens=tokens,
            grad_clip=cfg.optim.grad_clip, pad_id=learner.pad, value_grad_clip=cfg.optim.value_grad_clip,
            temperature=cfg.rollout.temperature,
            measure_gradient_sources=bool(cfg.optim.grad_sources_every) and iteration % cfg.optim.grad_sources_every == 0)
    return metrics
