"""Chaos (issue 8 "Must show"): three env servers, a seeded killer SIGKILLs one every few seconds and starts
it again on its port, and a 32-episode rollout, then a 32-episode training iteration, run through it.

Each is first played without the killer, on the same servers with the same seeds, and then with it: every
episode must finish (replayed where its server died) or be counted as dropped, and every finished one must
equal its uninterrupted twin turn for turn, so no infrastructure failure is ever scored as a 0.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import AutoTokenizer

from chaos_kit import Killer, ScriptedBackend, until
from env_server.envs.toy import ToyEnv
from trainer_client import config
from trainer_client.env_pool import EnvPool
from trainer_client.prompts import PromptConfig
from trainer_client.rollout import EpisodeRecord, RolloutConfig, TaskRef, collect
from trainer_client.train import train
from trainer_client.train_config import TrainConfig

pytestmark = pytest.mark.slow

EPISODES = 32
# Quick load polls and placement retries, so a restarted server is seen again within a second or two.
QUICK = dict(load_poll_interval_s=0.1, resolve_interval_s=0.1, retry_initial_backoff_s=0.01,
             retry_max_backoff_s=0.05)


def outcome(record: EpisodeRecord) -> tuple:
    """Everything the env and the policy decided; not where it ran or how often it was replayed."""
    return (record.turns, record.terminated, record.truncated, record.won, record.score, record.final_prompt_ids,
            record.category, record.instruction, record.version)


def report(name: str, killer: Killer, **numbers) -> None:
    mid_rollout = sum(kill.live_sessions > 0 for kill in killer.kills)
    print(f"\nchaos {name}: {len(killer.kills)} kills ({mid_rollout} of servers holding sessions); "
          + ", ".join(f"{key} {value}" for key, value in numbers.items()))


async def test_a_rollout_of_32_episodes_survives_the_killer(cluster, toy_checkpoint):
    addresses = [server.address for server in cluster]
    tokenizer = AutoTokenizer.from_pretrained(toy_checkpoint)
    backend = ScriptedBackend(tokenizer, latency_s=0.5)
    tasks = [TaskRef("toy", "train", task.task_id, seed=index)
             for index, task in enumerate(ToyEnv().splits()["train"].tasks[:EPISODES])]
    rollout, prompts = RolloutConfig(max_new_tokens=64, batch_wait_s=0), PromptConfig()

    async with EnvPool(addresses, **QUICK) as pool:
        calm, _ = await collect(pool, backend, tokenizer, tasks, rollout, prompts)
    assert all(record.ok for record in calm)

    async with EnvPool(addresses, **QUICK) as pool:
        async with Killer(cluster, seed=8, interval_s=(1.0, 2.0)) as killer:
            stormy, _ = await collect(pool, backend, tokenizer, tasks, rollout, prompts)
        stats = pool.stats
        # The restarted servers rejoin: the pool reaches all three again, and new episodes land on each.
        await until(lambda: all(state.endswith(" sessions") for state in pool.servers.values()),
                    timeout_s=2 * pool.config.max_reconnect_backoff_s + 5)
        later = [await pool.open("toy", "train", task.task_id) for task in tasks[:9]]
        assert {episode.server for episode in later} == set(addresses)
        for episode in later:
            await episode.close()

    finished = [record for record in stormy if record.ok]
    dropped = [record for record in stormy if record.dropped]
    report("rollout", killer, replays=sum(r.replays for r in stormy),
           episodes_replayed=sum(r.replays > 0 for r in stormy),
           dropped=len(dropped), pool=stats)
    assert len(finished) + len(dropped) == EPISODES == len(stormy)
    assert stats.dropped == len(dropped)
    assert len(killer.kills) >= 2 and any(record.replays for record in finished), "the killer hit live episodes"
    for record, twin in zip(stormy, calm):
        if record.ok:
            assert outcome(record) == outcome(twin), f"episode {record.task} differs from its uninterrupted twin"


async def test_a_training_iteration_of_32_episodes_survives_the_killer(cluster, toy_checkpoint, tmp_path):
    base = config.load(TrainConfig, None, [
        f"model.path={toy_checkpoint}", "env.name=toy", f"env.servers=[{','.join(s.address for s in cluster)}]",
        "iterations=1", f"episodes_per_iteration={EPISODES}", "save_every=0", "loss.kl_coef=0",
        "rollout.max_new_tokens=24", "rollout.batch_wait_s=0", "prompt.history_turns=1"])
    calm_dir = await train(dataclasses.replace(base, run_dir=str(tmp_path / "calm")))
    async with Killer(cluster, seed=9, interval_s=(0.3, 0.8)) as killer:
        stormy_dir = await train(dataclasses.replace(base, run_dir=str(tmp_path / "stormy")))

    (calm,) = [json.loads(line) for line in (calm_dir / "metrics.jsonl").read_text().splitlines()]
    (stormy,) = [json.loads(line) for line in (stormy_dir / "metrics.jsonl").read_text().splitlines()]
    report("train iteration", killer, replays=stormy["rollout/replays"], dropped=stormy["rollout/dropped"],
           rollout_s=round(stormy["time/rollout"], 1), iteration_s=round(stormy["time/iteration"], 1),
           success=stormy["rollout/success"])
    assert stormy["rollout/episodes"] + stormy["rollout/dropped"] == EPISODES
    assert stormy["rollout/replays"] >= 1, "the killer hit live episodes"
    # With one server down at a time and three replays allowed per step, no episode should be lost; and
    # with lock-step batches (batch_wait_s=0) the iteration then samples, scores and learns exactly as the
    # uninterrupted one did.
    assert stormy["rollout/dropped"] == 0
    deterministic = {key for key in calm if not key.startswith("time/") and key != "rollout/replays"}
    assert {key: stormy[key] for key in deterministic} == {key: calm[key] for key in deterministic}
