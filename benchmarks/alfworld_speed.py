"""ALFWorld reset and step time, limen's AlfWorldEnv against unmodified upstream AlfredTWEnv, side by side.

Both play the same games with the same actions (upstream chooses them: a seeded mix of expert and random
admissible commands; limen replays them) and both run the handcoded expert on every step. Upstream runs in
its own process so that limen's speed patches cannot reach it. Outputs are checked equal before any time
is reported. Goals (issue 3): median step <= 0.4x upstream, median reset <= 0.5x upstream. Each
side's wall time and its own process's CPU time are both reported (the sides run one after the other,
so on a shared machine only the CPU-time ratio is free of the other jobs' load).

    .venv/bin/python benchmarks/alfworld_speed.py [--games 12] [--steps 20] [--generated small|medium|full]

Uses the official valid_seen/valid_unseen games when ALFWORLD_DATA has them, else generated full-size ones.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from env_server.envs.alfworld.env import AlfWorldEnv  # noqa: E402

SEED = 0
UPSTREAM_PLAYER = Path(__file__).resolve().parent.parent / "tests" / "envs" / "upstream" / "alfworld_play.py"
GOALS = {"reset": 0.5, "step": 0.4}


def pick_games(env: AlfWorldEnv, splits: list[str], n: int) -> list[tuple[str, str]]:
    """n games spread evenly over the splits' playable tasks (so over every category)."""
    episodes = [(split, t.task_id) for split in splits for t in env.splits()[split].playable]
    return [episodes[round(i * len(episodes) / n)] for i in range(n)]


