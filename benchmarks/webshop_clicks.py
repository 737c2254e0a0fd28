"""Where a WebShop checkpoint's clicks go: on each kind of page, how many of its actions were on the list of
clickables the prompt showed, and how its episodes ended.

    python benchmarks/webshop_clicks.py --checkpoint runs/demo_webshop/sft [--goals 40] \
        [--config configs/demo_webshop.yaml] [key=value ...]

Plays the first `--goals` goals of the eval split exactly as the demo's held-out evaluation does (its env
server, prompt, turn limit, evaluation temperature and per-episode seeds), and prints one JSON line: per page
kind the actions that were listed and unlisted (a click on something the page does not show does nothing),
how many results-page actions opened the page's first product (the search ranks the goal's own product first
for most goals), then bought (episodes that ended in a purchase), won and the score (mean purchase reward x 100,
0 without a purchase). A `search[...]` counts as listed: WebShop accepts it on every page.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer

from benchlib import add_demo_config_args, held_out_episodes, load_demo_config
from trainer_client.prompts import listed_actions

DEFAULT_CONFIG = "configs/demo_webshop.yaml"
NAVIGATION = {"click[back to search]", "click[next >]", "click[< prev]"}


def page_kind(listed: Sequence[str]) -> str:
    """The kind of WebShop page whose clickables the prompt listed: start (a search box), item (it can be
    bought), results (products to open), other (a description, features or reviews page; a results page
    with no hit)."""
    if "search[<your query>]" in listed:
        return "start"
    if "click[buy now]" in listed:
        return "item"
    return "results" if set(listed) - NAVIGATION else "other"


def click_counts(episodes, tokenizer) -> dict:
    counts: Counter = Counter()
    score = 0.0
    for episode in episodes:
        for turn in episode.turns:
            listed = listed_actions(tokenizer.decode(turn.prompt_ids))
            on_list = turn.action in listed or turn.action.startswith("search[")
            kind = page_kind(listed)
            counts[f"{kind}/{'listed' if on_list else 'unlisted'}"] += 1
            if kind == "results":
                products = [a for a in listed if a not in NAVIGATION]
                counts["results/first_product"] += int(turn.action == products[0])
        counts["bought"] += int(episode.terminated)
        counts["won"] += int(episode.won)
        score += episode.score
    return {"goals": len(episodes), **dict(sorted(counts.items())), "score": 100 * score / max(1, len(episodes))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a policy checkpoint (runs/demo_webshop/sft)")
    parser.add_argument("--goals", type=int, default=40, help="the first N goals the demo evaluates")
    add_demo_config_args(parser, DEFAULT_CONFIG)
    args = parser.parse_intermixed_args(argv)
    cfg = load_demo_config(parser, args)
    if cfg.env != "webshop":
        parser.error(f"this config's env is {cfg.env!r}; webshop_clicks plays WebShop")
    result = asyncio.run(held_out_episodes(cfg, args.checkpoint, cfg.eval_split, args.goals, cfg.rl.eval_temperature))
    episodes = [e for e in result.episodes if e.ok]
    report = click_counts(episodes, AutoTokenizer.from_pretrained(args.checkpoint))
    print(json.dumps({"checkpoint": str(args.checkpoint), **report, "dropped": result.dropped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
