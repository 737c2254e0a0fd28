"""Soak: many episodes of several envs through one env server, its memory sampled as they run. Not CI.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/soak.py --episodes toy=10000,webshop=1000,alfworld=1000 \
        --out artifacts/soak [--recycle-after-episodes 1000] [--concurrency 8]

A scripted agent plays each env's own expert (`info["expert_action"]`; a seeded random admissible action
where an env gives none). Every `--sample-every-s` the server process's RSS (psutil) and each worker's RSS
(the server's own `limen_worker_rss_bytes` metric) are recorded. Writes rss.png and soak.json with:
RSS growth after warm-up per process (the goal is <= 10%), sessions still live at the end (GetLoad; must be
0), and worker restarts by env and reason (`limen_worker_restarts_total`, i.e. the recycling counts).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402  (after the thread settings)
import asyncio  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import grpc  # noqa: E402
import psutil  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from limen.env.v1 import env_pb2, env_pb2_grpc  # noqa: E402
from trainer_client.env_pool import EnvPool, EnvPoolError  # noqa: E402
from trainer_client.local_server import free_port, local_env_server  # noqa: E402

MIB = 1024 * 1024
DEFAULT_EPISODES = "toy=10000,webshop=1000,alfworld=1000"


# ---- pure pieces ----------------------------------------------------------------------------------------
def parse_episodes(text: str) -> dict[str, int]:
    """"toy=10000,webshop=1000" -> {"toy": 10000, "webshop": 1000}."""
    counts = {}
    for item in text.split(","):
        env, _, count = item.partition("=")
        if not env.strip() or not count.strip().isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"expected ENV=COUNT with COUNT >= 1, got {item!r}")
        counts[env.strip()] = int(count)
    return counts


def rss_growth(rss: Sequence[float], warmup_fraction: float = 0.1, window_fraction: float = 0.1) -> float | None:
    """Relative growth of one process's RSS series after warm-up: (late - early) / early, where early is the
    median of the window right after the first `warmup_fraction` of samples and late the median of the last
    window. Medians, so one sample taken mid-allocation does not decide. None when the series is too short."""
    window = max(1, int(len(rss) * window_fraction))
    start = int(len(rss) * warmup_fraction)
    if len(rss) < start + 2 * window:
        return None
    early = statistics.median(rss[start:start + window])
    late = statistics.median(rss[-window:])
    return (late - early) / early


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of metric `name` in a Prometheus text exposition."""
    return [(sample.labels, sample.value) for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name]


@dataclass
class Series:
    """RSS samples of one process: the server, or one worker incarnation (env, pid)."""

    label: str
    env: str
    times_s: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)

    def add(self, at_s: float, rss_bytes: float) -> None:
        self.times_s.append(at_s)
        self.rss_mib.append(rss_bytes / MIB)

    def rss_until(self, end_s: float) -> list[float]:
        return [rss for at_s, rss in zip(self.times_s, self.rss_mib) if at_s <= end_s]


# ---- the run ------------------------------------------------------------------------------------------
@dataclass
class Progress:
    started: float = field(default_factory=time.monotonic)
    done: Counter = field(default_factory=Counter)
    won: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    finished_s: dict[str, float] = field(default_factory=dict)   # env -> when its last episode ended
    timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


async def play(pool: EnvPool, env: str, split: str, task_id: str, seed: int) -> bool:
    """One episode with the env's expert (a seeded random admissible action where it has none)."""
    rng = random.Random(seed)
    async with await pool.open(env, split, task_id, seed=seed) as episode:
        transition = episode.first
        while not transition.done:
            action = transition.info.get("expert_action") or rng.choice(transition.admissible_actions)
            transition = await episode.step(action)
        return transition.won


async def play_env(pool: EnvPool, env: str, episodes: int, concurrency: int, seed: int, progress: Progress) -> None:
    """`episodes` episodes over the env's first split (tasks drawn with `seed`), `concurrency` at a time."""
    info = (await pool.list_envs())[env]
    split = "train" if "train" in info.splits else next(iter(info.splits))
    task_ids = await pool.list_tasks(env, split)
    rng = random.Random(f"{seed}/{env}")
    plan = iter([(rng.choice(task_ids), rng.getrandbits(31)) for _ in range(episodes)])

    async def player() -> None:
        for task_id, episode_seed in plan:
            try:
                won = await play(pool, env, split, task_id, episode_seed)   # awaited first: `+= await` races
                progress.won[env] += won
            except EnvPoolError as error:
                progress.failed[env] += 1
                print(f"{env} episode failed: {error}", flush=True)
            progress.done[env] += 1

    await asyncio.gather(*(player() for _ in range(concurrency)))
    progress.finished_s[env] = progress.elapsed_s()


async def sample(metrics_url: str, server: psutil.Process, every_s: float, series: dict[str, Series],
                 progress: Progress) -> None:
    """Every `every_s`: the server's RSS, each worker's RSS (from the server's metrics), and the progress."""
    while True:
        at_s = progress.elapsed_s()
        series.setdefault("server", Series("server", "")).add(at_s, server.memory_info().rss)
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(metrics_url, timeout=10).read().decode())
        for labels, value in metric_samples(text, "limen_worker_rss_bytes"):
            if value > 0:
                key = f"{labels['env']}:{labels['worker']}"
                series.setdefault(key, Series(key, labels["env"])).add(at_s, value)
        progress.timeline.append((at_s, dict(progress.done)))
        await asyncio.sleep(every_s)


