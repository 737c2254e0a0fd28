"""Expert trajectories of any env as JSONL, raw material for supervised warm starts (trainer_client/sft.py
builds prompts).

One record per episode, the expert playing every action:
    {"env", "split", "task_id", "category", "instruction", "seed", "won", "truncated", "length",
     "turns": [{"observation", "admissible_actions", "expert_action"}, ...], "final_observation"}
turns[i] is the state the i-th action was chosen in (turns[0] holds the game's opening text), and
expert_action is the action played. An episode ends when won, at the turn limit, or when the expert gives
up (won and truncated both false). Works for any split, official or generated, and any env that gives
info["expert_action"].

    python -m env_server.expert_export --split gen_train --out expert.jsonl [--n N] \
        [--seed S] [--max-turns T] [--env-option KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from env_server.config import parse_env_options
from env_server.envs.base import TextEnv, UnknownSplit
from env_server.registry import make

EXPERT_KEY = "expert_action"


def expert_episode(env: TextEnv, split: str, task_id: str, seed: int = 0, max_turns: int = 0) -> dict:
    """Play one episode with the env's expert and record it (max_turns 0: the env's default)."""
    result = env.reset(split, task_id, seed=seed, max_turns=max_turns)
    record = {"env": env.name, "split": split, "task_id": task_id, "category": result.task_category,
              "instruction": result.instruction, "seed": seed}
    turns = []
    while not result.done and EXPERT_KEY in result.info:
        action = result.info[EXPERT_KEY]
        turns.append({"observation": result.observation, "admissible_actions": result.admissible_actions,
                      "expert_action": action})
        result = env.step(action)
    return {**record, "won": result.won, "truncated": result.truncated, "length": len(turns),
            "turns": turns, "final_observation": result.observation}


def export(env: TextEnv, split: str, n: int = 0, seed: int = 0, max_turns: int = 0) -> Iterator[dict]:
    """Expert episodes on the first `n` playable tasks of `split` in id order (n 0: all of them)."""
    splits = env.splits()
    if split not in splits:
        raise UnknownSplit(f"{env.name}: no split {split!r}; splits are {sorted(splits)}")
    tasks = splits[split].playable
    for task in tasks[:n] if n else tasks:
        yield expert_episode(env, split, task.task_id, seed, max_turns)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", required=True)
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--n", type=int, default=0, help="episodes (0: every playable task of the split)")
    parser.add_argument("--seed", type=int, default=0, help="episode seed (the expert's random stream)")
    parser.add_argument("--max-turns", type=int, default=0, help="turn limit (0: the env's default)")
    parser.add_argument("--env", default="alfworld")
    parser.add_argument("--env-option", action="append", default=[], metavar="KEY=VALUE",
                        help="env constructor option, e.g. size=medium or data_dir=/data/alfworld (repeatable)")
    args = parser.parse_args(argv)
    options = parse_env_options(f"{args.env}.{item}" for item in args.env_option).get(args.env, {})
    env = make(args.env, **options)
    won, played = Counter(), Counter()
    try:
        with args.out.open("w") as out:
            for record in export(env, args.split, args.n, args.seed, args.max_turns):
                out.write(json.dumps(record) + "\n")
                played[record["category"]] += 1
                won[record["category"]] += record["won"]
    finally:
        env.close()
    for category in sorted(played):
        print(f"{category:8s} expert won {won[category]:4d} of {played[category]:4d}")
    print(f"{sum(played.values())} episodes -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
