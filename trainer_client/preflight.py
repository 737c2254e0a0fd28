"""The static checks of `--dry-run` that every limen command run from a config shares.

The checks start nothing, load no weights and contact nothing: a preset, a checkpoint or a split that does not
exist is found before a server starts or a model loads. Splits are checked against what a local server would
serve (read from disk and the server's own flags), or, when the run names servers, against the split names
the env can serve at all (a remote server's data is not visible from here). What an env serves is the env's
own declaration, read through the env registry (`registry.offline_splits`): nothing here knows an env by name.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainer_client import config
from trainer_client.tiny_model import tiny_model_cache, tiny_model_size


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


# ---- envs and splits ----------------------------------------------------------------------------------------


def known_splits(env: str) -> frozenset[str] | None:
    """Every split name `env` can serve with any data (for remote servers); None for an env that declares none."""
    from env_server import registry

    declared = registry.offline_splits(env)
    return declared.names if declared else None


def local_splits(env: str, server_args: Sequence[str], report: Preflight) -> frozenset[str] | None:
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
    declared = registry.offline_splits(env)
    if declared is None:
        return None
    options = dict(server.env_options.get(env, {}))
    try:
        return declared.served_by(options)
    except (TypeError, ValueError) as error:
        report.problems.append(f"{env} options {options}: {error}")
        return None


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
    if split in names:
        report.notes.append(f"{what} {split!r}: served by {where}")
        return
    hint = "" if servers else missing_data_hint(env, split)
    report.problems.append(f"{what} {split!r} is not a split {where} serves: {sorted(names)}"
                           + (f" ({hint})" if hint else ""))


def missing_data_hint(env: str, split: str) -> str:
    """What the env says to do when a local server lacks `split` for want of data; "" when it says nothing."""
    from env_server import registry

    declared = registry.offline_splits(env)
    return declared.data_hint if declared and split in declared.data_splits else ""


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
    if cfg.init == "sft":
        report.notes.append(f"init sft: model.path is first fine-tuned on expert play of env.train_split "
                            f"({cfg.sft.episodes or 'every'} episodes, {cfg.sft.epochs:g} epochs); made on first use "
                            f"(minutes), cached under $LIMEN_CACHE/warm-starts (trainer_client/warm_start.py)")
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
