"""Small pieces the benchmarks share: quiet fixed CPU threads, the spread of repeated runs, percentiles.

Benchmarks import it as a sibling module (`python benchmarks/x.py` puts benchmarks/ on sys.path).
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def fix_threads(threads: int = 1) -> None:
    """OpenMP threads that sleep when idle, and a fixed count: other processes share these cores.
    Call before torch or numpy is imported (they read these once)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, str(threads))


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """Median, min and max of one figure over repeated runs (the report shows `median [min, max]`)."""
    if not values:
        raise ValueError("no runs to summarize")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): a value that was actually observed."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q / 100) - 1))]


def add_demo_config_args(parser, default_config: str) -> None:
    """What every benchmark that works from the demo's settings takes: the DemoConfig preset, aliases and
    key=value overrides through the one loader (trainer_client.config), --dry-run, and threads."""
    from trainer_client import config
    from trainer_client.demo import DemoConfig

    config.add_config_arguments(parser, DemoConfig, default_config=default_config, dry_run=True)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (OMP_WAIT_POLICY=PASSIVE is set)")


def load_demo_config(parser, args, extra_overrides: Sequence[str] = ()):
    """Fix torch's threads, then load the DemoConfig; a bad override exits 2 with one line. With --dry-run,
    print the resolved config and exit 0 before any work."""
    import torch

    from trainer_client import config
    from trainer_client.demo import DemoConfig

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(args.threads)
    cfg = config.config_from_args(DemoConfig, parser, args, extra_overrides)
    if args.dry_run:
        config.print_config(cfg)
        raise SystemExit(0)
    return cfg


async def held_out_episodes(cfg, checkpoint: Path, split: str, episodes: int, temperature: float):
    """The demo's held-out evaluation (an EvalResult) of `checkpoint` on the first `episodes` tasks of `split`,
    at `temperature`, on an env server started with the demo's arguments."""
    from trainer_client.demo import demo_env_server, held_out
    from trainer_client.env_pool import EnvPool

    async with demo_env_server(cfg) as address, EnvPool([address]) as pool:
        ids = sorted(await pool.list_tasks(cfg.env, split))[:episodes]
        return await held_out(pool, cfg, ids, checkpoint, temperature, split)


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else what the platform module says)."""
    cpuinfo = "/proc/cpuinfo"
    if os.path.isfile(cpuinfo):
        with open(cpuinfo) as lines:
            name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
        if name:
            return name
    return platform.processor()


def settle_official_alfworld_command(parser, cfg, rl_preset: Path, rl_overrides: Sequence[str], dry_run: bool,
                                     target: str) -> bool:
    """The real-model commands' checks before any work: their RL preset loads with its overrides (a typo fails
    now, not hours in), --dry-run prints the config and ends the command (True), and the official ALFWorld games
    are reachable (ALFWORLD_DATA)."""
    from trainer_client import config
    from trainer_client.train_config import TrainConfig

    try:
        config.load(TrainConfig, rl_preset, list(rl_overrides))
    except config.ConfigError as error:
        config.fail(parser.prog, error)
    if dry_run:
        config.print_config(cfg)
        return True
    if not os.environ.get("ALFWORLD_DATA"):
        parser.error("it plays the official ALFWorld games: set ALFWORLD_DATA to the folder holding json_2.1.1/ "
                     f"(`{target}` does where its DATA_ROOT has them; limen-data fetch alfworld; docs/DATA.md)")
    return False


# The instruction sets a CPU float kernel may dispatch on: two machines that differ in one sum in another order.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def kernel_identity() -> dict:
    """What a run's floats depend on besides its code and inputs: the CPU, the instruction sets its kernels may
    use, torch's version and threads, and this boot of the machine (same-kind CPUs have differed in the last bits)."""
    import torch

    flags: set[str] = set()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as lines:
            flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())
    boot = Path("/proc/sys/kernel/random/boot_id")
    return {"cpu": cpu_model(), "kernel_flags": [f for f in KERNEL_FLAGS if f in flags], "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "boot": boot.read_text().strip() if boot.exists() else ""}


def reference_step_seconds(repeats: int = 3, seed: int = 0) -> float:
    """Seconds for one fixed training step of a tiny Qwen2 (forward + backward, 8 x 256 tokens) at torch's
    current thread count, best of `repeats`: a machine's speed at the work the CPU studies do, so that times
    measured on different machines can be put on one scale (divide by it)."""
    import time

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer_client.policy.tiny import TINY_SIZES

    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(Qwen2Config(**dataclasses.asdict(TINY_SIZES["tiny"]), vocab_size=1024,
                                             tie_word_embeddings=True))
    tokens = torch.randint(0, 1024, (8, 256), generator=generator)
    best = float("inf")
    for _ in range(repeats + 1):                      # the first pass warms up allocators and kernels
        started = time.perf_counter()
        model(input_ids=tokens, labels=tokens).loss.backward()
        best = min(best, time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return best


def commit(paths: Sequence[Path], message: str, attempts: int = 30) -> bool:
    """`git add` then `git commit -- paths` in the repository that holds them: only these paths, whatever else
    is staged or changed in the work tree. False when nothing changed. Waits out another process's index lock."""
    top = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=paths[0].resolve().parent, check=True,
                              capture_output=True, text=True).stdout.strip())
    names = [str(p.resolve().relative_to(top)) for p in paths]
    for attempt in range(attempts):
        if (top / ".git" / "index.lock").exists():
            time.sleep(2)
            continue
        add = subprocess.run(["git", "add", "--", *names], cwd=top, capture_output=True, text=True)
        if add.returncode == 0:
            if subprocess.run(["git", "diff", "--cached", "--quiet", "--", *names], cwd=top).returncode == 0:
                return False
            done = subprocess.run(["git", "commit", "-q", "-m", message, "--", *names], cwd=top,
                                  capture_output=True, text=True)
            if done.returncode == 0:
                return True
            error = done.stderr
        else:
            error = add.stderr
        if "index.lock" not in error:
            raise RuntimeError(f"git in {top} failed: {error.strip()}")
        time.sleep(2)
    raise RuntimeError(f"git in {top}: the index stayed locked for {attempts} attempts")


def pick_games(task_ids: Sequence[str], n: int, seed: int) -> list[str]:
    """n ids spread over the categories (the id's prefix) round-robin, each category's order seeded."""
    by_type: dict[str, list[str]] = {}
    for task_id in sorted(task_ids):
        by_type.setdefault(task_id.split("-", 1)[0], []).append(task_id)
    rng = random.Random(seed)
    queues = [rng.sample(ids, len(ids)) for _, ids in sorted(by_type.items())]
    picked: list[str] = []
    while len(picked) < min(n, len(task_ids)):
        for queue in queues:
            if queue and len(picked) < n:
                picked.append(queue.pop())
    return sorted(picked)
