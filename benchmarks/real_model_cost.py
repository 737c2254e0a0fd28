"""What one RL turn of SmolLM2-135M-Instruct costs on this CPU, by stage, and the peak memory: today's path (the
whole model trains, a second copy is the reference, the anchor's prompt with a reasoning reply) against the new one
(LoRA on the top layers over a frozen trunk computed once per turn, the reference as the adapters switched off,
the compact prompt with the action alone), side by side in one run (issue 34).

    python benchmarks/real_model_cost.py [--turns 4] [--episodes 16] [--repeats 1] [--json out.json]

Each path runs one `limen-train` iteration of `--episodes` episodes (boundary, the preset configs/alfworld_smollm2-135m.yaml
with the path's overrides) in a process of its own, against one shared ALFWorld env server, from the same
checkpoint; the cost of a turn is the iteration's time divided by its turns (amortized over the iteration), and
memory is the process's peak RSS. With --repeats 2 the paths alternate (today, new, today, new).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRESET = "configs/alfworld_smollm2-135m.yaml"
STAGES = ("generation", "env_wait", "trunk", "old_log_prob", "ref", "update_actor")
# Today's path: what configs/alfworld_smollm2-135m.yaml said before issue 34 (the whole model, anchor prompt).
TODAY = ("model.trainable_layers=0", "model.lora.r=0", "prompt.compact=false", "prompt.history_turns=1",
         "prompt.history_obs_max_words=12", "prompt.require_think=true", "rollout.max_new_tokens=48")
NEW: tuple[str, ...] = ()   # the preset as it stands
PATHS = {"today": TODAY, "new": NEW}


def one_iteration(path: str, server: str, out: Path, episodes: int, turns: int, threads: int) -> dict:
    """Run one training iteration of `path` in this process; its per-stage seconds, turns and peak RSS."""
    import torch

    from trainer_client import config
    from trainer_client.train import train
    from trainer_client.train_config import TrainConfig

    torch.set_num_threads(threads)
    cfg = config.load(TrainConfig, REPO / PRESET, [
        *PATHS[path], f"run_dir={out}", f"env.servers=[{server}]", "iterations=1", f"episodes_per_iteration={episodes}",
        f"rollout.max_turns={turns}", f"rollout.max_concurrent_episodes={episodes}", f"rollout.max_batch={episodes}",
        "save_every=0", "timing_every=0"])
    from rich.console import Console
    asyncio.run(train(cfg, console=Console(stderr=True)))
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return {"path": path, "overrides": list(PATHS[path]), "turns": round(row["rollout/turns"] * row["rollout/episodes"]),
            "response_tokens": row["rollout/response_tokens"],
            "seconds": {s: row.get(f"time/{s}", 0.0) for s in (*STAGES, "iteration")},
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def per_turn(run: dict) -> dict[str, float]:
    return {stage: seconds / run["turns"] for stage, seconds in run["seconds"].items()}


def table(runs: list[dict]) -> str:
    """Seconds per turn by stage for each path (mean over its repeats), and today's / new's ratio."""
    by_path: dict[str, list[dict[str, float]]] = {}
    for run in runs:
        by_path.setdefault(run["path"], []).append(per_turn(run))
    means = {p: {s: sum(r[s] for r in rows) / len(rows) for s in (*STAGES, "iteration")} for p, rows in by_path.items()}
    lines = [f"{'stage (s per turn)':<20}{'today':>10}{'new':>10}{'ratio':>9}"]
    for stage in (*STAGES, "iteration"):
        today, new = means["today"][stage], means["new"][stage]
        ratio = f"{today / new:8.1f}x" if new > 0 else "       -"
        lines.append(f"{stage:<20}{today:10.3f}{new:10.3f}{ratio}")
    peak = {p: max(r["peak_rss_mib"] for r in runs if r["path"] == p) for p in by_path}
    tokens = {p: sum(r["response_tokens"] for r in runs if r["path"] == p) / len(by_path[p]) for p in by_path}
    lines.append(f"{'peak RSS (MiB)':<20}{peak['today']:10.0f}{peak['new']:10.0f}")
    lines.append(f"{'reply tokens/turn':<20}{tokens['today']:10.1f}{tokens['new']:10.1f}")
    return "\n".join(lines)


async def run_all(args) -> list[dict]:
    from trainer_client.local_server import local_env_server

    runs = []
    async with local_env_server(["alfworld"], ["--workers", "2"]) as server:
        with tempfile.TemporaryDirectory() as scratch:
            for repeat in range(args.repeats):
                for path in PATHS:
                    out = Path(scratch) / f"{path}_{repeat}"
                    command = [sys.executable, __file__, "--child", path, "--server", server, "--out", str(out),
                               "--episodes", str(args.episodes), "--turns", str(args.turns),
                               "--threads", str(args.threads)]
                    done = await asyncio.to_thread(subprocess.run, command, stdout=subprocess.PIPE, text=True)
                    if done.returncode:
                        raise SystemExit(f"the {path} iteration failed (exit {done.returncode})")
                    runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
                    print(f"{path}: {runs[-1]['turns']} turns, {runs[-1]['seconds']['iteration']:.1f} s, "
                          f"peak {runs[-1]['peak_rss_mib']:.0f} MiB", file=sys.stderr)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/real_model_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4, help="turn cap of every episode (both paths alike)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default="", help="also write the runs and the table here")
    parser.add_argument("--dry-run", action="store_true", help="resolve both paths' configs, print them, start nothing")
    parser.add_argument("--child", choices=sorted(PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_iteration(args.child, args.server, Path(args.out), args.episodes, args.turns,
                                       args.threads)))
        return 0
    if args.dry_run:
        from trainer_client import config
        from trainer_client.train_config import TrainConfig
        for path, overrides in PATHS.items():
            model = config.load(TrainConfig, REPO / PRESET, list(overrides)).model
            print(f"{path}: {PRESET} {' '.join(overrides) or '(as it stands)'} -> trainable_layers="
                  f"{model.trainable_layers} lora.r={model.lora.r}")
        return 0
    if not os.environ.get("ALFWORLD_DATA"):
        parser.error("set ALFWORLD_DATA to the folder holding json_2.1.1/ (the official games)")
    runs = asyncio.run(run_all(args))
    text = table(runs)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"runs": runs, "table": text, "load_average": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
