"""Toy-env steps per second and step latency over the wire, side by side in one run: unary Step and the
Episode stream (both through EnvPool, against a `python -m env_server` process) and the server's own
domain call path in this process (EnvBackend, no gRPC), at several concurrencies.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/wire.py [--seconds 3] [--json out.json]

"added" is the mode's latency minus the in-process latency at the same concurrency: what gRPC and the
client cost on top of the env worker round trip that every mode shares.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402  (after the thread settings)
import asyncio  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from functools import partial  # noqa: E402

import grpc  # noqa: E402

from env_server.backend import EnvBackend, open_backend  # noqa: E402
from env_server.config import ServerConfig  # noqa: E402
from env_server.episode import EpisodeSpec  # noqa: E402
from trainer_client.env_pool import EnvPool  # noqa: E402

MODES = ("in-process", "unary", "stream")
# "look" never completes a fetch task and the turn limit is out of reach, so episodes never end and
# only steps are timed.
ACTION = "look"
ENDLESS_TURNS = 10**9
# A step is a coroutine taking the step index; the *_steppers contexts yield one per concurrent episode.
Stepper = Callable[[int], Awaitable[object]]


@dataclass(frozen=True)
class Cell:
    mode: str
    concurrency: int
    steps: int
    steps_per_s: float
    p50_ms: float
    p99_ms: float
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


def summarize(mode: str, concurrency: int, latencies_s: list[float], elapsed_s: float) -> Cell:
    ordered = sorted(latencies_s)
    return Cell(mode, concurrency, len(ordered), len(ordered) / elapsed_s, percentile(ordered, 50) * 1e3,
                percentile(ordered, 99) * 1e3)


def with_added(cells: list[Cell]) -> list[Cell]:
    """Fill in each wire mode's latency over the in-process call at the same concurrency."""
    base = {c.concurrency: c for c in cells if c.mode == "in-process"}
    return [c if c.mode == "in-process" else Cell(**{**asdict(c), "added_p50_ms": c.p50_ms - base[c.concurrency].p50_ms,
                                                     "added_p99_ms": c.p99_ms - base[c.concurrency].p99_ms})
            for c in cells]


async def measure(steppers: list[Stepper], warmup_s: float, seconds: float) -> tuple[list[float], float]:
    """Every stepper steps in a loop; latencies are kept from the end of the warm-up to the deadline."""
    loop = asyncio.get_running_loop()
    start_at = loop.time() + warmup_s
    stop_at = start_at + seconds
    latencies: list[float] = []

    async def drive(step: Stepper) -> None:
        index = 1
        while (now := loop.time()) < stop_at:
            began = time.perf_counter()
            await step(index)
            if now >= start_at:
                latencies.append(time.perf_counter() - began)
            index += 1

    await asyncio.gather(*(drive(step) for step in steppers))
    return latencies, loop.time() - start_at


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@asynccontextmanager
async def server_process(workers: int, capacity: int):
    """A real env server in its own process, as deployed."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "env_server", "--envs", "toy", "--port", str(port),
                             "--metrics-port", "-1", "--workers", str(workers), "--max-sessions", str(capacity),
                             "--log-level", "WARNING"])
    try:
        address = f"127.0.0.1:{port}"
        async with grpc.aio.insecure_channel(address) as channel:
            await channel.channel_ready()   # waits (no deadline) until the server listens
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def task_ids(concurrency: int) -> list[str]:
    return [f"fetch-{3 * (i % 40) + 1:03d}" for i in range(concurrency)]


@asynccontextmanager
async def backend_steppers(backend: EnvBackend, concurrency: int):
    """Sessions stepped through the server's domain call path, as its servicer calls it."""
    sessions = [await backend.reset(EpisodeSpec("toy", "train", task_id, max_turns=ENDLESS_TURNS))
                for task_id in task_ids(concurrency)]
    try:
        yield [lambda index, session_id=t.session_id: backend.step(session_id, index, ACTION) for t in sessions]
    finally:
        await asyncio.gather(*(backend.close(t.session_id) for t in sessions))


@asynccontextmanager
async def pool_steppers(pool: EnvPool, concurrency: int):
    episodes = await asyncio.gather(*(pool.open("toy", "train", task_id, max_turns=ENDLESS_TURNS)
                                      for task_id in task_ids(concurrency)))
    try:
        yield [lambda index, episode=episode: episode.step(ACTION) for episode in episodes]
    finally:
        await asyncio.gather(*(episode.close() for episode in episodes))


async def run(concurrencies: list[int], seconds: float, warmup_s: float, rounds: int, workers: int) -> list[Cell]:
    """Every (mode, concurrency) cell is measured in `rounds` slices, the modes taking turns, so that
    load from other processes on a shared machine falls on all modes alike."""
    capacity = max(concurrencies) * 2
    config = ServerConfig(envs=("toy",), port=0, metrics_port=-1, workers=workers, max_sessions=capacity)
    latencies: dict[tuple[str, int], list[float]] = defaultdict(list)
    elapsed: dict[tuple[str, int], float] = defaultdict(float)
    async with open_backend(config) as backend, server_process(workers, capacity) as address, \
            EnvPool([address], transport="unary") as unary, EnvPool([address], transport="stream") as stream:
        steppers = {"in-process": partial(backend_steppers, backend), "unary": partial(pool_steppers, unary),
                    "stream": partial(pool_steppers, stream)}
        for _ in range(rounds):
            for concurrency in concurrencies:
                for mode in MODES:
                    async with steppers[mode](concurrency) as cell_steppers:
                        cell_latencies, cell_elapsed = await measure(cell_steppers, warmup_s, seconds / rounds)
                    latencies[mode, concurrency] += cell_latencies
                    elapsed[mode, concurrency] += cell_elapsed
    return with_added([summarize(mode, concurrency, latencies[mode, concurrency], elapsed[mode, concurrency])
                       for mode, concurrency in latencies])


def table(cells: list[Cell]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    lines = [f"{'mode':<11}{'conc':>6}{'steps':>9}{'steps/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}"]
    for c in sorted(cells, key=lambda c: (c.concurrency, MODES.index(c.mode))):
        lines.append(f"{c.mode:<11}{c.concurrency:>6}{c.steps:>9}{c.steps_per_s:>10.0f}{c.p50_ms:>9.3f}"
                     f"{c.p99_ms:>9.3f}{ms(c.added_p50_ms):>9}{ms(c.added_p99_ms):>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16,256", help="comma-separated concurrent episodes")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per cell")
    parser.add_argument("--rounds", type=int, default=3, help="slices each cell is measured in, modes taking turns")
    parser.add_argument("--warmup-s", type=float, default=0.3, help="untimed stepping before each slice")
    parser.add_argument("--workers", type=int, default=1, help="env worker processes of the server")
    parser.add_argument("--json", help="also write the cells to this file")
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    cells = asyncio.run(run(concurrencies, args.seconds, args.warmup_s, args.rounds, args.workers))
    print(f"toy env, {args.workers} worker process(es), {args.seconds:g} s per cell in {args.rounds} rounds, "
          f"cpus {os.cpu_count()}")
    print(table(cells))
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(c) for c in cells], out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
