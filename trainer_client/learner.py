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
from trainer_client.algorithms import Advantages, EstimatorNeeds, ValueSource, explained_variance, get_estimator
from trainer_client.policy import Critic, Policy, pad_id
from trainer_client.policy.model import AdaptersOff
from trainer_client.readout import bootstrap_values, critic_readout, old_policy_readout, policy_readout
from trainer_client.rollout import EpisodeRecord
from trainer_client.timing import Timer
from trainer_client.train_config import TrainConfig
from trainer_client.turn_batch import turn_batch, turn_samples, with_trunk_features
from trainer_client.update import critic_update, ppo_policy_update, update_targets


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
    # None until the first learn() compares them (readout.old_policy_readout).
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

    # 2. Readout (no grad, readout.py): old log-probs, entropy, and V, Q from the policy's own backbone (or
    #    the sampler's, once shown equal). A stage an algorithm does not have (or skips) is not entered, so its
    #    time stays exactly 0.
    old, drift, learner.sampler_readout_exact = old_policy_readout(
        learner.policy, episodes, samples, needs, sampler_exact=learner.sampler_readout_exact,
        micro_batch_tokens=tokens, temperature=cfg.rollout.temperature, timer=timer)
    ref = critic_values = last_values = None
    if learner.reference is not None:
        with timer("ref"):
            ref = policy_readout(learner.reference, samples, tokens, cfg.rollout.temperature)
    if learner.critic is not None:
        with timer("values"):
            critic_values = critic_readout(learner.critic, samples, learner.pad, tokens)
    if needs.last_values:
        with timer("values"):
            last_values = bootstrap_values(learner.policy, learner.critic, episodes, needs, tokens)

    # 3. Advantages: one estimator signature for every algorithm.
    with timer("adv"):
        batch = turn_batch(episodes, old, needs, critic_values, last_values, cfg.advantage.anchor_similarity)
        advantages = estimator(batch, cfg.advantage)
        turns = [t for e in episodes for t in e.turns]   # the samples' order
        cut = torch.tensor([t.truncated_reply for t in turns], dtype=torch.bool)
        cut_after_action = cut & torch.tensor([t.valid for t in turns], dtype=torch.bool)
        targets = update_targets(batch, advantages, old, ref, needs,
                                 actor_skips=cut_after_action if cfg.loss.mask_truncated_replies else None)
    metrics = value_metrics(batch, advantages, needs) | drift | {"rollout/cut_replies": float(cut.float().mean())}

    # 4. Updates: a separate critic on its own, then the actor (+ V and Q with the readout).
    if learner.critic is not None:
        with timer("update_critic"):
            metrics |= train_critic(learner, samples, batch, advantages, critic_values, needs, cfg)
    with timer("update_actor"):
        metrics |= ppo_policy_update(
            learner.policy, learner.optimizer, samples, targets, cfg.loss, epochs=cfg.optim.epochs,
            mini_batch_turns=cfg.optim.mini_batch_turns, micro_batch_tokens=tokens,
            grad_clip=cfg.optim.grad_clip, pad_id=learner.pad, value_grad_clip=cfg.optim.value_grad_clip,
            temperature=cfg.rollout.temperature, target_kl=cfg.optim.target_kl,
            measure_gradient_sources=bool(cfg.optim.grad_sources_every) and iteration % cfg.optim.grad_sources_every == 0)
    return metrics
