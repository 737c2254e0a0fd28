"""WebShop speed: search latency on the 1k catalog, env reset/step latency, and BM25 index build time
on a synthetic 100k-product catalog, extrapolated to the full 1.18M-product catalog.

    WEBSHOP_DATA=DIR .venv/bin/python benchmarks/webshop_speed.py [--products 100000]

Single-threaded on purpose (OMP_WAIT_POLICY=PASSIVE, one BLAS thread): a worker process is one core.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from env_server.envs.webshop.catalog import synthetic_catalog  # noqa: E402
from env_server.envs.webshop.env import WebShopEnv  # noqa: E402
from env_server.envs.webshop.search import BM25Search, analyze, document_text  # noqa: E402

FULL_CATALOG = 1_181_436   # products in items_shuffle.json


def latency_ms(samples_s: list[float]) -> dict[str, float]:
    ms = np.array(samples_s) * 1000
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "n": len(ms)}


def percentiles_ms(samples_s: list[float]) -> str:
    ms = latency_ms(samples_s)
    return f"p50 {ms['p50']:7.2f} ms   p99 {ms['p99']:7.2f} ms   (n={ms['n']})"


def timed(fn, *args):
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def bench_env(episodes: int) -> dict:
    env = WebShopEnv()
    world = env.world
    print(f"world: {world.catalog.source}, {len(world.catalog.products)} products, {len(world.goals)} goals, "
          f"tagger {world.tagger.name}")
    queries = [g.instruction_text.lower() for g in world.goals[:episodes]]
    engine = world._engine        # uncached: the world's LRU would turn repeats into dict hits
    search_times = [timed(engine.search, q)[0] for q in queries]
    print(f"search (BM25 top-50, uncached)  {percentiles_ms(search_times)}")

    # Task ids are numbered across the splits (the real data's test split holds the first goals).
    tasks = [(split, task.task_id) for split, tasks in env.splits().items() for task in tasks.playable][:episodes]
    reset_times, step_times = [], []
    for split, task_id in tasks:
        elapsed, result = timed(env.reset, split, task_id)
        reset_times.append(elapsed)
        while not result.done and "expert_action" in result.info:
            elapsed, result = timed(env.step, result.info["expert_action"])
            step_times.append(elapsed)
    print(f"reset                           {percentiles_ms(reset_times)}")
    print(f"step (expert actions, text)     {percentiles_ms(step_times)}")
    return {"catalog": world.catalog.source, "products": len(world.catalog.products),
            "search_ms": latency_ms(search_times), "reset_ms": latency_ms(reset_times), "step_ms": latency_ms(step_times)}


def bench_index(num_products: int) -> dict:
    """Build, save and load an index; returns its times, and build seconds and matrix bytes per analyzed token."""
    catalog = synthetic_catalog(num_products, seed=1)
    products = catalog.products
    analyze_s, tokens = timed(lambda: [analyze(document_text(p)) for p in products])
    tokens_total = sum(len(t) for t in tokens)
    build_s, engine = timed(BM25Search.build, products)
    with tempfile.TemporaryDirectory() as directory:
        save_s, _ = timed(engine.save, Path(directory))
        load_s, loaded = timed(BM25Search.load, Path(directory))
        matrix_bytes = sum(f.stat().st_size for f in Path(directory).glob("*.npy"))
        queries = ["long lasting shampoo for sensitive skin", "wireless bluetooth headphones", "solid wood console table"]
        query_times = [timed(loaded.search, q)[0] for q in queries * 20]
    scale = FULL_CATALOG / num_products
    print(f"\nindex on a synthetic {num_products:,}-product catalog ({tokens_total / num_products:.0f} tokens/product):")
    print(f"  analyze {analyze_s:6.1f} s   build (incl. analyze) {build_s:6.1f} s   save {save_s:5.2f} s   "
          f"mmap load {load_s:5.2f} s   score matrix {matrix_bytes / 2**20:6.1f} MiB")
    print(f"  search on it: {percentiles_ms(query_times)}")
    print(f"  extrapolated to {FULL_CATALOG:,} products at this document length (x{scale:.1f}): "
          f"build {build_s * scale / 60:5.1f} min, matrix {matrix_bytes * scale / 2**30:5.2f} GiB")
    return {"products": num_products, "analyze_s": analyze_s, "build_s": build_s, "load_s": load_s,
            "matrix_mib": matrix_bytes / 2**20, "search_ms": latency_ms(query_times),
            "full_catalog_build_min_at_this_length": build_s * scale / 60,
            "seconds_per_token": build_s / tokens_total, "bytes_per_token": matrix_bytes / tokens_total}


def real_tokens_per_product() -> float | None:
    try:
        env = WebShopEnv()
    except FileNotFoundError:
        return None
    products = env.world.catalog.products
    if env.world.catalog.source.startswith("synthetic"):
        return None
    return statistics.mean(len(analyze(document_text(p))) for p in products)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=500, help="expert episodes for reset/step latency")
    parser.add_argument("--products", type=int, default=100_000, help="synthetic catalog size for the index build")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    result = {"env": bench_env(args.episodes), "index": bench_index(args.products)}
    seconds_per_token, bytes_per_token = result["index"]["seconds_per_token"], result["index"]["bytes_per_token"]
    real = real_tokens_per_product()
    if real is not None:
        tokens = FULL_CATALOG * real
        result["full_catalog_build_min_at_real_length"] = tokens * seconds_per_token / 60
        print(f"  real 1k catalog documents average {real:.0f} tokens; scaled by tokens, the full catalog "
              f"builds in about {tokens * seconds_per_token / 60:.0f} min (at {1 / seconds_per_token:,.0f} tokens/s) "
              f"with a score matrix of about {tokens * bytes_per_token / 2**30:.2f} GiB")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
