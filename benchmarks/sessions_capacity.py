"""Sessions per env-server process: ramp concurrent episodes of one env on one server (a real
`python -m env_server` process, reached through EnvPool) and report the step latency at each level, and
the most sessions whose p99 step latency stays under a bound.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/sessions_capacity.py [--envs toy,webshop]
        [--sessions 8,32,128,512] [--think-s 0.5] [--bound-ms 50] [--repeats 5] [--json out.json]

Each session steps, then waits --think-s before its next step, as an episode waits for the policy between
turns; starts are staggered so sessions do not step in lock-step. A level is measured --repeats times
(levels taking turns), for at least --seconds and about --min-steps steps each time, and its p50 and p99
are reported as median [min, max] over the repeats. Episodes never end: toy looks around; webshop
alternates a fresh three-word search with going back to search.
"""

from __future__ import annotations

from benchlib import fix_threads, percentile, spread

fix_threads(1)

import argparse  # noqa: E402  (after the thread settings)
import asyncio  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

from trainer_client.env_pool import EnvPool  # noqa: E402
from trainer_client.local_server import local_env_server  # noqa: E402

ENDLESS_TURNS = 10**9
# (split, task id prefix) per env: tasks that the endless actions below never finish ("look" wins a toy
# goto task that starts in its target room, so only fetch tasks).
ENDLESS_TASKS = {"toy": ("train", "fetch-"), "webshop": ("train", "")}
# Product words for webshop queries: three drawn per search, so the search cache rarely answers.
QUERY_WORDS = ("red", "blue", "black", "white", "cotton", "leather", "wireless", "portable", "organic", "shampoo",
               "shirt", "shoes", "pillow", "lamp", "table", "chair", "headphones", "charger", "case", "bag",
               "soap", "candle", "mug", "towel", "jacket", "socks", "watch", "cable", "blanket", "lotion")


def endless_action(env: str, step_index: int, rng: random.Random) -> str:
    """An action that never ends the episode and makes the env do its usual work."""
    if env == "toy":
        return "look"
    if env == "webshop":   # step 1 is on the search page; odd steps search, even steps go back to it
        return f"search[{' '.join(rng.sample(QUERY_WORDS, 3))}]" if step_index % 2 else "click[back to search]"
    raise ValueError(f"no endless action for env {env!r}; known: {sorted(ENDLESS_TASKS)}")


async def measure_level(pool: EnvPool, env: str, task_ids: list[str], sessions: int, think_s: float,
                        warmup_s: float, seconds: float, seed: int) -> tuple[list[float], float]:
    """(step latencies in seconds after the warm-up, measured seconds) of `sessions` concurrent episodes."""
    episodes = await asyncio.gather(*(pool.open(env, ENDLESS_TASKS[env][0], task_ids[i % len(task_ids)], seed=seed + i,
                                                max_turns=ENDLESS_TURNS) for i in range(sessions)))
    loop = asyncio.get_running_loop()
    start_at = loop.time() + warmup_s
    stop_at = start_at + seconds
    latencies: list[float] = []

    async def drive(episode, rng: random.Random) -> None:
        await asyncio.sleep(rng.uniform(0, think_s))
        step_index = 1
        while loop.time() < stop_at:
            began_at = loop.time()
            started = time.perf_counter()
            await episode.step(endless_action(env, step_index, rng))
            if began_at >= start_at:
                latencies.append(time.perf_counter() - started)
            step_index += 1
            await asyncio.sleep(think_s)

    try:
        await asyncio.gather(*(drive(e, random.Random(f"{seed}/{i}")) for i, e in enumerate(episodes)))
    finally:
        await asyncio.gather(*(e.close() for e in episodes), return_exceptions=True)
    return latencies, seconds


def max_sessions_under(levels: list[dict], bound_ms: float) -> int | None:
    """The largest level whose median p99 is within the bound, counting only levels below the first that
    is not (a ramp's later levels cannot rescue it)."""
    best = None
    for level in sorted(levels, key=lambda level: level["sessions"]):
        if level["p99_ms"]["median"] > bound_ms:
            break
        best = level["sessions"]
    return best


def level_seconds(sessions: int, think_s: float, seconds: float, min_steps: int) -> float:
    """Measured time for one level: at least `seconds`, and long enough for about `min_steps` steps (each
    session steps about once per think time), so that a p99 is not simply the slowest of a few dozen."""
    return max(seconds, min_steps * think_s / sessions)


