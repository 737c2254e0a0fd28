"""Is an evaluation a function of checkpoint, games and seed? The demo's setting, measured end to end.

A tiny model warm-started on expert play of generated ALFWorld games (as the demo does, smaller), then one
held-out evaluation played several ways: lock-step with every game in flight, small batches with a batch
wait, one game at a time, each in its own process. Every episode's sampled tokens, actions and outcome are
compared with the first way's.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/eval_reproducibility.py [--games 100] [--out result.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting)
from rich.console import Console  # noqa: E402

from trainer_client import config  # noqa: E402
from trainer_client.demo import DemoConfig  # noqa: E402
from trainer_client.env_pool import EnvPool  # noqa: E402
from trainer_client.evaluate import evaluate  # noqa: E402
from trainer_client.experts import expert_episodes, expert_samples, expert_texts  # noqa: E402
from trainer_client.local_server import local_env_server  # noqa: E402
from trainer_client.policy import Policy, TransformersBackend, build_tiny_checkpoint  # noqa: E402
from trainer_client.sft import sft  # noqa: E402

# The demo's prompts and rollout, read through the one config loader.
DEMO = config.load(DemoConfig, Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
PROMPTS = DEMO.rl.prompt
WAYS = {  # name: (concurrency, max_batch, batch_wait_s, dtype)
    "lock-step, all games in flight": (256, 256, 0.0, "float32"),
    "8 in flight, batches of <= 4, 20 ms wait": (8, 4, 0.02, "float32"),
    "one game at a time": (1, 1, 0.0, "float32"),
}


def server_args(cache: Path, train_games: int, test_games: int) -> list[str]:
    return ["--workers", "2", "--env-option", "alfworld.data_dir=", "--env-option", "alfworld.generated=true",
            "--env-option", f"alfworld.gen_train_games={train_games}",
            "--env-option", f"alfworld.gen_test_games={test_games}", "--env-option", f"alfworld.cache_dir={cache}"]


async def warm_start(server: str, out: Path, games: int, epochs: float) -> Path:
    """Expert play -> tokenizer + tiny model -> SFT on replies and prompts (the demo's recipe)."""
    async with EnvPool([server]) as pool:
        train_ids = sorted(await pool.list_tasks("alfworld", "gen_train"))
        experts = await expert_episodes(pool, "alfworld", "gen_train", random.Random(0).sample(train_ids, games), 0)
    texts = [t for pair in expert_texts(experts, PROMPTS) for t in pair]
    policy = Policy.load(build_tiny_checkpoint(texts, out / "base", size="tiny", seed=0))
    sft(policy, expert_samples(policy.tokenizer, experts, PROMPTS), epochs=epochs, lr=3e-3, batch_turns=16,
        lr_decay=True, prompt_loss_weight=1.0, seed=0, console=Console(quiet=True))
    return policy.save(out / "sft")


async def play(checkpoint: str, server: str, games: int, seed: int, concurrency: int, max_batch: int,
               batch_wait_s: float, dtype: str) -> dict:
    policy = Policy.load(checkpoint)
    backend = TransformersBackend.from_policy(policy, dtype=getattr(torch, dtype))
    rollout = dataclasses.replace(DEMO.rl.rollout, temperature=DEMO.rl.eval_temperature,
                                  max_concurrent_episodes=concurrency, max_batch=max_batch, batch_wait_s=batch_wait_s)
    started = time.perf_counter()
    async with EnvPool([server]) as pool:
        task_ids = sorted(await pool.list_tasks("alfworld", "gen_test"))[:games]
        result = await evaluate(pool, backend, policy.tokenizer, "alfworld", "gen_test", task_ids, rollout, PROMPTS,
                                seed=seed)
    return {"seconds": time.perf_counter() - started, "success": result.success, "dropped": result.dropped,
            "episodes": {r.task.task_id: {"won": r.won, "actions": [t.action for t in r.turns],
                                          "responses": [list(t.response_ids) for t in r.turns]}
                         for r in result.episodes}}


def in_process_of_its_own(checkpoint: Path, server: str, games: int, seed: int, way: tuple) -> dict:
    concurrency, max_batch, batch_wait_s, dtype = way
    out = subprocess.run([sys.executable, __file__, "--play", str(checkpoint), "--server", server,
                          "--games", str(games), "--seed", str(seed), "--play-way",
                          json.dumps([concurrency, max_batch, batch_wait_s, dtype])],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def differences(first: dict, other: dict) -> dict:
    """Episodes whose trajectory or outcome differs from `first`'s, and the tokens compared."""
    tokens = sum(len(r) for e in first["episodes"].values() for r in e["responses"])
    differing = [t for t in first["episodes"] if first["episodes"][t] != other["episodes"].get(t)]
    outcome = [t for t in first["episodes"] if first["episodes"][t]["won"] != other["episodes"].get(t, {}).get("won")]
    return {"tokens_in_first": tokens, "episodes_differing": differing, "outcomes_differing": outcome}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=100, help="held-out games played")
    parser.add_argument("--train-games", type=int, default=120, help="expert games for the warm start")
    parser.add_argument("--sft-epochs", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0, help="eval seed")
    parser.add_argument("--work", default="runs/eval_reproducibility", help="games cache and checkpoints")
    parser.add_argument("--checkpoint", help="evaluate this checkpoint instead of warm-starting one")
    parser.add_argument("--out")
    parser.add_argument("--play", help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    parser.add_argument("--play-way", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("LIMEN_BENCH_THREADS", "2")))
    if args.play:   # one evaluation, in a process of its own
        print(json.dumps(asyncio.run(play(args.play, args.server, args.games, args.seed, *json.loads(args.play_way)))))
        return 0

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    async def run() -> dict:
        options = server_args(work / "games", args.train_games, args.games)
        async with local_env_server(["alfworld"], options, log_file=work / "env_server.log") as server:
            started = time.perf_counter()
            checkpoint = Path(args.checkpoint) if args.checkpoint else await warm_start(
                server, work, args.train_games, args.sft_epochs)
            warm_s = time.perf_counter() - started
            plays = {name: await asyncio.to_thread(in_process_of_its_own, checkpoint, server, args.games, args.seed, way)
                     for name, way in WAYS.items()}
        first_name = next(iter(plays))
        return {
            "checkpoint": str(checkpoint), "games": args.games, "eval_seed": args.seed, "warm_start_s": warm_s,
            "ways": {name: {"concurrency_max_batch_wait_dtype": WAYS[name], "success": p["success"],
                            "dropped": p["dropped"], "seconds": p["seconds"],
                            **({} if name == first_name else differences(plays[first_name], p))}
                     for name, p in plays.items()},
        }

    result = asyncio.run(run())
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
