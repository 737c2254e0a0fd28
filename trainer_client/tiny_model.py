"""The `tiny-model:SIZE` model spec of the CPU presets: a model path that names a checkpoint built on first use.

policy/tiny.py builds a tiny checkpoint from texts; this module gathers those texts from expert play through an
env pool (which the policy layer never touches) and caches the result by its recipe.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

from trainer_client import config

TINY_MODEL_PREFIX = "tiny-model:"
# Expert episodes whose text the tiny model's tokenizer is trained on (the demo trains on its SFT episodes).
TINY_MODEL_EPISODES = 48


def tiny_model_size(spec: str) -> str | None:
    """`tiny-model:SIZE` -> SIZE; None for any other model path."""
    return spec[len(TINY_MODEL_PREFIX):] if spec.startswith(TINY_MODEL_PREFIX) else None


def tiny_model_cache() -> Path:
    root = os.environ.get("LIMEN_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "limen") / "tiny-models"


async def build_tiny_model(spec: str, env: str, split: str, servers: Sequence[str], server_args: Sequence[str],
                           prompts, seed: int = 0, episodes: int = TINY_MODEL_EPISODES) -> Path:
    """The checkpoint a `tiny-model:SIZE` spec names: a random-init tiny Qwen2 model whose tokenizer is trained
    on the text of expert play of `env`/`split` (as the demo builds its model), made once and cached by
    everything that shapes it (env version included), so later runs start at once."""
    from trainer_client.experts import expert_episodes, expert_texts
    from trainer_client.local_server import open_env_pool
    from trainer_client.policy.tiny import build_tiny_checkpoint

    size = tiny_model_size(spec)
    async with open_env_pool(servers, [env], server_args) as pool:
        version = (await pool.list_envs())[env].version
        recipe = json.dumps([env, split, version, size, seed, episodes, config.to_dict(prompts)], sort_keys=True)
        out = tiny_model_cache() / f"{env}-{split}-{size}-{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"
        if (out / "config.json").is_file():
            return out
        task_ids = sorted(await pool.list_tasks(env, split))
        played = random.Random(seed).sample(task_ids, min(episodes, len(task_ids)))
        experts = await expert_episodes(pool, env, split, played, seed)
    texts = [text for pair in expert_texts(experts, prompts) for text in pair]
    if not texts:
        raise RuntimeError(f"expert play of {env}/{split} gave no text to train the tiny model's tokenizer on")
    staging = out.with_name(f"{out.name}.tmp{os.getpid()}")
    build_tiny_checkpoint(texts, staging, size=size, seed=seed)
    try:
        staging.rename(out)
    except OSError:  # a concurrent build of the same recipe got there first: use that one
        shutil.rmtree(staging, ignore_errors=True)
    return out


def resolve_tiny_model(spec: str, env: str, split: str, servers: Sequence[str], server_args: Sequence[str],
                       prompts, seed: int = 0) -> str:
    """The model path to load: `spec` itself unless it is a tiny-model spec, then the built checkpoint."""
    if tiny_model_size(spec) is None:
        return spec
    return str(asyncio.run(build_tiny_model(spec, env, split, servers, server_args, prompts, seed)))
