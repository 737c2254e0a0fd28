"""How much of a checkpoint's outcome spread lies within a task (what a sampled action can change) and how much
between tasks (what a critic must predict from the task alone, or a group baseline takes away).

    python benchmarks/outcome_spread.py --checkpoint runs/demo_webshop/sft [--tasks 64] [--samples 4] \
        [--temperature 1.0] [--config configs/demo_webshop.yaml] [key=value ...]

Plays each of the first `--tasks` tasks of the demo's training split (RL's tasks) `--samples` times at RL's
sampling temperature, on one env server started with the demo's arguments, each sample with its own sampling
seed, and prints one JSON line per outcome (score and won): the total variance over all episodes, the share
of it within tasks (mean within-task variance over the total), and the share of tasks whose samples differ
at all (a group of them gives GRPO a signal).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from benchlib import add_demo_config_args, load_demo_config

DEFAULT_CONFIG = "configs/demo_webshop.yaml"


def spread(per_task: Sequence[Sequence[float]]) -> dict[str, float]:
    """Variance decomposition of outcomes grouped by task (population variances, equal samples per task)."""
    flat = [x for row in per_task for x in row]
    total = statistics.pvariance(flat)
    within = statistics.fmean(statistics.pvariance(row) for row in per_task)
    return {"mean": statistics.fmean(flat), "variance": total,
            "within_task_share": within / total if total else 0.0,
            "tasks_that_differ": sum(len(set(row)) > 1 for row in per_task) / len(per_task)}


async def play(cfg, checkpoint: Path, tasks: int, samples: int, temperature: float) -> dict[str, list[list[float]]]:
    from trainer_client.demo import demo_env_server, held_out
    from trainer_client.env_pool import EnvPool

    outcomes: dict[str, dict[str, list[float]]] = {"score": {}, "won": {}}
    async with demo_env_server(cfg) as address, EnvPool([address]) as pool:
        ids = sorted(await pool.list_tasks(cfg.env, cfg.train_split))[:tasks]
        for sample in range(samples):
            result = await held_out(pool, dataclasses.replace(cfg, seed=cfg.seed + sample), ids, checkpoint,
                                    temperature, cfg.train_split)
            for (task_id, _), outcome in sorted(result.outcomes.items()):
                outcomes["score"].setdefault(task_id, []).append(outcome.score)
                outcomes["won"].setdefault(task_id, []).append(float(outcome.won))
    # A task with a dropped sample leaves (it would weigh less than the others).
    return {k: [row for row in v.values() if len(row) == samples] for k, v in outcomes.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0, help="RL samples at 1.0")
    add_demo_config_args(parser, DEFAULT_CONFIG)
    args = parser.parse_intermixed_args(argv)
    if args.samples < 2:
        parser.error("--samples must be at least 2: a spread within a task needs two samples of it")
    cfg = load_demo_config(parser, args)
    per_task = asyncio.run(play(cfg, args.checkpoint, args.tasks, args.samples, args.temperature))
    print(json.dumps({"checkpoint": str(args.checkpoint), "temperature": args.temperature, "samples": args.samples,
                      "tasks": len(per_task["score"]), **{k: spread(v) for k, v in per_task.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
