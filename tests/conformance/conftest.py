"""Where the conformance suite points: a given server address, or an in-process server it starts.

    pytest tests/conformance                                   # in-process server, toy env
    pytest tests/conformance --conformance-env alfworld,webshop  # in-process, each env in turn
    pytest tests/conformance --conformance-target host:port --conformance-env webshop --conformance-split test

Every option has an environment variable twin (LIMEN_CONFORMANCE_TARGET, _ENV, _SPLIT, _TOKEN, _SESSIONS).
"""

from __future__ import annotations

import contextlib
import os

import grpc
import pytest
import pytest_asyncio

from limen.env.v1 import env_pb2, env_pb2_grpc
from .kit import DEFAULT_CONCURRENT_SESSIONS, ConformanceTarget, default_split

OPTIONS = {
    "target": "host:port of a running server; none: start one in-process",
    "env": "comma-separated env names to check (default: toy)",
    "split": "split to play (default: the env's first split with tasks)",
    "token": "bearer token, for a server started with --auth-token",
    "sessions": "sessions the concurrency check opens at once (default: 200, or what capacity allows)",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "limen conformance suite")
    for name, help_text in OPTIONS.items():
        group.addoption(f"--conformance-{name}", default=None, help=f"{help_text} [env LIMEN_CONFORMANCE_{name.upper()}]")


def conformance_option(config: pytest.Config, name: str) -> str | None:
    """The option, else its environment variable; None when neither is set to something non-empty.
    getoption's default covers runs from the repo root, where this conftest loads after option parsing."""
    value = config.getoption(f"--conformance-{name}", default=None) or os.environ.get(f"LIMEN_CONFORMANCE_{name.upper()}")
    return value or None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_env" in metafunc.fixturenames:
        envs = (conformance_option(metafunc.config, "env") or "toy").split(",")
        metafunc.parametrize("conformance_env", [e.strip() for e in envs if e.strip()], scope="module")


@contextlib.asynccontextmanager
async def in_process_server(env: str):
    from env_server.config import ServerConfig
    from env_server.server import serve

    async with serve(ServerConfig(envs=(env,), port=0, metrics_port=-1, workers=1)) as running:
        yield running.address


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def conformance(request: pytest.FixtureRequest, conformance_env: str):
    """A ConformanceTarget: the address, env and split under test, with a channel to them."""
    address = conformance_option(request.config, "target")
    token = conformance_option(request.config, "token")
    async with contextlib.AsyncExitStack() as stack:
        if address is None:
            address = await stack.enter_async_context(in_process_server(conformance_env))
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(address))
        stub = env_pb2_grpc.EnvServiceStub(channel)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        listing = await stub.ListEnvs(env_pb2.ListEnvsRequest(), timeout=30, metadata=metadata)
        split = conformance_option(request.config, "split") or default_split(listing, conformance_env)
        sessions = int(conformance_option(request.config, "sessions") or DEFAULT_CONCURRENT_SESSIONS)
        yield ConformanceTarget(address, conformance_env, split, channel, stub, metadata, listing, sessions)
