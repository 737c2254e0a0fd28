"""Noisy expert play (DART-style) against a real toy env server: mistakes are made at the asked rate, the
expert recovers from them, the episodes are the same every time, and SFT never learns a mistake as a reply."""

from __future__ import annotations

import random

import pytest
import pytest_asyncio

from env_server.config import ServerConfig
from env_server.server import serve
from trainer_client.env_pool import EnvPool
from trainer_client.experts import Mistakes, choose_action, expert_episodes, expert_texts
from trainer_client.prompts import PromptConfig, expert_reply

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def toy():
    async with serve(ServerConfig(envs=("toy",), port=0, metrics_port=-1, workers=1)) as running:
        yield running


def test_a_mistake_is_unlisted_or_another_listed_action():
    listed = ["go to attic", "go to hall", "look"]
    mistakes = Mistakes(0.999, ("go to attic", "go to cellar", "take key"))
    rng = random.Random(0)
    drawn = [choose_action(rng, "go to attic", listed, mistakes) for _ in range(400)]
    assert "go to attic" not in drawn                                   # never the expert's action
    unlisted = [a for a in drawn if a not in listed]
    assert set(unlisted) == {"go to cellar", "take key"}                 # a pool action the state does not list
    assert 0.4 < len(unlisted) / len(drawn) < 0.6                        # half of the mistakes
    assert {a for a in drawn if a in listed} == {"go to hall", "look"}
    assert choose_action(rng, "go to attic", listed, None) == "go to attic"
    with pytest.raises(ValueError):
        Mistakes(1.0, ())


@pytest.mark.asyncio(loop_scope="module")
async def test_noisy_expert_play_recovers_and_is_reproducible(toy):
    async with EnvPool([toy.address]) as pool:
        task_ids = (await pool.list_tasks("toy", "train"))[:40]
        clean = await expert_episodes(pool, "toy", "train", task_ids, seed=0)
        noisy = await expert_episodes(pool, "toy", "train", task_ids, seed=0, mistake_rate=0.3)
        again = await expert_episodes(pool, "toy", "train", task_ids, seed=0, mistake_rate=0.3)
    assert noisy == again
    assert all(t.by_expert for e in clean for t in e.turns)
    turns = [t for e in noisy for t in e.turns]
    made = [t for t in turns if not t.by_expert]
    assert 0.15 < len(made) / len(turns) < 0.45
    assert any(t.action not in t.admissible_actions for t in made)      # some were unlisted
    assert sum(e.won for e in noisy) >= 0.9 * len(noisy)                # the expert recovered
    assert sum(len(e.turns) for e in noisy) > sum(len(e.turns) for e in clean)

    texts = list(expert_texts(noisy, PromptConfig()))
    assert len(texts) == len(turns) - len(made)                         # a mistake is never a reply to learn
    assert {reply for _, reply in texts} <= {expert_reply(t.action) for t in turns if t.by_expert}
    # ... but it stays in the history the next prompt shows.
    episode = next(e for e in noisy if any(not t.by_expert for t in e.turns[:-1]))
    step = next(i for i, t in enumerate(episode.turns[:-1]) if not t.by_expert)
    after = list(expert_texts([episode], PromptConfig()))
    prompt = after[sum(t.by_expert for t in episode.turns[:step + 1])][0]
    assert f"action: {episode.turns[step].action}" in prompt
