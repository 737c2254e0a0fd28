"""Where a `limen-train` run starts from, said in one line; with `init: sft`, a supervised warm start first.

`init: sft` fine-tunes model.path on expert play of env.train_split (the demo's recipe: trainer_client/experts.py
then trainer_client/sft.py, with the run's own prompt layout) before RL. The result is made once and cached under
$LIMEN_CACHE/warm-starts, keyed by everything that shapes it (base weights, env version, the games played, the SFT
settings, the prompt layout, the seed), so a second run with the same settings starts at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from trainer_client import config, tiny_model
from trainer_client.experts import expert_episodes, expert_samples
from trainer_client.local_server import local_env_server, open_env_pool
from trainer_client.policy import Policy
from trainer_client.prompts import PromptConfig
from trainer_client.sft import fit
from trainer_client.sft_config import SFTConfig, expert_tasks
from trainer_client.train_config import EnvConfig, TrainConfig

RECORD_FILE = "warm_start.json"
"""Written last into a finished warm start: how it was made (and the mark that it is complete)."""


@dataclass(frozen=True)
class StartingPoint:
    """The model a run loads, and the line it prints about it."""
    path: str
    line: str


@dataclass(frozen=True)
class WarmStart:
    """A finished SFT warm start: the checkpoint and how it was made."""
    path: Path
    episodes: int
    turns: int
    seconds: float
    loss_first: float
    loss_last: float
    cached: bool = False


def warm_start_cache() -> Path:
    return tiny_model.tiny_model_cache().parent / "warm-starts"


def fingerprint(model_path: str) -> str:
    """What identifies the base weights: a local directory by its files' names, sizes and times (a retrained
    checkpoint at the same path is another base), a hub name by itself."""
    folder = Path(model_path).expanduser()
    if not folder.is_dir():
        return model_path
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return json.dumps([[str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns] for p in files])


def recipe_key(base: str, env: str, split: str, env_version: str, task_ids: Sequence[str], settings: SFTConfig,
               prompts: PromptConfig, seed: int) -> str:
    """The cache key: a digest of everything the warm start's weights depend on."""
    recipe = json.dumps({"base": fingerprint(base), "env": env, "split": split, "env_version": env_version,
                         "tasks": list(task_ids), "sft": config.to_dict(settings),
                         "prompt": config.to_dict(prompts), "seed": seed}, sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def read_warm_start(folder: Path) -> WarmStart:
    record = json.loads((folder / RECORD_FILE).read_text())
    return WarmStart(folder, record["episodes"], record["turns"], record["seconds"], record["loss_first"],
                     record["loss_last"], cached=True)


def save_warm_start(policy: Policy, out: Path, made: WarmStart, recipe: dict) -> WarmStart:
    """Saved under a staging name and renamed, the record written last: a killed build leaves no entry that
    looks finished, and of two concurrent builds of one recipe the first to finish wins."""
    staging = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    policy.save(staging)
    (staging / RECORD_FILE).write_text(json.dumps({
        "episodes": made.episodes, "turns": made.turns, "seconds": made.seconds, "loss_first": made.loss_first,
        "loss_last": made.loss_last, **recipe}, indent=2))
    try:
        staging.rename(out)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return read_warm_start(out)
    return made


async def sft_warm_start(base: str, env: str, split: str, servers: Sequence[str], server_args: Sequence[str],
                         settings: SFTConfig, prompts: PromptConfig, seed: int, load_kwargs: dict | None = None,
                         console: Console | None = None) -> WarmStart:
    """`base` fine-tuned on expert play of env/split with the run's prompt layout: from the cache, or made now
    (as the demo makes its warm start) and cached."""
    async with open_env_pool(servers, [env], server_args) as pool:
        env_version = (await pool.list_envs())[env].version
        task_ids = expert_tasks(await pool.list_tasks(env, split), settings.episodes, seed)
        key = recipe_key(base, env, split, env_version, task_ids, settings, prompts, seed)
        out = warm_start_cache() / f"{env}-{split}-sft-{key}"
        if (out / RECORD_FILE).is_file():
            return read_warm_start(out)
        print(f"warm start: none cached for this recipe; making it now (expert play of {len(task_ids)} {env} "
              f"episodes, then SFT; once, cached under {out.parent})", file=sys.stderr)
        started = time.perf_counter()
        experts = await expert_episodes(pool, env, split, task_ids, seed, mistake_rate=settings.mistake_rate)
    if not experts:
        raise RuntimeError(f"expert play of {env}/{split} gave no episodes to warm-start from")
    policy = Policy.load(base, **(load_kwargs or {}))
    samples = expert_samples(policy.tokenizer, experts, prompts)
    losses = fit(policy, samples, settings, seed=seed, console=console)
    made = WarmStart(out, len(experts), len(samples), time.perf_counter() - started, losses[0], losses[-1])
    recipe = {"base": base, "env": env, "split": split, "env_version": env_version,
              "sft": config.to_dict(settings), "seed": seed}
    return save_warm_start(policy, out, made, recipe)


# ---- the one line a run prints about where it starts ---------------------------------------------------------


def warm_start_line(start: WarmStart) -> str:
    how = "cached; made" if start.cached else "made now"
    return (f"warm start: SFT checkpoint {start.path} ({how} from {start.episodes} expert episodes, "
            f"{start.turns} turns, in {start.seconds:.0f} s; SFT loss {start.loss_first:.2f} -> {start.loss_last:.3f})")


def plain_start_line(spec: str, path: str) -> str:
    """The line for a run without a warm start: a tiny model is random weights, and says what that means."""
    if tiny_model.tiny_model_size(spec) is not None:
        return (f"starting from random weights ({spec}, built at {path}): expect ~0 valid replies; "
                f"init=sft warm-starts it from expert play first")
    return f"starting from {path}"


# ---- resolving a run's starting point ---------------------------------------------------------------------------


@asynccontextmanager
async def env_servers(env: EnvConfig, seed: int) -> AsyncIterator[tuple[str, ...]]:
    """The run's servers, or one local server for building the start (the tiny model and the warm start share
    it). Its hash seed is fixed as the demo fixes it: ALFWorld's expert then plays the same way every time."""
    if env.servers:
        yield env.servers
        return
    async with local_env_server([env.name], env.server_args, extra_env={"PYTHONHASHSEED": str(seed)}) as address:
        yield (address,)


async def starting_point(cfg: TrainConfig, console: Console | None = None) -> StartingPoint:
    """What the run loads: model.path, a tiny-model spec built (or taken from its cache), and with init: sft
    that model's warm start (made now, or taken from its cache)."""
    spec, env = cfg.model.path, cfg.env
    if tiny_model.tiny_model_size(spec) is None and cfg.init != "sft":
        return StartingPoint(spec, plain_start_line(spec, spec))
    async with env_servers(env, cfg.seed) as servers:
        base = spec
        if tiny_model.tiny_model_size(spec) is not None:
            base = str(await tiny_model.build_tiny_model(spec, env.name, env.train_split, servers, env.server_args,
                                              cfg.prompt, cfg.seed))
        if cfg.init != "sft":
            return StartingPoint(base, plain_start_line(spec, base))
        made = await sft_warm_start(base, env.name, env.train_split, servers, env.server_args, cfg.sft, cfg.prompt,
                                    cfg.seed, cfg.model.load_kwargs(), console)
    return StartingPoint(str(made.path), warm_start_line(made))
