"""`rollout.stop` reaches the sampler in a real rollout: through a real toy env server, every reply ends at the
first stop string it completes (the random micro model writes letters often enough to hit single-letter stops)."""

from __future__ import annotations

import asyncio

from training_fixtures import bench, toy_model, toy_server  # noqa: F401  (pytest fixtures)

from trainer_client.env_pool import EnvPool
from trainer_client.policy import Policy, TransformersBackend
from trainer_client.prompts import PromptConfig
from trainer_client.rollout import RolloutConfig, TaskRef, collect


def test_every_reply_ends_at_its_first_stop_string(toy_model, toy_server):
    policy = Policy.load(toy_model)
    backend = TransformersBackend.from_policy(policy)
    stops = tuple("aeiost")
    tasks = [TaskRef("toy", "train", f"fetch-{3 * i + 1:03d}", seed=i, group_id=i) for i in range(6)]

    async def play(rollout: RolloutConfig):
        async with EnvPool([toy_server]) as pool:
            episodes, _ = await collect(pool, backend, policy.tokenizer, tasks, rollout, PromptConfig(), seed=0)
        return [turn for episode in episodes for turn in episode.turns]

    def text(ids) -> str:
        return policy.tokenizer.decode(ids, skip_special_tokens=False)

    turns = asyncio.run(play(RolloutConfig(max_new_tokens=12, max_turns=3, stop=stops)))
    ended_by_stop = 0
    for turn in turns:
        assert not any(s in text(turn.response_ids[:-1]) for s in stops)   # nothing sampled past a stop
        ended_by_stop += any(s in text(turn.response_ids) for s in stops)
        if turn.truncated_reply:   # cut at the length limit only where no stop string was reached
            assert len(turn.response_ids) == 12 and not any(s in text(turn.response_ids) for s in stops)
    assert ended_by_stop >= len(turns) // 2
    free = asyncio.run(play(RolloutConfig(max_new_tokens=12, max_turns=3)))
    assert sum(len(t.response_ids) for t in free) > sum(len(t.response_ids) for t in turns)
