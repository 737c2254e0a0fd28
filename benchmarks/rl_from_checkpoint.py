"""RL from a given warm start with the demo's settings, then held-out success (and WebShop's score) of the start
and of every saved checkpoint: how issue 5 measured whether RL moves on generated ALFWorld beyond the demo's 16
iterations.

    python benchmarks/rl_from_checkpoint.py --sft runs/demo/sft --out runs/rl_long --iterations 60 \
        --save-every 20 [--config configs/demo.yaml] [key=value ...]

Overrides are DemoConfig fields (e.g. rl.optim.epochs=4). `--evaluate-only` skips the RL and evaluates the
checkpoints a run already saved, e.g. a demo's: `--sft runs/demo/sft --out runs/demo/rl --evaluate-only`.
The env server runs as the demo's does (same arguments, PYTHONHASHSEED = seed). Prints one JSON line per
checkpoint and writes <out>/held_out.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import torch
from rich.console import Console

from benchlib import add_demo_config_args, load_demo_config
from trainer_client import paired
from trainer_client.demo import DemoConfig, demo_env_server, held_out, rl_config
from trainer_client.env_pool import EnvPool
from trainer_client.train import train

ROOT = Path(__file__).resolve().parents[1]


async def run(cfg: DemoConfig, sft_dir: Path, out: Path, evaluate_only: bool = False) -> list[dict]:
    async with demo_env_server(cfg) as address, EnvPool([address]) as pool:
        eval_ids = sorted(await pool.list_tasks(cfg.env, cfg.eval_split))[:cfg.eval_episodes]
        if not evaluate_only:
            torch.manual_seed(cfg.seed)
            await train(rl_config(cfg, sft_dir, out, address), console=Console(stderr=True))
        rows, start = [], None
        saved = sorted((out / "checkpoints").glob("iter_*"))
        for label, checkpoint in [("start", sft_dir)] + [(p.name, p / "policy") for p in saved]:
            result = await held_out(pool, cfg, eval_ids, checkpoint)
            rows.append({"checkpoint": label, "success": result.success, "score": result.score,
                         "episodes": result.total.episodes, "dropped": result.dropped})
            # WebShop's score (mean purchase reward x 100) moves where success does not: paired too.
            metrics = ("won", "score") if cfg.env == "webshop" else ("won",)
            outcomes = {metric: paired.outcome_values([result], metric) for metric in metrics}
            if start is None:
                start = outcomes
            else:  # the same games and sampling seeds as the start: a paired gain with its 95% interval
                gain = paired.compare(start["won"], outcomes["won"], seed=cfg.seed)
                rows[-1] |= {"paired_gain": gain.gain, "gain_ci95": [gain.lo, gain.hi]}
                if "score" in outcomes:
                    gain = paired.compare(start["score"], outcomes["score"], seed=cfg.seed)
                    rows[-1] |= {"paired_score_gain": 100 * gain.gain, "score_gain_ci95": [100 * gain.lo, 100 * gain.hi]}
            print(json.dumps(rows[-1]), flush=True)
    (out / "held_out.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft", type=Path, required=True, help="the warm-start checkpoint (e.g. runs/demo/sft)")
    parser.add_argument("--out", type=Path, required=True, help="run directory for RL and the results")
    parser.add_argument("--iterations", type=int, default=0, help="RL iterations (required unless --evaluate-only)")
    parser.add_argument("--save-every", type=int, default=0, help="checkpoint (and evaluate) every N (0: the end)")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="no RL: evaluate the start and the checkpoints already under --out/checkpoints")
    add_demo_config_args(parser, str(ROOT / "configs" / "demo.yaml"))
    args = parser.parse_args(argv)
    if args.evaluate_only != (args.iterations == 0):
        parser.error("give --iterations N (N > 0) to train, or --evaluate-only with no --iterations")
    every = args.save_every or args.iterations
    cfg = load_demo_config(parser, args, [] if args.evaluate_only else
                           [f"rl.iterations={args.iterations}", f"rl.save_every={every}"])
    if args.evaluate_only and not sorted((args.out / "checkpoints").glob("iter_*")):
        parser.error(f"--evaluate-only: no checkpoints under {args.out / 'checkpoints'}")
    asyncio.run(run(cfg, args.sft, args.out, args.evaluate_only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
