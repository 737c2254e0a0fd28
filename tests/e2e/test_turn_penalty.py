"""The unlisted-action penalty reaches each turn of a real rollout: a real toy env server, replies that are
sometimes on the prompt's admissible list and sometimes not."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from training_fixtures import bench, toy_model, toy_server  # noqa: F401  (pytest fixtures)
from transformers import AutoTokenizer

from trainer_client.env_pool import EnvPool
from trainer_client.policy.generation.base import Completion, GenerationBackend, SamplingConfig
from trainer_client.prompts import PromptConfig, expert_reply, listed_actions
from trainer_client.rollout import RolloutConfig, TaskRef, collect

OFF_LIST = "jump over the moon"


class AlternatingBackend(GenerationBackend):
    """No model: a listed action when the prompt's length is even, an action no toy room lists when it is odd."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        replies = [expert_reply(listed_actions(self.tokenizer.decode(list(p)))[0] if len(p) % 2 == 0 else OFF_LIST)
                   for p in prompts]
        ids = [(*self.tokenizer.encode(r, add_special_tokens=False), self.tokenizer.eos_token_id) for r in replies]
        return [Completion(t, (0.0,) * len(t), "stop") for t in ids]

    def update_weights(self, policy) -> None:
        """Nothing to update."""


def test_a_turn_pays_the_unlisted_penalty_exactly_when_its_action_was_not_listed(toy_model, toy_server):
    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    tasks = [TaskRef("toy", "train", f"fetch-{i:03d}", seed=i) for i in range(6)]
    prompts = PromptConfig(unlisted_penalty=0.5)

    async def play():
        async with EnvPool([toy_server]) as pool:
            return await collect(pool, AlternatingBackend(tokenizer), tokenizer, tasks,
                                 RolloutConfig(max_turns=6, batch_wait_s=0), prompts)

    episodes, _ = asyncio.run(play())
    turns = [turn for episode in episodes for turn in episode.turns]
    unlisted = [turn.action not in listed_actions(tokenizer.decode(list(turn.prompt_ids))) for turn in turns]
    assert any(unlisted) and not all(unlisted)
    assert [turn.penalty for turn in turns] == [0.5 if off else 0.0 for off in unlisted]
