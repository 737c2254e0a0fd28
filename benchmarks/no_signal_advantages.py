"""How large the boundary advantages are before batch normalization, with and without a reward signal.

    python benchmarks/no_signal_advantages.py --checkpoint runs/demo/rl/checkpoints/iter_000015/policy \
        [--batches 4] [--json out.json] [--config configs/demo.yaml] [key=value ...]

Plays `--batches` training batches (the demo's episodes per iteration, T = 1, the demo's server) with a
checkpoint whose value rows are trained, and computes the boundary estimator's turn advantages twice per
batch: with the real rewards, and with every reward and penalty set to 0 (a batch in which no episode
scored: what remains is value noise). The ratio of the two batch stds is how much z-scoring inflates noise
when a batch has no signal; it is what the std floor (advantage.norm_std_floor) is chosen from.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

from benchlib import add_demo_config_args, load_demo_config
from trainer_client.algorithms import get_estimator
from trainer_client.demo import DemoConfig, demo_env_server
from trainer_client.env_pool import EnvPool
from trainer_client.policy import Policy, TransformersBackend
from trainer_client.readout import policy_readout
from trainer_client.rollout import TaskRef, collect
from trainer_client.train import TaskSampler
from trainer_client.turn_batch import turn_batch, turn_samples

ROOT = Path(__file__).resolve().parents[1]


def raw_stds(batch, cfg) -> tuple[float, float]:
    """(std of the turn advantages with the batch's rewards, std with every reward and penalty zeroed)."""
    estimator = get_estimator("boundary")
    real = estimator(batch, cfg).raw_std
    silent = dataclasses.replace(batch, rewards=torch.zeros_like(batch.rewards),
                                 penalties=torch.zeros_like(batch.penalties))
    return float(real), float(estimator(silent, cfg).raw_std)


async def run(cfg: DemoConfig, checkpoint: Path, batches: int) -> dict:
    policy = Policy.load(checkpoint)
    backend = TransformersBackend.from_policy(policy)
    needs = get_estimator("boundary").needs(cfg.rl.advantage)
    rows = []
    async with demo_env_server(cfg) as address, EnvPool([address]) as pool:
        sampler = TaskSampler(await pool.list_tasks(cfg.env, cfg.train_split), seed=cfg.seed + 1000)
        for index in range(batches):
            tasks = [TaskRef(cfg.env, cfg.train_split, task_id, seed=index)
                     for task_id in sampler.draw(cfg.rl.episodes_per_iteration)]
            records, _ = await collect(pool, backend, policy.tokenizer, tasks, cfg.rl.rollout, cfg.rl.prompt,
                                       seed=index)
            episodes = [r for r in records if r.ok]
            old = policy_readout(policy, turn_samples(episodes), cfg.rl.optim.micro_batch_tokens)
            real, silent = raw_stds(turn_batch(episodes, old, needs), cfg.rl.advantage)
            rows.append({"batch": index, "episodes": len(episodes), "won": sum(e.won for e in episodes),
                         "raw_std_with_rewards": real, "raw_std_rewards_zeroed": silent})
            print(json.dumps(rows[-1]), flush=True)
    real = [r["raw_std_with_rewards"] for r in rows]
    silent = [r["raw_std_rewards_zeroed"] for r in rows]
    return {"checkpoint": str(checkpoint), "batches": rows,
            "median_raw_std_with_rewards": statistics.median(real),
            "median_raw_std_rewards_zeroed": statistics.median(silent),
            "noise_inflation_without_floor": statistics.median(1.0 / s for s in silent if s > 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a policy checkpoint with trained value rows")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--json", type=Path, help="write the result here")
    add_demo_config_args(parser, str(ROOT / "configs" / "demo.yaml"))
    args = parser.parse_args(argv)
    cfg = load_demo_config(parser, args)
    result = asyncio.run(run(cfg, args.checkpoint, args.batches))
    print(json.dumps({k: v for k, v in result.items() if k != "batches"}))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
