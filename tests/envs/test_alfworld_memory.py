"""Memory of one worker process over many resets: flat with pooled engines; the per-reset engine leak
(every new PddlEnv maps its own libdownward copy, docs/DESIGN.md#alfworld-libdownward-per-pddlenv) shown as the control."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from alfworld_fixtures import SLOW_TIMEOUT_S, generated_env, generated_options

# Runs in a fresh process, like a worker: resets cycling over every game of the splits, RSS sampled.
PROBE = """
import json, re, sys, psutil
from env_server.envs.alfworld import engine
from env_server.envs.alfworld.env import AlfWorldEnv
options, resets, fresh_engines = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "fresh"
env = AlfWorldEnv(**options)
episodes = [(split, t.task_id) for split in sorted(env.splits()) for t in env.splits()[split].playable]
rss = []
for i in range(resets):
    if fresh_engines:
        env._engine = engine.Engine()  # what a server building a new env per reset does
    session = AlfWorldEnv(**options) if not fresh_engines else env
    split, task_id = episodes[i % len(episodes)]
    result = session.reset(split, task_id, seed=i)
    session.step(result.info["expert_action"])
    if not fresh_engines:
        session.close()
    rss.append(psutil.Process().memory_info().rss / 2**20)
copies = set(re.findall(r"\S*libdownward\S*", open("/proc/self/maps").read()))
print(json.dumps({"rss_mib": rss, "libdownward_copies": len(copies)}))
"""


def probe(options: dict, resets: int, engines: str) -> dict:
    command = [sys.executable, "-c", PROBE, json.dumps(options), str(resets), engines]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=3600)
    return json.loads(done.stdout.splitlines()[-1])


def made_generated_options() -> dict:
    generated_env().splits()  # made here, so that the probe only plays
    return generated_options()


def official_or_generated_options() -> dict:
    data_dir = os.environ.get("ALFWORLD_DATA", "")
    return {"data_dir": data_dir} if data_dir else made_generated_options()


@pytest.mark.slow
@pytest.mark.timeout(SLOW_TIMEOUT_S)
def test_memory_stays_flat_over_500_resets_in_one_worker():
    seen = probe(official_or_generated_options(), 500, "pooled")
    rss = seen["rss_mib"]
    # Once the bounded caches are full (translations, interned facts), growth must stop.
    assert rss[-1] - rss[99] < 40, f"RSS grew from {rss[99]:.0f} MiB (reset 100) to {rss[-1]:.0f} MiB (reset 500)"
    assert seen["libdownward_copies"] == 1


@pytest.mark.slow
@pytest.mark.timeout(SLOW_TIMEOUT_S)
def test_a_new_engine_per_reset_maps_a_new_library_copy_which_is_why_engines_are_pooled():
    seen = probe(made_generated_options(), 60, "fresh")
    assert seen["libdownward_copies"] == 60  # one per engine, never unmapped
    assert seen["rss_mib"][-1] - seen["rss_mib"][9] > 40
