"""What every limen command that runs from a config shares beyond the loader: the env section of the one-env
commands, the static checks of `--dry-run`, and the `tiny-model:SIZE` model spec of the CPU presets.

The checks start nothing, load no weights and contact nothing: a preset, a checkpoint or a split that does not
exist is found before a server starts or a model loads. Splits are checked against what a local server would
serve (read from disk and the server's own flags), or, when the run names servers, against the split names
the env can serve at all (a remote server's data is not visible from here).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainer_client import config

TINY_MODEL_PREFIX = "tiny-model:"
# Expert episodes whose text the tiny model's tokenizer is trained on (the demo trains on its SFT episodes).
TINY_MODEL_EPISODES = 48
# ALFWorld's official release (env_server.data lists the three with known digests; `train` is unhashed).
ALFWORLD_OFFICIAL_SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")


@dataclass(frozen=True)
class EnvTarget:
    """One split of one env, on the servers named or on a local server started for the command."""

    name: str = "alfworld"
    split: str = "valid_seen"
    servers: tuple[str, ...] = ()
    """host:port or dns:///name:port targets; empty starts a local env server."""
    server_args: tuple[str, ...] = ()
    """Extra flags for the local env server, e.g. ["--workers", "2"]."""


@dataclass
class Preflight:
    """What a dry run found: notes to show, problems that stop the command (exit 2)."""

    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def fail_if_any(self, prog: str) -> None:
        if self.problems:
            config.fail(prog, "; ".join(self.problems))

    def show(self, file=None) -> None:
        for note in self.notes:
            print(f"# dry-run: {note}", file=file or sys.stdout)

    def settle(self, prog: str, resolved, dry_run: bool) -> bool:
        """What every checked command does before its work: on a dry run print the resolved config and the
        notes; exit 2 on any problem. True when the command stops here (a dry run that passed)."""
        if dry_run:
            config.print_config(resolved)
            self.show()
        self.fail_if_any(prog)
        return dry_run


# ---- models ------------------------------------------------------------------------------------------------


def tiny_model_size(spec: str) -> str | None:
    """`tiny-model:SIZE` -> SIZE; None for any other model path."""
    return spec[len(TINY_MODEL_PREFIX):] if spec.startswith(TINY_MODEL_PREFIX) else None


def check_model(path: str, what: str, report: Preflight) -> None:
    """A checkpoint directory (config.json in it), a tiny-model spec, or a hub name (not checked: no network)."""
    from trainer_client.policy.tiny import TINY_SIZES

    size = tiny_model_size(path)
    path = str(Path(path).expanduser()) if path and size is None else path   # as Policy.load reads it
    if size is not None:
        if size not in TINY_SIZES:
            report.problems.append(f"{what} {path}: unknown tiny size {size!r}; known: {sorted(TINY_SIZES)}")
        else:
            report.notes.append(f"{what} {path}: built on first use from expert play, cached under "
                                f"{tiny_model_cache()}")
    elif not path:
        report.problems.append(f"{what} is empty: give a checkpoint directory, a hub name or tiny-model:SIZE")
    elif Path(path).exists():
        if not (Path(path) / "config.json").is_file():
            report.problems.append(f"{what} {path} is not a model checkpoint (no config.json in it)")
        else:
            report.notes.append(f"{what} {path}: a checkpoint directory")
    elif looks_like_hub_name(path):
        report.notes.append(f"{what} {path}: a hub name, fetched when the run starts (not checked here)")
    else:
        report.problems.append(f"{what} {path} does not exist")


def looks_like_hub_name(path: str) -> bool:
    """`org/name`: what the HF hub takes, and what no local path spelled relative to here would look like."""
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not path.startswith((".", "~")) and not path.endswith((".yaml", ".json"))


