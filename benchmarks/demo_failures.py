"""How a checkpoint fails on generated ALFWorld games, and which way a plain return signal points.

    python benchmarks/demo_failures.py --checkpoint runs/demo/sft [--split gen_test] [--episodes 60] \
        [--temperature 0.4] [--config configs/demo.yaml] [key=value ...]

Plays the games on the demo's env server (same arguments, PYTHONHASHSEED = seed) and prints one JSON line:
success, the share of actions the game rejected ("Nothing happens."), the share of actions that repeat the
previous one, how many lost episodes hold five or more rejected actions, and the share of actions (and of
rejected ones) that were not on the admissible list the turn's prompt showed. With --returns it also sums
Monte-Carlo advantages (discounted success return minus the batch mean, over the batch std) per kind of
action: the sign a critic-free policy gradient would give rejected and accepted actions. Issue 5 used it to
find why RL on the demo did not move held-out success.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer

from benchlib import add_demo_config_args, held_out_episodes, load_demo_config
from trainer_client.prompts import listed_actions
from trainer_client.rollout import EpisodeRecord

ROOT = Path(__file__).resolve().parents[1]
REJECTED = "Nothing happens"


def rejected_flags(episode: EpisodeRecord) -> list[bool | None]:
    """Per turn: did the game reject its action? The answer is the next turn's observation; None where there
    is none (the last turn of an episode cut by the turn limit; a won episode's last action was accepted)."""
    flags: list[bool | None] = [nxt.observation.startswith(REJECTED) for nxt in episode.turns[1:]]
    return flags + [False if episode.won else None] if episode.turns else []


def failure_stats(episodes: Sequence[EpisodeRecord], listed: Sequence[Sequence[bool]] | None = None,
                  ) -> dict[str, float]:
    """`listed`, per episode and turn: was the action on the list its prompt showed (adds two shares)."""
    turns = sum(len(e.turns) for e in episodes)
    rejected = sum(bool(f) for e in episodes for f in rejected_flags(e))
    repeats = sum(a.action == b.action for e in episodes for a, b in zip(e.turns, e.turns[1:]))
    lost = [e for e in episodes if not e.won]
    looping = sum(sum(bool(f) for f in rejected_flags(e)) >= 5 for e in lost)
    stats = {"episodes": len(episodes), "success": sum(e.won for e in episodes) / max(1, len(episodes)),
             "turns_per_episode": turns / max(1, len(episodes)), "rejected_share": rejected / max(1, turns),
             "repeat_share": repeats / max(1, turns), "lost": len(lost), "lost_with_5_rejected": looping}
    if listed is not None:
        pairs = [(on_list, flag) for e, row in zip(episodes, listed) for on_list, flag in zip(row, rejected_flags(e))]
        stats["unlisted_share"] = sum(not on_list for on_list, _ in pairs) / max(1, turns)
        stats["rejected_unlisted_share"] = (sum(bool(flag) and not on_list for on_list, flag in pairs)
                                            / max(1, rejected))
    return stats


def mc_advantages(episodes: Sequence[EpisodeRecord], gamma: float) -> list[list[float]]:
    """gamma^(turns left) for a win, 0 for a loss, z-scored over every turn of the batch."""
    returns = [[gamma ** (len(e.turns) - 1 - t) if e.won else 0.0 for t in range(len(e.turns))] for e in episodes]
    flat = [g for row in returns for g in row]
    mean, std = statistics.fmean(flat), statistics.stdev(flat) if len(flat) > 1 else 1.0
    return [[(g - mean) / (std or 1.0) for g in row] for row in returns]


def advantage_by_kind(episodes: Sequence[EpisodeRecord], gamma: float) -> dict[str, dict[str, float]]:
    """Sum and mean of the MC advantage over rejected and accepted actions, split by the episode's outcome."""
    kinds: dict[str, list[float]] = {}
    for episode, advantages in zip(episodes, mc_advantages(episodes, gamma)):
        for flag, advantage in zip(rejected_flags(episode), advantages):
            if flag is None:
                continue
            name = f"{'rejected' if flag else 'accepted'} ({'won' if episode.won else 'lost'})"
            kinds.setdefault(name, []).append(advantage)
    return {k: {"n": len(v), "sum": sum(v), "mean": statistics.fmean(v)} for k, v in sorted(kinds.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--split", default="", help="default: the demo's eval split")
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--temperature", type=float, default=0.4)
    parser.add_argument("--returns", action="store_true", help="also sum MC advantages per kind of action")
    add_demo_config_args(parser, str(ROOT / "configs" / "demo.yaml"))
    args = parser.parse_args(argv)
    cfg = load_demo_config(parser, args)
    result = asyncio.run(held_out_episodes(cfg, args.checkpoint, args.split or cfg.eval_split, args.episodes, args.temperature))
    records = [e for e in result.episodes if e.ok]
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    listed = [[t.action in listed_actions(tokenizer.decode(t.prompt_ids)) for t in e.turns] for e in records]
    report: dict = {"checkpoint": str(args.checkpoint), "temperature": args.temperature,
                    **failure_stats(records, listed), "dropped": result.dropped}
    if args.returns:
        report["mc_advantage"] = advantage_by_kind(records, cfg.rl.advantage.gamma)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
