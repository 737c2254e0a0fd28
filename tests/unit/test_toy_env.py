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


def test_the_expert_acts_only_on_what_the_agent_sees():
    """Its action is a function of the instruction, the observation and the admissible actions (plus
    what the agent carries), so imitating it is learnable: two states that look alike get the same advice."""
    env = ToyEnv()
    advice: dict[tuple, str] = {}
    for split, tasks in env.splits().items():
        for task in tasks.playable:
            for seed in range(3):
                result = env.reset(split, task.task_id, seed=seed)
                carried = ""
                while not result.done and "expert_action" in result.info:
                    seen = (result.instruction, result.observation, frozenset(result.admissible_actions), carried)
                    assert advice.setdefault(seen, result.info["expert_action"]) == result.info["expert_action"], seen
                    action = result.info["expert_action"]
                    carried = action[5:] if action.startswith("take ") else "" if action.startswith("drop ") else carried
                    result = env.step(action)