def tiny_model_cache() -> Path:
    root = os.environ.get("LIMEN_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "limen") / "tiny-models"


async def build_tiny_model(spec: str, env: str, split: str, servers: Sequence[str], server_args: Sequence[str],
                           prompts, seed: int = 0, episodes: int = TINY_MODEL_EPISODES) -> Path:
    """The checkpoint a `tiny-model:SIZE` spec names: a random-init tiny Qwen2 model whose tokenizer is trained
    on the text of expert play of `env`/`split` (as the demo builds its model), made once and cached by
    everything that shapes it (env version included), so later runs start at once."""
    from trainer_client.local_server import open_env_pool
    from trainer_client.policy.tiny import build_tiny_checkpoint
    from trainer_client.experts import expert_episodes, expert_texts

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


# ---- envs and splits ----------------------------------------------------------------------------------------


def known_splits(env: str) -> set[str] | None:
    """Every split name `env` can serve with any data (for remote servers); None for an env not known here."""
    if env == "alfworld":
        return set(ALFWORLD_OFFICIAL_SPLITS) | {"gen_train", "gen_test"}
    if env == "webshop":
        from env_server.envs.webshop.goals import split_ranges
        return set(split_ranges(10_000))
    if env == "toy":
        from env_server.envs.toy import SPLIT_SIZES
        return set(SPLIT_SIZES)
    return None


def local_splits(env: str, server_args: Sequence[str], report: Preflight) -> set[str] | None:
    """The splits a local server started with `server_args` would serve, from the disk and its flags (no
    game is generated, no catalog is read); None when that cannot be told without starting one."""
    from env_server import registry
    from env_server.__main__ import build_parser, config_from_args

    try:
        args = build_parser().parse_args(["--envs", env, *server_args])
        server = config_from_args(args)
    except (SystemExit, ValueError) as error:
        report.problems.append(f"env.server_args {list(server_args)} are not valid server flags ({error})")
        return None
    if env not in registry.ENV_ENTRY_POINTS and env not in server.entry_points:
        report.problems.append(f"env {env!r} is not registered; registered: {sorted(registry.ENV_ENTRY_POINTS)}")
        return None
    options = dict(server.env_options.get(env, {}))
    if env == "alfworld":
        from env_server.envs.alfworld.env import AlfWorldConfig
        from env_server.envs.alfworld.games import SPLIT_ROOT
        try:
            config = AlfWorldConfig(**options)
        except (TypeError, ValueError) as error:
            report.problems.append(f"alfworld options {options}: {error}")
            return None
        root = config.official_root()
        names = {p.name for p in (root / SPLIT_ROOT).iterdir() if p.is_dir()} if root else set()
        if config.generated if config.generated is not None else root is None:
            names |= set(config.generated_splits())
        return names
    return known_splits(env)


def check_split(env: str, split: str, what: str, servers: Sequence[str], server_args: Sequence[str],
                report: Preflight) -> None:
    if servers:
        names, where = known_splits(env), f"any {env} server"
        if names is None:
            report.notes.append(f"{what} {split!r} of env {env!r}: not checked (an env this trainer does not know; "
                                f"the servers say at the start)")
            return
    else:
        names, where = local_splits(env, server_args, report), "the local server"
        if names is None:
            return
    if split not in names:
        hint = ""
        if env == "alfworld" and not servers and split in ALFWORLD_OFFICIAL_SPLITS:
            hint = " (official games need ALFWORLD_DATA with json_2.1.1/; see limen-data fetch alfworld)"
        report.problems.append(f"{what} {split!r} is not a split {where} serves: {sorted(names)}{hint}")
    else:
        report.notes.append(f"{what} {split!r}: served by {where}")


def check_servers(servers: Sequence[str], report: Preflight) -> None:
    from trainer_client.env_pool.discovery import parse_targets

    if not servers:
        report.notes.append("env.servers empty: a local env server is started for the run")
        return
    try:
        parse_targets(list(servers))
    except ValueError as error:
        report.problems.append(f"env.servers: {error}")
        return
    report.notes.append(f"env.servers {list(servers)}: not contacted by a dry run")


# ---- whole commands ------------------------------------------------------------------------------------------


def check_train(cfg) -> Preflight:
    """limen-train's dry run: the model, the algorithm, the env's splits and servers of a TrainConfig."""
    from trainer_client.train_config import group_size_of

    report = Preflight()
    check_model(cfg.model.path, "model.path", report)
    try:
        group_size_of(cfg)
    except (KeyError, ValueError) as error:
        report.problems.append(str(error).strip("'\""))
    check_servers(cfg.env.servers, report)
    check_split(cfg.env.name, cfg.env.train_split, "env.train_split", cfg.env.servers, cfg.env.server_args, report)
    if cfg.env.eval_split:
        check_split(cfg.env.name, cfg.env.eval_split, "env.eval_split", cfg.env.servers, cfg.env.server_args, report)
    for split in cfg.env.report_splits:
        check_split(cfg.env.name, split, "env.report_splits", cfg.env.servers, cfg.env.server_args, report)
    return report


def check_eval(job) -> Preflight:
    """limen-eval's dry run: the checkpoint, the run config and the split of an EvalJob."""
    report = Preflight()
    check_model(job.checkpoint, "checkpoint", report)
    if tiny_model_size(job.checkpoint) is not None:
        report.problems.append(f"checkpoint {job.checkpoint}: evaluate a trained checkpoint, not an untrained tiny model")
    if job.run_config and not Path(job.run_config).is_file():
        report.problems.append(f"run_config {job.run_config} does not exist")
    check_servers(job.env.servers, report)
    check_split(job.env.name, job.env.split, "env.split", job.env.servers, job.env.server_args, report)
    return report


def check_sft(job) -> Preflight:
    """The SFT command's dry run: the starting checkpoint, and the expert data (a file, or a split to play)."""
    report = Preflight()
    check_model(job.checkpoint, "checkpoint", report)
    if job.data:
        if not Path(job.data).is_file():
            report.problems.append(f"data {job.data} does not exist")
    else:
        check_servers(job.env.servers, report)
        check_split(job.env.name, job.env.split, "env.split", job.env.servers, job.env.server_args, report)
    return report
