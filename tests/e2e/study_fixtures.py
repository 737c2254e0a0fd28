"""Shared by the study's tests: where the study's parts and smoke config are, and made-up 3-seed results for the
pure parts (summary, verdicts, tables)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "study_smoke.yaml"
sys.path.insert(0, str(ROOT / "benchmarks"))   # the study's parts, beside its command; they import their siblings
import study_config  # noqa: E402
import study_stats  # noqa: E402

# Win patterns over 40 games (categories: games 0-19 "a", 20-39 "b"), the same for 3 seeds x 2 eval seeds.
WINS = {
    "SFT": range(5),
    "boundary": range(30),           # a: 20/20, b: 10/20
    "grpo": range(30, 40),              # a: 0/20,  b: 10/20 -> boundary ahead on a only
    "ppo_critic_turn": range(29),    # one game fewer than boundary: no difference resolved
    "ppo_critic_verl": range(15),
}


def made_up_results(wins=WINS, seconds=None):
    seconds = seconds or {"boundary": 3.0, "grpo": 3.0, "ppo_critic_turn": 6.0, "ppo_critic_verl": 6.0}
    cfg = study_config.StudyConfig(env="toy", train_split="train", eval_splits=("test",), seeds=(0, 1, 2))

    def evaluation(won: range) -> dict:
        def run(eval_seed: int) -> dict:
            outcomes = [{"task_id": f"g{g:02d}", "seed": eval_seed, "won": g in won, "score": float(g in won),
                         "category": "a" if g < 20 else "b"} for g in range(40)]
            by_category = {c: {"episodes": 20, "won": sum(o["won"] for o in outcomes if o["category"] == c)}
                           for c in ("a", "b")}
            return {"seed": eval_seed, "env": "toy", "split": "test", "episodes": 40, "success": len(won) / 40,
                    "score": 100 * len(won) / 40, "dropped": 0, "outcomes": outcomes,
                    "by_category": {c: v | {"success": v["won"] / 20} for c, v in by_category.items()}}
        return {"env": "toy", "split": "test", "tasks_played": 40, "split_tasks": 40, "runs": [run(0), run(1)]}

    def timing(total: float) -> dict:
        return {stage: 0.0 for stage in ("generation", "env_wait", "trunk", "old_log_prob", "ref", "values", "adv",
                                         "update_critic", "update_actor")} | {"iteration": total}

    sft = {seed: {"evaluations": {"test": evaluation(wins["SFT"])}, "seconds": {"sft": 60.0},
                  "parameters": 750_000, "vocabulary": 2048, "loss_last": 0.5} for seed in range(3)}
    runs = {arm: {seed: {"evaluations": {"test": evaluation(won)}, "time_per_iteration": timing(seconds[arm]),
                         "seconds": {"train": 120.0, "eval": 30.0}} for seed in range(3)}
            for arm, won in wins.items() if arm != "SFT"}
    return study_stats.StudyResults(cfg, sft, runs, {})