def summarize_level(sessions: int, runs: list[tuple[list[float], float]]) -> dict:
    return {
        "sessions": sessions,
        "seconds_per_repeat": runs[0][1],
        "steps": sum(len(latencies) for latencies, _ in runs),
        "p50_ms": spread([1e3 * percentile(latencies, 50) for latencies, _ in runs]),
        "p99_ms": spread([1e3 * percentile(latencies, 99) for latencies, _ in runs]),
        "steps_per_s": spread([len(latencies) / seconds for latencies, seconds in runs]),
    }


async def ramp(env: str, levels: list[int], args: argparse.Namespace) -> dict:
    # Headroom over the top level: closed streams free their sessions a moment after the next level opens.
    server_args = ["--workers", str(args.workers), "--max-sessions", str(2 * max(levels)), "--log-level", "WARNING"]
    runs: dict[int, list[tuple[list[float], float]]] = defaultdict(list)
    async with local_env_server([env], server_args) as address, EnvPool([address]) as pool:
        split, prefix = ENDLESS_TASKS[env]
        task_ids = sorted(t for t in await pool.list_tasks(env, split) if t.startswith(prefix))
        for repeat in range(args.repeats):
            for sessions in levels:
                seconds = level_seconds(sessions, args.think_s, args.seconds, args.min_steps)
                latencies, seconds = await measure_level(pool, env, task_ids, sessions, args.think_s,
                                                         args.warmup_s, seconds, seed=1000 * repeat)
                if not latencies:
                    raise RuntimeError(f"{env}: no step finished within the measured {seconds} s at {sessions} sessions")
                runs[sessions].append((latencies, seconds))
    level_rows = [summarize_level(sessions, runs[sessions]) for sessions in levels]
    return {"env": env, "workers": args.workers, "levels": level_rows,
            "max_sessions_under_bound": max_sessions_under(level_rows, args.bound_ms)}


def table(result: dict, bound_ms: float) -> str:
    def cell(s: dict) -> str:
        return f"{s['median']:.1f} [{s['min']:.1f}, {s['max']:.1f}]"

    lines = [f"{result['env']}: {result['workers']} worker process(es); most sessions with p99 <= {bound_ms:g} ms: "
             f"{result['max_sessions_under_bound']}",
             f"{'sessions':>9}  {'p50 ms':>22}  {'p99 ms':>22}  {'steps/s':>22}"]
    for level in result["levels"]:
        lines.append(f"{level['sessions']:>9}  {cell(level['p50_ms']):>22}  {cell(level['p99_ms']):>22}  "
                     f"{cell(level['steps_per_s']):>22}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="toy,webshop", help=f"comma-separated, of {sorted(ENDLESS_TASKS)}")
    parser.add_argument("--sessions", default="8,32,128,512", help="comma-separated concurrent sessions per level")
    parser.add_argument("--think-s", type=float, default=0.5, help="pause of each session between its steps")
    parser.add_argument("--bound-ms", type=float, default=50.0, help="the p99 step latency a level must stay under")
    parser.add_argument("--seconds", type=float, default=3.0, help="least measured time per level and repeat")
    parser.add_argument("--min-steps", type=int, default=400,
                        help="measure small levels longer, for about this many steps per level and repeat")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured stepping before each measurement")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per level (median, min, max)")
    parser.add_argument("--workers", type=int, default=2, help="env worker processes of the server")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    envs = [e for e in args.envs.split(",") if e]
    unknown = sorted(set(envs) - set(ENDLESS_TASKS))
    if unknown:
        parser.error(f"unknown env(s) {unknown}; known: {sorted(ENDLESS_TASKS)}")
    levels = sorted({int(n) for n in args.sessions.split(",") if n})
    if args.think_s < 0 or args.repeats < 1 or not levels or min(levels) < 1:
        parser.error("--think-s must be >= 0, --repeats >= 1, and every level >= 1 session")

    results = [asyncio.run(ramp(env, levels, args)) for env in envs]
    print(f"think {args.think_s:g} s between steps, >= {args.seconds:g} s and ~{args.min_steps} steps measured per "
          f"level x {args.repeats} repeats")
    print("\n\n".join(table(result, args.bound_ms) for result in results))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "think_s": args.think_s, "bound_ms": args.bound_ms, "seconds": args.seconds,
            "min_steps": args.min_steps, "repeats": args.repeats,
            "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
