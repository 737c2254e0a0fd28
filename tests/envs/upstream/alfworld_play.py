"""Play games through unmodified upstream ALFWorld (AlfredTWEnv), the reference limen's env is held to.

Run it in its own process: it must not share a process with limen's alfworld speed.install(), whose
patches it would inherit. Tests (tests/envs/alfworld_fixtures.py) compare its transcripts with limen's
byte for byte; benchmarks/alfworld_speed.py times it. It imports nothing from limen.

    python tests/envs/upstream/alfworld_play.py GAME_FILE... --policy mixed --out transcript.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

POLICIES = ("expert", "random", "mixed")
# In "mixed" play, how often the expert's action is taken instead of a random admissible one: often
# enough that episodes reach wins, rarely enough that they wander off the expert's path.
MIXED_EXPERT_PROB = 0.6


@dataclass(frozen=True)
class PlayConfig:
    policy: str = "mixed"
    seed: int = 0
    max_steps: int = 50

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


def choose_action(policy: str, rng: random.Random, admissible: Sequence[str], expert_action: str | None) -> str:
    """The next action of a scripted player. `rng` is the player's own stream, never the global one."""
    if policy == "expert" or (policy == "mixed" and rng.random() < MIXED_EXPERT_PROB):
        if expert_action is not None:
            return expert_action
    return rng.choice(sorted(admissible))


def upstream_config(data_path: str, max_steps: int) -> dict:
    """The AlfredTWEnv config under which upstream computes its expert: train mode, dagger, handcoded."""
    return {
        "dataset": {"data_path": data_path, "eval_id_data_path": data_path, "eval_ood_data_path": data_path,
                    "num_train_games": -1, "num_eval_games": -1},
        "env": {"type": "AlfredTWEnv", "task_types": [1, 2, 3, 4, 5, 6], "domain_randomization": False,
                "expert_type": "handcoded", "goal_desc_human_anns_prob": 0.0, "expert_timeout_steps": 150},
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": max_steps}},
    }


def play(game_files: Sequence[Path], config: PlayConfig) -> Iterator[dict]:
    """One record per game, in the order upstream's game cycle visits them (each game once).

    Before a game's first step, the global random (which the expert draws from) is seeded with
    `config.seed`, as limen seeds each episode's expert; the player draws from Random(config.seed + 1).
    """
    # Without ALFWORLD_DATA, importing alfworld would create ~/.cache/alfworld; the games are passed in.
    os.environ.setdefault("ALFWORLD_DATA", tempfile.gettempdir())
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    # A folder holding one game keeps AlfredTWEnv's own scan short; the games to play are set after it.
    tw = AlfredTWEnv(upstream_config(str(game_files[0].parent), config.max_steps), train_eval="train")
    tw.game_files = [str(path) for path in game_files]
    env = tw.init_env(batch_size=1)
    try:
        for _ in game_files:
            yield _play_one(env, config)
    finally:
        env.close()


def _play_one(env, config: PlayConfig) -> dict:
    started, started_cpu = time.perf_counter(), time.process_time()
    obs, infos = env.reset()
    reset_s, reset_cpu_s = time.perf_counter() - started, time.process_time() - started_cpu
    random.seed(config.seed)
    rng = random.Random(config.seed + 1)
    # Wall and CPU time of each call: on a shared machine the CPU time is the steadier measure of the work.
    record = {"game_file": infos["extra.gamefile"][0], "reset_s": reset_s, "reset_cpu_s": reset_cpu_s,
              "steps": [], "step_s": [], "step_cpu_s": []}
    record["first"] = _transition(obs[0], infos, 0.0, False)
    done = False
    while not done:
        expert = infos["extra.expert_plan"][0]
        action = choose_action(config.policy, rng, infos["admissible_commands"][0], expert[0] if expert else None)
        started, started_cpu = time.perf_counter(), time.process_time()
        obs, scores, dones, infos = env.step([action])
        record["step_s"].append(time.perf_counter() - started)
        record["step_cpu_s"].append(time.process_time() - started_cpu)
        done = bool(dones[0])
        record["steps"].append({"action": action, **_transition(obs[0], infos, float(scores[0]), done)})
    return record


def _transition(observation: str, infos: dict, score: float, done: bool) -> dict:
    expert = infos["extra.expert_plan"][0]
    return {
        "observation": observation,
        "admissible_actions": list(infos["admissible_commands"][0]),
        "score": score,
        "done": done,
        "won": bool(infos["won"][0]),
        "expert_action": expert[0] if expert else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("games", nargs="*", type=Path, help="game.tw-pddl files")
    parser.add_argument("--games-from", type=Path, help="a file listing game.tw-pddl paths, one a line")
    parser.add_argument("--policy", choices=POLICIES, default="mixed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True, help="JSONL transcript, one record per game")
    args = parser.parse_args(argv)
    games = list(args.games)
    if args.games_from:
        games += [Path(line) for line in args.games_from.read_text().split() if line]
    if not games:
        parser.error("no games given")
    config = PlayConfig(args.policy, args.seed, args.max_steps)
    with args.out.open("w") as out:
        for record in play(games, config):
            out.write(json.dumps(record) + "\n")
            out.flush()
    print(f"played {len(games)} games -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