def upstream_play(game_files: list[Path], steps: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "upstream.jsonl"
        subprocess.run([sys.executable, str(UPSTREAM_PLAYER), *map(str, game_files),
                        "--policy", "mixed", "--seed", str(SEED), "--max-steps", str(steps), "--out", str(out)],
                       check=True, capture_output=True)
        return [json.loads(line) for line in out.read_text().splitlines()]


def timed(call, *args, **kwargs):
    """(result, wall seconds, CPU seconds of this process) of one call."""
    started, started_cpu = time.perf_counter(), time.process_time()
    result = call(*args, **kwargs)
    return result, time.perf_counter() - started, time.process_time() - started_cpu


def limen_replay(env: AlfWorldEnv, split: str, task_id: str, record: dict, steps: int) -> dict[str, list[float]]:
    """Wall and CPU times of the reset and the steps of replaying the upstream record, in the record's keys
    (reset_s, reset_cpu_s, step_s, step_cpu_s); raises if any observation differs."""
    result, reset_s, reset_cpu_s = timed(env.reset, split, task_id, seed=SEED, max_turns=steps)
    if result.observation != record["first"]["observation"]:
        raise AssertionError(f"{task_id}: reset observation differs from upstream")
    times = {"reset_s": [reset_s], "reset_cpu_s": [reset_cpu_s], "step_s": [], "step_cpu_s": []}
    for step in record["steps"]:
        result, step_s, step_cpu_s = timed(env.step, step["action"])
        times["step_s"].append(step_s)
        times["step_cpu_s"].append(step_cpu_s)
        if (result.observation, result.won, result.done) != (step["observation"], step["won"], step["done"]):
            raise AssertionError(f"{task_id}: step {step['action']!r} differs from upstream")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20, help="steps per game (fewer when a game is won)")
    parser.add_argument("--generated", metavar="SIZE", help="play generated games of this size (small, medium, "
                        "full) even when ALFWORLD_DATA has the official ones (which are the default)")
    parser.add_argument("--json", help="also write the medians and ratios here")
    args = parser.parse_args(argv)

    data_dir = os.environ.get("ALFWORLD_DATA", "")
    if not args.generated and data_dir and (Path(data_dir) / "json_2.1.1").is_dir():
        env, splits, source = AlfWorldEnv(data_dir=data_dir), ["valid_seen", "valid_unseen"], "official"
    else:
        size = args.generated or "full"
        options = dict(data_dir="", generated=True, size=size, gen_train_games=6, gen_test_games=args.games)
        # Generated (or found in the cache) by another process, so that this one starts with cold caches.
        subprocess.run([sys.executable, "-c", "import sys, json; from env_server.envs.alfworld.env import AlfWorldEnv; "
                        "AlfWorldEnv(**json.loads(sys.argv[1])).splits()", json.dumps(options)], check=True)
        env, splits, source = AlfWorldEnv(**options), ["gen_test"], f"generated ({size})"
    games = pick_games(env, splits, args.games)
    files = {env.game_file(split, task_id): (split, task_id) for split, task_id in games}

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    started = time.perf_counter()
    records = upstream_play(list(files), args.steps)
    upstream_wall = time.perf_counter() - started
    first_visit, revisit = [], []
    started = time.perf_counter()
    for visits in (first_visit, revisit):
        for record in records:
            split, task_id = files[Path(record["game_file"])]
            visits.append(limen_replay(env, split, task_id, record, args.steps))
    ours_wall = time.perf_counter() - started
    env.close()

    n_steps = sum(len(r["step_s"]) for r in records)
    print(f"ALFWorld speed: {len(records)} {source} games, {n_steps} steps (same actions, outputs checked equal), "
          f"expert on in both, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"load average at start {load_at_start}")
    results = {"source": source, "games": len(records), "steps": n_steps, "load_average_at_start": load_at_start}
    # Wall time is what a caller waits; CPU time (of each side's own process) is the work done, and is the
    # steadier measure when other jobs share the cores, since the two sides run one after the other.
    for clock, suffix in (("wall", "_s"), ("CPU", "_cpu_s")):
        theirs = {"reset": pooled(records, "reset" + suffix), "step": pooled(records, "step" + suffix)}
        ours = {"reset, first visit": pooled(first_visit, "reset" + suffix),
                "reset, revisit": pooled(revisit, "reset" + suffix), "step": pooled(first_visit, "step" + suffix)}
        print(f"\n{clock + ' time':20s} {'upstream AlfredTWEnv':>22s} {'limen AlfWorldEnv':>20s} {'ratio':>7s} {'goal':>7s}")
        medians = {}
        for ours_key, theirs_key in (("reset, first visit", "reset"), ("reset, revisit", "reset"), ("step", "step")):
            upstream_ms, limen_ms = 1000 * statistics.median(theirs[theirs_key]), 1000 * statistics.median(ours[ours_key])
            goal = GOALS[theirs_key] if ours_key != "reset, revisit" else None
            print(f"{ours_key:20s} {upstream_ms:19.1f} ms {limen_ms:17.1f} ms {limen_ms / upstream_ms:7.2f} "
                  f"{f'<= {goal}' if goal else '':>7s}")
            medians[ours_key] = {"upstream_ms": upstream_ms, "limen_ms": limen_ms, "ratio": limen_ms / upstream_ms,
                                 "goal": goal}
        p90 = {"upstream_ms": 1000 * quantile(theirs["step"], 0.9), "limen_ms": 1000 * quantile(ours["step"], 0.9)}
        print(f"{'p90 step':20s} {p90['upstream_ms']:19.1f} ms {p90['limen_ms']:17.1f} ms")
        # "median" and "p90_step_ms" are wall time (what benchmarks/report.py renders); the _cpu keys CPU time.
        key_suffix = "" if clock == "wall" else "_cpu"
        results["median" + key_suffix], results["p90_step" + key_suffix + "_ms"] = medians, p90
    print(f"\nwall: upstream {upstream_wall:.1f} s (incl. its imports), limen {ours_wall:.1f} s (two passes)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def pooled(runs: list[dict], key: str) -> list[float]:
    """Every game's values of `key` in one list (a reset is one value per game, steps are many)."""
    return [value for run in runs for value in (run[key] if isinstance(run[key], list) else [run[key]])]


def quantile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


if __name__ == "__main__":
    raise SystemExit(main())
