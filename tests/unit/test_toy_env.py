"""The toy env: an episode is never won before the agent does the right thing."""

from __future__ import annotations

from env_server.envs.toy import ToyEnv


def test_no_episode_is_won_by_a_reply_that_is_not_an_action():
    env = ToyEnv()
    for split, tasks in env.splits().items():
        for task in tasks.playable:
            for seed in range(5):
                env.reset(split, task.task_id, seed=seed)
                result = env.step("<<junk>>")
                assert not result.won, (split, task.task_id, seed)
