"""Shared set-up of the alfworld tests: small generated games every machine can make, the official data
where this machine has it, and upstream AlfredTWEnv play in a clean subprocess for byte comparisons."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from env_server.envs.alfworld.env import AlfWorldEnv
from env_server.envs.alfworld.games import SPLIT_ROOT
from env_server.envs.base import StepResult

# Two games per task type in gen_train, one in gen_test: ~10 s to generate, once per test process.
GENERATED = dict(gen_train_games=12, gen_test_games=6, gen_seed=0, size="small")
UPSTREAM_TIMEOUT_S = 3600
UPSTREAM_PLAYER = Path(__file__).parent / "upstream" / "alfworld_play.py"  # run as a script, in its own process
SLOW_TIMEOUT_S = 3 * 3600  # the slow runs play hundreds of official games on a shared 2-core machine


@functools.cache
def generated_cache_dir() -> str:
    path = tempfile.mkdtemp(prefix="limen-alfworld-tests-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def generated_env(**overrides) -> AlfWorldEnv:
    """An env on the small generated splits only, whatever ALFWORLD_DATA says."""
    return AlfWorldEnv(**{"data_dir": "", "generated": True, "cache_dir": generated_cache_dir(), **GENERATED, **overrides})


def generated_options() -> dict:
    """The same env's options, for a server's env_options."""
    return {"data_dir": "", "generated": True, "cache_dir": generated_cache_dir(), **GENERATED}


def official_data_dir() -> str:
    data_dir = os.environ.get("ALFWORLD_DATA", "")
    if not (data_dir and (Path(data_dir) / SPLIT_ROOT).is_dir()):
        pytest.skip("needs the official ALFWorld games: set ALFWORLD_DATA (see docs/DATA.md)")
    return data_dir


def one_task_per_category(env: AlfWorldEnv, split: str) -> list[str]:
    firsts: dict[str, str] = {}
    for task in env.splits()[split].playable:
        firsts.setdefault(task.category, task.task_id)
    return [firsts[category] for category in sorted(firsts)]


def upstream_records(game_files: list[Path], policy: str, seed: int, max_steps: int) -> dict[Path, dict]:
    """Transcripts of upstream AlfredTWEnv playing the games, by game file, from processes with no limen patch.

    The games are shared out over one process per core: upstream seeds each game on its own, so the split
    changes no transcript, only the wall time (the 274 eval games take upstream ~45 CPU-minutes)."""
    chunks = [game_files[i::os.cpu_count() or 1] for i in range(min(len(game_files), os.cpu_count() or 1))]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"upstream.{i}.jsonl" for i in range(len(chunks))]
        logs = [out.with_suffix(".log") for out in outs]
        players = []
        for chunk, out, log in zip(chunks, outs, logs):
            with log.open("wb") as stderr:   # a file, not a pipe: a chatty player must never block on it
                players.append(subprocess.Popen(
                    [sys.executable, str(UPSTREAM_PLAYER), *map(str, chunk), "--policy", policy,
                     "--seed", str(seed), "--max-steps", str(max_steps), "--out", str(out)],
                    stdout=subprocess.DEVNULL, stderr=stderr))
        for player, log in zip(players, logs):
            if player.wait(timeout=UPSTREAM_TIMEOUT_S):
                raise RuntimeError(f"upstream play failed ({player.returncode}): {log.read_text()[-2000:]}")
        records = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    return {Path(record["game_file"]): record for record in records}


def as_upstream(result: StepResult) -> dict:
    """Our transition in the fields of an upstream transcript (help is the one command we do not list)."""
    return {"observation": result.observation, "admissible_actions": sorted(result.admissible_actions + ["help"]),
            "score": result.reward, "done": result.done, "won": result.won,
            "expert_action": result.info.get("expert_action")}


def replay_against_upstream(env: AlfWorldEnv, split: str, task_id: str, record: dict, seed: int, max_turns: int) -> int:
    """Play the upstream record's actions through `env`; assert every transition equal. Returns steps played."""
    first = as_upstream(env.reset(split, task_id, seed=seed, max_turns=max_turns))
    expected = dict(record["first"])
    if expected["won"]:
        expected["expert_action"] = None  # limen stops advising once the game is won
    assert first == expected, f"{task_id}: reset differs"
    for index, step in enumerate(record["steps"], start=1):
        expected = {key: step[key] for key in first}
        if expected["won"]:
            expected["expert_action"] = None
        assert as_upstream(env.step(step["action"])) == expected, f"{task_id}: step {index} ({step['action']!r}) differs"
    return len(record["steps"])
