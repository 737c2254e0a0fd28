"""Expert episodes: the envs' own experts played through the env pool, or read from a JSONL export, and the
(prompt, expert reply) text and token samples they give, built exactly as the rollout builds its prompts.

Expert play follows `info["expert_action"]`, which ALFWorld, WebShop and the toy env all provide. SFT
(trainer_client/sft.py), the demo and the tiny-model tokenizer (trainer_client/cli.py) learn from these.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer_client.env_pool import EnvPool, EnvPoolError
from trainer_client.policy import TurnSample
from trainer_client.prompts import PastTurn, PromptConfig, build_prompt, expert_reply
from trainer_client.rollout import encode_prompt


@dataclass(frozen=True)
class ExpertTurn:
    observation: str
    admissible_actions: tuple[str, ...]
    action: str


@dataclass(frozen=True)
class ExpertEpisode:
    env: str
    task_id: str
    category: str
    instruction: str
    turns: tuple[ExpertTurn, ...]
    won: bool


async def play_expert(pool: EnvPool, env: str, split: str, task_id: str, seed: int = 0) -> ExpertEpisode:
    """Follow the env's own expert (`info["expert_action"]`) to the end of the episode."""
    turns = []
    async with await pool.open(env, split, task_id, seed=seed) as episode:
        t = episode.first
        while not t.done:
            action = t.info.get("expert_action")
            if not action:
                raise ValueError(f"{env} gave no expert_action at step {t.step_index} of task {task_id}")
            turns.append(ExpertTurn(t.observation, tuple(t.admissible_actions), action))
            t = await episode.step(action)
        first = episode.first
        return ExpertEpisode(env, task_id, first.task_category, first.instruction, tuple(turns), t.won)


async def expert_episodes(pool: EnvPool, env: str, split: str, task_ids: Sequence[str], seed: int = 0,
                          concurrency: int = 16) -> list[ExpertEpisode]:
    """Expert play of every task (infrastructure failures are skipped and reported, not hidden)."""
    limit = asyncio.Semaphore(concurrency)

    async def one(task_id: str) -> ExpertEpisode | None:
        async with limit:
            try:
                return await play_expert(pool, env, split, task_id, seed)
            except EnvPoolError as error:
                print(f"expert episode {task_id} dropped: {error}", file=sys.stderr)
                return None

    return [e for e in await asyncio.gather(*(one(t) for t in task_ids)) if e is not None]


def read_jsonl(path: str | Path) -> list[ExpertEpisode]:
    """Episodes exported as JSONL: {env, task_id, category, instruction, won, turns: [{observation,
    admissible_actions, expert_action}]} per line (ALFWorld's expert_export writes these fields)."""
    episodes = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            turns = tuple(ExpertTurn(t["observation"], tuple(t["admissible_actions"]), t["expert_action"])
                          for t in r["turns"])
            episodes.append(ExpertEpisode(r.get("env", "alfworld"), r["task_id"], r.get("category", ""),
                                          r["instruction"], turns, bool(r.get("won", True))))
    return episodes


def expert_texts(episodes: Iterable[ExpertEpisode], prompts: PromptConfig) -> Iterable[tuple[str, str]]:
    """(user prompt, expert reply) per turn, built exactly as the rollout builds its prompts."""
    for e in episodes:
        history: list[PastTurn] = []
        for step, turn in enumerate(e.turns):
            yield (build_prompt(e.env, e.instruction, turn.observation, turn.admissible_actions, history, step, prompts),
                   expert_reply(turn.action))
            history.append(PastTurn(turn.observation, turn.action))


def expert_samples(tokenizer, episodes: Iterable[ExpertEpisode], prompts: PromptConfig) -> list[TurnSample]:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [TurnSample(encode_prompt(tokenizer, user), tuple(tokenizer.encode(reply, add_special_tokens=False)) + (end,))
            for user, reply in expert_texts(episodes, prompts)]
