"""The lock-step loop that benchmarks/rollout_overlap.py compares our rollout against plays real episodes to
their end through a real toy env server: one generation call per turn for every live episode."""

from __future__ import annotations

import asyncio
from pathlib import Path

from training_fixtures import bench, load_benchmark, toy_model, toy_server  # noqa: F401  (pytest fixtures)

from trainer_client.env_pool import EnvPool
from trainer_client.policy import Policy, TransformersBackend
from trainer_client.prompts import PromptConfig
from trainer_client.rollout import RolloutConfig, TaskRef

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_lockstep_baseline_steps_every_live_episode_each_turn(toy_model, toy_server):
    overlap = load_benchmark(BENCHMARKS / "rollout_overlap.py")
    policy = Policy.load(toy_model)
    # Never stops early: every reply is max_new_tokens long, and never a valid action, so no episode is won
    # before the turn limit (a fetch task needs at least three moves).
    never_stops = TransformersBackend(policy.model, policy.n_policy_tokens, stop_ids=(), pad_id=0)
    tasks = [TaskRef("toy", "train", f"fetch-{3 * i + 1:03d}", seed=i, group_id=i) for i in range(4)]
    rollout = RolloutConfig(max_new_tokens=4, max_turns=3)

    async def play():
        async with EnvPool([toy_server]) as pool:
            return await overlap.lockstep_collect(pool, never_stops, policy.tokenizer, tasks, rollout, PromptConfig())

    times = asyncio.run(play())
    assert times.generation_calls == 3 and times.generated_tokens == 4 * 3 * 4
    assert 0 < times.generation_s < times.wall_s and times.env_wait_s > 0
    assert 0 < overlap.env_wait_share(times) < 1
