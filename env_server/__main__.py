"""`limen-env-server` / `python -m env_server`: command line -> ServerConfig -> run until SIGTERM.

Every ServerConfig field is a flag (`max_sessions` -> `--max-sessions`) with the field's help text;
the few structured ones take compact spellings (`--workers toy=1,alfworld=2`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys

from env_server.config import AUTH_TOKEN_ENV, ServerConfig, parse_entry_points, parse_env_options, parse_workers
from env_server.server import run

FLAG_TYPES = {"int": int, "float": float, "str": str, "str | None": str}
# Fields whose flags parse a compact spelling (below) rather than one plain value.
STRUCTURED = {"envs", "entry_points", "env_options", "workers", "workers_by_env"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="limen-env-server", description="Serve limen text environments over gRPC.")
    parser.add_argument("--envs", default="toy", help="comma-separated env names, e.g. toy,alfworld,webshop")
    parser.add_argument("--workers", default="0",
                        help="worker processes per env: N for every env, or ENV=N,... (0 = by core count)")
    parser.add_argument("--env-option", action="append", default=[], metavar="ENV.KEY=VALUE",
                        help="constructor argument of an env, e.g. webshop.observation_mode=text (repeatable)")
    parser.add_argument("--env-entry-point", action="append", default=[], metavar="NAME=module:Class",
                        help="serve an env from outside the package (repeatable)")
    for field in dataclasses.fields(ServerConfig):
        if field.name in STRUCTURED:
            continue
        flag = "--" + field.name.replace("_", "-")
        help_text = field.metadata["help"]
        if field.name == "auth_token":
            help_text += f" (default: ${AUTH_TOKEN_ENV})"
        elif field.default is not None:
            help_text += f" (default: {field.default})"
        parser.add_argument(flag, type=FLAG_TYPES[field.type], default=None, help=help_text)
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    envs = tuple(name.strip() for name in args.envs.split(",") if name.strip())
    workers, workers_by_env = parse_workers(args.workers) if args.workers != "0" else (0, {})
    plain = {field.name: getattr(args, field.name) for field in dataclasses.fields(ServerConfig)
             if field.name not in STRUCTURED and getattr(args, field.name) is not None}
    if "auth_token" not in plain and os.environ.get(AUTH_TOKEN_ENV):
        plain["auth_token"] = os.environ[AUTH_TOKEN_ENV]
    return ServerConfig(envs=envs, workers=workers, workers_by_env=workers_by_env,
                        env_options=parse_env_options(args.env_option),
                        entry_points=parse_entry_points(args.env_entry_point), **plain)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(config))


if __name__ == "__main__":
    sys.exit(main())
