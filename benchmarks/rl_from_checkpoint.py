"""RL from a given warm start with the demo's settings, then held-out success of the start and of every saved
checkpoint: how issue 5 measured whether RL moves on generated ALFWorld beyond the demo's 16 iterations.

    python benchmarks/rl_from_checkpoint.py --sft runs/demo/sft --out runs/rl_long --iterations 60 \
        --save-every 20 [--config configs/demo.yaml] [key=value ...]

Overrides are DemoConfig fields (e.g. rl.optim.epochs=4). The env server runs as the demo's does (same
arguments, PYTHONHASHSEED = seed). Prints one JSON line per checkpoint and writes <out>/held_out.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from rich.console import Console

from trainer_client import configuration
from trainer_client.demo import DemoConfig
from trainer_client.env_pool import EnvPool
from trainer_client.evaluate import EVAL_TEMPERATURE, evaluate
from trainer_client.local_server import local_env_server
from trainer_client.policy import Policy, TransformersBackend
from trainer_client.train import train

ROOT = Path(__file__).resolve().parents[1]


async def run(cfg: DemoConfig, sft_dir: Path, out: Path) -> list[dict]:
    hash_seed = {"PYTHONHASHSEED": str(cfg.seed)}
    async with local_env_server([cfg.env], cfg.server_args, log_file=None, extra_env=hash_seed) as address:
        async with EnvPool([address]) as pool:
            eval_ids = sorted(await pool.list_tasks(cfg.env, cfg.eval_split))[:cfg.eval_episodes]
            rl_cfg = dataclasses.replace(
                cfg.rl, run_dir=str(out), seed=cfg.seed,
                model=dataclasses.replace(cfg.rl.model, path=str(sft_dir)),
                env=dataclasses.replace(cfg.rl.env, name=cfg.env, train_split=cfg.train_split, servers=(address,)))
            torch.manual_seed(cfg.seed)
            await train(rl_cfg, console=Console(stderr=True))
            rollout = dataclasses.replace(cfg.rl.rollout, temperature=EVAL_TEMPERATURE)
            saved = sorted((out / "checkpoints").glob("iter_*"))
            rows = []
            for label, path in [("start", sft_dir)] + [(p.name, p / "policy") for p in saved]:
                policy = Policy.load(path)
                result = await evaluate(pool, TransformersBackend.from_policy(policy), policy.tokenizer, cfg.env,
                                        cfg.eval_split, eval_ids, rollout, cfg.rl.prompt, seed=cfg.seed)
                rows.append({"checkpoint": label, "success": result.success, "episodes": result.total.episodes})
                print(json.dumps(rows[-1]), flush=True)
    (out / "held_out.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft", type=Path, required=True, help="the warm-start checkpoint (e.g. runs/demo/sft)")
    parser.add_argument("--out", type=Path, required=True, help="run directory for RL and the results")
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=0, help="checkpoint (and evaluate) every N (0: the end)")
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads (OMP_WAIT_POLICY=PASSIVE is set)")
    parser.add_argument("overrides", nargs="*", help="DemoConfig key=value overrides")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(args.threads)
    every = args.save_every or args.iterations
    try:
        cfg = configuration.load(DemoConfig, args.config, [*args.overrides, f"rl.iterations={args.iterations}",
                                                           f"rl.save_every={every}"])
    except configuration.ConfigError as error:
        parser.error(str(error))
    asyncio.run(run(cfg, args.sft, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