async def soak(args: argparse.Namespace) -> dict:
    metrics_port = free_port()
    server_args = ["--workers", ",".join(f"{env}={args.workers}" for env in args.episodes),
                   "--metrics-port", str(metrics_port), "--rss-poll-s", str(min(1.0, args.sample_every_s)),
                   "--recycle-after-episodes", str(args.recycle_after_episodes), "--max-sessions", "1024"]
    args.out.mkdir(parents=True, exist_ok=True)
    async with local_env_server(list(args.episodes), server_args, log_file=args.out / "env_server.log") as address:
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            first_worker = (await stub.GetLoad(env_pb2.GetLoadRequest())).workers[0].pid
            server = psutil.Process(psutil.Process(first_worker).ppid())
            series: dict[str, Series] = {}
            progress = Progress()
            sampler = asyncio.create_task(sample(metrics_url, server, args.sample_every_s, series, progress))
            async with EnvPool([address]) as pool:
                await asyncio.gather(*(play_env(pool, env, count, args.concurrency, args.seed, progress)
                                       for env, count in args.episodes.items()))
            await asyncio.sleep(2 * args.sample_every_s)   # a last few samples, and stream releases settle
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            load = await stub.GetLoad(env_pb2.GetLoadRequest())
            text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()

    restarts: defaultdict[str, dict[str, int]] = defaultdict(dict)
    for labels, value in metric_samples(text, "limen_worker_restarts_total"):
        restarts[labels["env"]][labels["reason"]] = int(value)
    return {
        "episodes": dict(progress.done), "won": dict(progress.won), "failed": dict(progress.failed),
        "seconds": {env: round(at_s, 1) for env, at_s in progress.finished_s.items()},
        "episodes_per_s": {env: round(progress.done[env] / at_s, 1) for env, at_s in progress.finished_s.items()},
        "live_sessions_at_end": load.active_sessions,
        "worker_restarts": dict(restarts),
        "workers_seen": dict(Counter(s.env for s in series.values() if s.env)),
        # A worker's series counts while its env still plays; idle afterwards it would flatter the number.
        "rss_growth_after_warmup": {label: growth for label, s in series.items() if (growth := rss_growth(
            s.rss_until(progress.finished_s.get(s.env, float("inf"))), args.warmup_fraction)) is not None},
        "rss_mib_first_last": {label: (round(s.rss_mib[0], 1), round(s.rss_mib[-1], 1)) for label, s in series.items()},
        "server_args": server_args,
        "series": {label: asdict(s) for label, s in series.items()},
        "timeline": progress.timeline,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result["series"]
    envs = sorted({s["env"] for s in series.values() if s["env"]})
    colors = dict(zip(envs, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    server = series["server"]
    axes[0].plot(server["times_s"], server["rss_mib"], color="black")
    axes[0].set(title=f"env server process RSS (growth after warm-up "
                      f"{result['rss_growth_after_warmup'].get('server', float('nan')):+.1%})", ylabel="MiB")
    for label, s in series.items():
        if s["env"]:
            axes[1].plot(s["times_s"], s["rss_mib"], color=colors[s["env"]], lw=1)
    for env in envs:
        axes[1].plot([], [], color=colors[env], label=f"{env} ({result['workers_seen'][env]} worker processes)")
    axes[1].legend(loc="upper left")
    axes[1].set(title="worker RSS, one line per worker process (a new line after each recycle)", ylabel="MiB")
    times = [t for t, _ in result["timeline"]]
    for env in envs:
        axes[2].plot(times, [done.get(env, 0) for _, done in result["timeline"]], color=colors[env], label=env)
    axes[2].legend(loc="upper left")
    axes[2].set(title="episodes finished", xlabel="seconds", ylabel="episodes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=parse_episodes, default=DEFAULT_EPISODES,
                        help=f"ENV=COUNT,... episodes per env (default: {DEFAULT_EPISODES})")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes in flight per env")
    parser.add_argument("--workers", type=int, default=1, help="worker processes per env")
    parser.add_argument("--recycle-after-episodes", type=int, default=1000,
                        help="the server's worker recycling (its default: 1000; 0 = never, to see raw growth)")
    parser.add_argument("--sample-every-s", type=float, default=2.0)
    parser.add_argument("--warmup-fraction", type=float, default=0.1, help="samples left out before growth is measured")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("artifacts/soak"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = asyncio.run(soak(args))
    (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "rss.png")
    summary = {key: value for key, value in result.items() if key not in ("series", "timeline")}
    print(json.dumps(summary, indent=1))
    growth = result["rss_growth_after_warmup"]
    worst = max(growth, key=lambda label: growth[label]) if growth else None
    print(f"worst RSS growth after warm-up: {worst} {growth[worst]:+.1%} (goal <= +10%); "
          f"live sessions at end: {result['live_sessions_at_end']}" if worst else "series too short to measure growth")
    return 0 if result["live_sessions_at_end"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
