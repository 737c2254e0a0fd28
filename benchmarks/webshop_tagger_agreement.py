"""How far the heuristic noun tagger moves the WebShop reward away from spaCy's (en_core_web_sm).

Pairs: every goal against the target and the top-10 search results for its instruction (what a
policy would plausibly buy). Prints the agreement of noun lists, title scores, r_type and reward.

    WEBSHOP_DATA=DIR .venv/bin/python benchmarks/webshop_tagger_agreement.py
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from env_server.envs.webshop.reward import HeuristicNounTagger, SpacyNounTagger, compute_reward  # noqa: E402
from env_server.envs.webshop.world import WorldConfig, load_world  # noqa: E402

# The original's title_score unit-test pairs (goal name, purchased name, expected score).
UPSTREAM_TITLE_CASES = [
    ("Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
     "PEAK High Top Mens Basketball Shoes Lou Williams Streetball Master Breathable Non Slip Outdoor Sneakers", "~0.333"),
    ("Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar Home Theater System Subwoofer",
     "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System", "~0.3"),
    ("Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar",
     "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System", "~0.15"),
    ("Rusticware 921ORB Kitchen and Bath Cabinet Knob",
     "Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne Remover Portable Makeup Tweezers (Silver)", "<0.05"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=int, default=10, help="search results per goal to pair with it")
    parser.add_argument("--json", help="also write the agreement counts here")
    args = parser.parse_args()
    world = load_world(WorldConfig(pos_tagger="heuristic"))
    spacy_tagger, heuristic = SpacyNounTagger(), HeuristicNounTagger()

    print("upstream title_score cases (goal vs purchased): spacy / heuristic / expected")
    for goal_name, bought, expected in UPSTREAM_TITLE_CASES:
        scores = []
        for tagger in (spacy_tagger, heuristic):
            goal_nouns, bought_nouns = tagger.nouns(goal_name), tagger.nouns(bought)
            scores.append(len(set(goal_nouns) & set(bought_nouns)) / len(goal_nouns))
        print(f"  {scores[0]:.3f} / {scores[1]:.3f} / {expected}")

    titles = sorted({p.title for p in world.catalog.products})
    start = time.perf_counter()
    same_nouns = sum(spacy_tagger.nouns(t) == heuristic.nouns(t) for t in titles)
    print(f"\ntitles with identical noun lists: {same_nouns}/{len(titles)} ({100 * same_nouns / len(titles):.1f}%)"
          f"  [spaCy tagged {len(titles)} titles in {time.perf_counter() - start:.1f} s]")

    counts = {"pairs": 0, "title_score": 0, "r_type": 0, "reward": 0, "success": 0}
    for goal in world.goals:
        candidates = {goal.asin} | {p.asin for p in world.search(goal.instruction_text.lower())[: args.results]}
        for asin in candidates:
            chosen = {name: value for name, value in goal.goal_options} if asin == goal.asin else {}
            product, price = world.product(asin), world.catalog.prices[asin]
            by_spacy = compute_reward(product, goal, price, chosen, spacy_tagger)
            by_heuristic = compute_reward(product, goal, price, chosen, heuristic)
            counts["pairs"] += 1
            counts["title_score"] += by_spacy.title_score == by_heuristic.title_score
            counts["r_type"] += by_spacy.r_type == by_heuristic.r_type
            counts["reward"] += by_spacy.value == by_heuristic.value
            counts["success"] += (by_spacy.value == 1.0) == (by_heuristic.value == 1.0)
    pairs = counts.pop("pairs")
    print(f"goal-product pairs: {pairs} ({len(world.goals)} goals x target + top-{args.results} results)")
    for name, agree in counts.items():
        print(f"  equal {name:12s}: {agree}/{pairs} ({100 * agree / pairs:.2f}%)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "titles": len(titles), "same_noun_lists": same_nouns, "pairs": pairs, "goals": len(world.goals),
            "results_per_goal": args.results, "equal": counts}, indent=2))


if __name__ == "__main__":
    main()
