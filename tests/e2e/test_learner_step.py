"""The loop's learner step (`learner.learn`) for every algorithm on synthetic episodes with a real micro model,
and the iteration-cost benchmark built on it."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from training_fixtures import bench, toy_model  # noqa: F401  (pytest fixtures)

from trainer_client.algorithms import get_estimator
from trainer_client.config import load
from trainer_client.learner import learn, load_learner
from trainer_client.policy import TurnSample
from trainer_client.readout import bootstrap_values, critic_readout, policy_readout
from trainer_client.timing import ITERATION_STAGES, Timer
from trainer_client.train_config import TrainConfig, group_size_of

SETTINGS = {
    "boundary": ["algo=boundary"],
    "boundary-two_boundary": ["algo=boundary", "advantage.adv_mode=two_boundary", "loss.value_clip=0.05"],
    "ppo_critic-verl": ["algo=ppo_critic", "loss.value_clip=0.05"],
    "ppo_critic-turn": ["algo=ppo_critic", "advantage.ppo_critic_form=turn"],
    "grpo": ["algo=grpo"],
    "rloo-trajectory": ["algo=rloo", "advantage.group_form=trajectory"],
    "gigpo-mean": ["algo=gigpo", "advantage.gigpo_mode=mean_norm", "advantage.anchor_similarity=0.9"],
    "empg": ["algo=empg"],
}


def config(model, overrides: list[str]) -> TrainConfig:
    return load(TrainConfig, None, [f"model.path={model}", "episodes_per_iteration=8",
                                                  "optim.mini_batch_turns=8", "optim.lr=1e-3", *overrides])


def small_shape(bench):
    return bench.SyntheticShape(episodes=8, turns=3, prompt_tokens=20, response_tokens=5, success_rate=0.5)


@pytest.mark.parametrize("name", SETTINGS)
def test_learn_fills_every_stage_and_moves_the_policy(name, bench, toy_model):
    cfg = config(toy_model, SETTINGS[name])
    needs = get_estimator(cfg.algo).needs(cfg.advantage)
    learner = load_learner(cfg, needs)
    episodes = bench.synthetic_episodes(small_shape(bench), learner.policy.n_policy_tokens, group_size_of(cfg))
    start = [p.detach().clone() for p in learner.policy.model.parameters()]
    timer = Timer()
    metrics = learn(learner, episodes, cfg, timer)

    reads_critic = name.startswith("ppo_critic")
    assert set(timer.seconds) == set(ITERATION_STAGES)
    assert timer.seconds["generation"] == timer.seconds["env_wait"] == 0  # the loop's, not the learner's
    for stage in ("old_log_prob", "ref", "adv", "update_actor"):
        assert timer.seconds[stage] > 0, stage
    assert (timer.seconds["values"] > 0) == (timer.seconds["update_critic"] > 0) == reads_critic
    assert all(math.isfinite(v) for k, v in metrics.items() if "explained_variance" not in k)
    assert ("critic/loss" in metrics) == reads_critic
    assert any(not a.equal(b) for a, b in zip(start, learner.policy.model.parameters()))


def test_truncated_turn_form_bootstraps_from_the_critic_not_the_policy(bench, toy_model):
    cfg = config(toy_model, ["algo=ppo_critic", "advantage.ppo_critic_form=turn", "advantage.bootstrap_truncated=true"])
    needs = get_estimator(cfg.algo).needs(cfg.advantage)
    learner = load_learner(cfg, needs)
    torch.manual_seed(0)
    torch.nn.init.normal_(learner.critic.value_head.weight)  # a critic that says something
    episodes = bench.synthetic_episodes(small_shape(bench), learner.policy.n_policy_tokens, 1)
    episodes[1] = dataclasses.replace(episodes[1], terminated=False, truncated=True, final_prompt_ids=(5, 6, 7))

    values = bootstrap_values(learner.policy, learner.critic, episodes, needs, cfg.optim.micro_batch_tokens)
    probe = [TurnSample((5, 6, 7), (learner.policy.tokenizer.eos_token_id,))]
    from_critic = critic_readout(learner.critic, probe, learner.pad, 1024)[0, 0]
    assert values[1] == pytest.approx(float(from_critic)) and from_critic != 0
    assert float(policy_readout(learner.policy, probe, 1024).values[0]) == 0  # the policy's rows start at 0
    assert values[0] == 0 and values[2:].abs().sum() == 0
    learn(learner, episodes, cfg, Timer())  # and the loop takes it


def test_iteration_cost_core_times_both_algorithms_side_by_side(bench, toy_model):
    shape = bench.SyntheticShape(episodes=4, turns=2, prompt_tokens=16, response_tokens=4)
    result = bench.time_learners(toy_model, shape=shape, iterations=1, warmup=0)
    assert set(result) == {"boundary", "ppo_critic"}
    for algo, seconds in result.items():
        assert set(seconds) == {*ITERATION_STAGES, "iteration"}
        assert seconds["generation"] > 0 and seconds["env_wait"] == 0
        assert seconds["iteration"] == pytest.approx(sum(seconds[s] for s in ITERATION_STAGES))
    assert result["boundary"]["values"] == result["boundary"]["update_critic"] == 0
    assert result["ppo_critic"]["values"] > 0 and result["ppo_critic"]["update_critic"] > 0
    ratio = bench.ratios(result, "boundary", "ppo_critic")
    assert ratio["iteration"] == pytest.approx(result["boundary"]["iteration"] / result["ppo_critic"]["iteration"])
    assert ratio["update_critic"] == 0 and 0 < ratio["learner"]


def test_synthetic_episodes_have_the_asked_shape_and_groups(bench):
    shape = bench.SyntheticShape(episodes=8, turns=3, prompt_tokens=7, response_tokens=2, success_rate=0.25)
    episodes = bench.synthetic_episodes(shape, n_tokens=50, group_size=4)
    assert [e.task.group_id for e in episodes] == [0] * 4 + [1] * 4
    assert sum(e.won for e in episodes) == 2
    for e in episodes:
        assert len(e.turns) == 3 and e.terminated
        assert all(len(t.prompt_ids) == 7 and len(t.response_ids) == 2 for t in e.turns)
        assert all(0 <= i < 50 for t in e.turns for i in t.prompt_ids + t.response_ids)
        assert [t.reward for t in e.turns] == [0.0, 0.0, float(e.won)]
    with pytest.raises(ValueError, match="turns must be >= 1"):
        bench.SyntheticShape(turns=0)


@pytest.mark.parametrize("name", ["boundary", "ppo_critic-turn", "grpo"])
def test_an_update_makes_won_replies_likelier_and_lost_ones_less_likely(name, bench, toy_model):
    """The direction of learning, end to end through readout, advantages and the PPO step: on a fixed batch
    where half the episodes won, the won episodes' response tokens gain log-probability and the lost ones' lose."""
    cfg = config(toy_model, [*SETTINGS[name], "optim.epochs=4", "loss.entropy_coef=0.0"])
    learner = load_learner(cfg, get_estimator(cfg.algo).needs(cfg.advantage))
    episodes = bench.synthetic_episodes(small_shape(bench), learner.policy.n_policy_tokens, group_size_of(cfg))
    samples = [TurnSample(t.prompt_ids, t.response_ids) for e in episodes for t in e.turns]
    won = torch.tensor([e.won for e in episodes for _ in e.turns])

    def mean_log_prob() -> torch.Tensor:
        out = policy_readout(learner.policy, samples, 4096)
        return torch.where(out.response_mask, out.log_probs, 0.0).sum(dim=1) / out.response_mask.sum(dim=1)

    before = mean_log_prob()
    learn(learner, episodes, cfg, Timer())
    change = mean_log_prob() - before
    assert change[won].mean() > 0 > change[~won].mean(), change


def test_adam_eps_reaches_both_optimizers(toy_model):
    cfg = config(toy_model, ["algo=ppo_critic", "optim.adam_eps=1e-5"])
    learner = load_learner(cfg, get_estimator(cfg.algo).needs(cfg.advantage))
    groups = learner.optimizer.param_groups + learner.critic_optimizer.param_groups
    assert len(groups) >= 3 and all(group["eps"] == 1e-5 for group in groups)


@pytest.mark.parametrize("mask,valid", [(False, True), (True, True), (True, False)])
def test_valid_replies_cut_at_the_length_limit_leave_the_actor_loss_when_masked(mask, valid, bench, toy_model):
    """Every reply cut at max_new_tokens. With loss.mask_truncated_replies and every action parsed, the actor's loss
    (PPO, KL, entropy) has no token left, so GRPO (no value loss) leaves every weight exactly as it was. Without
    the option, or where the cut replies are format-invalid (their penalty must still push back), the policy moves."""
    cfg = config(toy_model, ["algo=grpo", f"loss.mask_truncated_replies={str(mask).lower()}"])
    learner = load_learner(cfg, get_estimator(cfg.algo).needs(cfg.advantage))
    episodes = bench.synthetic_episodes(small_shape(bench), learner.policy.n_policy_tokens, group_size_of(cfg))
    episodes = [dataclasses.replace(e, turns=[dataclasses.replace(t, truncated_reply=True, valid=valid)
                                              for t in e.turns]) for e in episodes]
    start = [p.detach().clone() for p in learner.policy.model.parameters()]
    metrics = learn(learner, episodes, cfg, Timer())
    assert metrics["rollout/cut_replies"] == 1.0
    unchanged = all(a.equal(b) for a, b in zip(start, learner.policy.model.parameters()))
    assert unchanged == (mask and valid)
