"""Expert episodes: the envs' own experts played through the env pool, or read from a JSONL export, and the
(prompt, expert reply) text and token samples they give, built exactly as the rollout builds its prompts.

Expert play follows `info["expert_action"]`, which ALFWorld, WebShop and the toy env all provide. SFT
(trainer_client/sft.py), the demo and the tiny-model tokenizer (trainer_client/tiny_model.py) learn from these.

With `mistake_rate` > 0, expert play makes a mistake at that share of its steps (DART-style noise) and the expert
replans from where the mistake led: the episodes then show recoveries, which clean expert play never does.
A mistake is, half the time, an action the game does not list in this state but listed in another room (what
a small model's wrong copies look like: "go to shelf 1" where there is no shelf; the game answers "Nothing
happens."), else a listed action other than the expert's. Mistakes stay in the prompts' history but are never
a reply to learn.
"""

from __future__ import annotations

import asyncio
import json
import random
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
    by_expert: bool = True   # False: an injected mistake (history only, not a reply to learn)


@dataclass(frozen=True)
class ExpertEpisode:
    env: str
    task_id: str
    category: str
    instruction: str
    turns: tuple[ExpertTurn, ...]
    won: bool


@dataclass(frozen=True)
class Mistakes:
    """How noisy expert play errs: at `rate` of its steps, half the time an action from `unlisted_pool`
    that the state does not list, else a listed action that is not the expert's."""
    rate: float
    unlisted_pool: tuple[str, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"the mistake rate must be in [0, 1), got {self.rate}")


# Noisy play may wander; past this many of its own steps an episode ends unfinished (the expert takes ~12).
NOISY_MAX_STEPS = 60


def choose_action(rng: random.Random, expert: str, listed: Sequence[str], mistakes: Mistakes | None) -> str:
    """The expert's action, or with probability `mistakes.rate` a mistake (see `Mistakes`)."""
    if mistakes is None or rng.random() >= mistakes.rate:
        return expert
    if rng.random() < 0.5 and mistakes.unlisted_pool:
        shown = set(listed)
        for _ in range(20):  # the pool is mostly other rooms' actions: a draw is rarely listed here
            action = rng.choice(mistakes.unlisted_pool)
            if action not in shown:
                return action
    others = [a for a in listed if a != expert]
    return rng.choice(others) if others else expert


async def play_expert(pool: EnvPool, env: str, split: str, task_id: str, seed: int = 0,
                      mistakes: Mistakes | None = None) -> ExpertEpisode:
    """Follow the env's own expert (`info["expert_action"]`) to the end of the episode, erring as `mistakes`
    says (seeded by the mistake seed and the task: the same episode every time)."""
    rng = random.Random(f"{mistakes.seed if mistakes else 0}/{task_id}")
    turns = []
    async with await pool.open(env, split, task_id, seed=seed) as episode:
        t = episode.first
        while not t.done and (mistakes is None or len(turns) < NOISY_MAX_STEPS):
            expert = t.info.get("expert_action")
            if not expert:
                if mistakes is not None:   # a mistake can leave the expert without a plan: end the episode there
                    break
                raise ValueError(f"{env} gave no expert_action at step {t.step_index} of task {task_id}")
            action = choose_action(rng, expert, t.admissible_actions, mistakes)
            turns.append(ExpertTurn(t.observation, tuple(t.admissible_actions), action, action == expert))
            t = await episode.step(action)
        first = episode.first
        return ExpertEpisode(env, task_id, first.task_category, first.instruction, tuple(turns), t.won)


async def expert_episodes(pool: EnvPool, env: str, split: str, task_ids: Sequence[str], seed: int = 0,
                          concurrency: int = 16, mistake_rate: float = 0.0) -> list[ExpertEpisode]:
    """Expert play of every task (infrastructure failures are skipped and reported, not hidden).

    With `mistake_rate` > 0, the tasks are played twice: cleanly, for the pool of actions their rooms list,
    then with mistakes drawn from it (see `Mistakes`); the noisy episodes are returned.
    """
    limit = asyncio.Semaphore(concurrency)

    async def play_all(mistakes: Mistakes | None) -> list[ExpertEpisode]:
        async def one(task_id: str) -> ExpertEpisode | None:
            async with limit:
                try:
                    return await play_expert(pool, env, split, task_id, seed, mistakes)
                except EnvPoolError as error:
                    print(f"expert episode {task_id} dropped: {error}", file=sys.stderr)
                    return None

        return [e for e in await asyncio.gather(*(one(t) for t in task_ids)) if e is not None]

    clean = await play_all(None)
    if mistake_rate <= 0:
        return clean
    listed = sorted({a for e in clean for turn in e.turns for a in turn.admissible_actions})
    return await play_all(Mistakes(mistake_rate, tuple(listed), seed))


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
    """(user prompt, expert reply) per expert turn, built exactly as the rollout builds its prompts; an
    injected mistake is only history."""
    for e in episodes:
        history: list[PastTurn] = []
        for step, turn in enumerate(e.turns):
            if turn.by_expert:
                yield (build_prompt(e.env, e.instruction, turn.observation, turn.admissible_actions, history, step,
                                    prompts), expert_reply(turn.action, think=prompts.require_think))
            history.append(PastTurn(turn.observation, turn.action))


def expert_samples(tokenizer, episodes: Iterable[ExpertEpisode], prompts: PromptConfig) -> list[TurnSample]:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [TurnSample(encode_prompt(tokenizer, user), tuple(tokenizer.encode(reply, add_special_tokens=False)) + (end,))
            for user, reply in expert_texts(episodes, prompts)]
