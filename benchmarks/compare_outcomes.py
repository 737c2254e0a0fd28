"""Two evaluations' outcome files (`outcomes/*.jsonl` rows: split, task_id, seed, won), paired on the (game, eval seed)
episodes both played: per split, the success of each and the difference with its 95% bootstrap interval over games.

    python benchmarks/compare_outcomes.py docs/measurements/real_model/full_weight_sft/outcomes/sft.jsonl \\
        docs/measurements/real_model/outcomes/sft.jsonl

e.g. two SFT starts of the real model, where one evaluation is not finished yet: only the shared episodes count.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from real_model_results import paired_rl_gain


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def compare_files(first: Path, second: Path) -> dict[str, dict]:
    """{split: {episodes, first, second, gain, lo, hi}} over the episodes both files hold (paired_rl_gain pairs them)."""
    a, b = read_rows(first), read_rows(second)
    result = {}
    episode = lambda r: (r["split"], r["task_id"], r["seed"])   # noqa: E731
    played_by_b = {episode(r) for r in b}
    for split in sorted({r["split"] for r in a if episode(r) in played_by_b}):   # splits with a shared episode
        gain = paired_rl_gain([r for r in a if r["split"] == split], [r for r in b if r["split"] == split])
        result[split] = {"episodes": gain["episodes"], "first": gain["before"], "second": gain["after"],
                         "gain": gain["gain"], "lo": gain["lo"], "hi": gain["hi"]}
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/compare_outcomes.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="the first evaluation's outcomes (the difference is second - first)")
    parser.add_argument("second", type=Path, help="the second evaluation's outcomes")
    parser.add_argument("--dry-run", action="store_true", help="print the arguments, compare nothing")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(json.dumps({"first": str(args.first), "second": str(args.second)}))
        return 0
    missing = [str(p) for p in (args.first, args.second) if not p.is_file()]
    if missing:
        parser.error(f"no such outcome file: {', '.join(missing)}")
    print(json.dumps(compare_files(args.first, args.second), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
