"""Start an env server as a child process on a free loopback port, for runs given no `--env-servers`, and
open the env pool on the servers given or on that local one; `EnvTarget` is the env section of the commands
that play one split of one env there (limen-eval, the SFT command).

The trainer then talks to it over a real gRPC channel, exactly as it would to a pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trainer_client.env_pool import EnvPool, PoolConfig

READINESS_SERVICE = "limen.env.v1.EnvService"


@dataclass(frozen=True)
class EnvTarget:
    """One split of one env, on the servers named or on a local server started for the command."""

    name: str = "alfworld"
    split: str = "valid_seen"
    servers: tuple[str, ...] = ()
    """host:port or dns:///name:port targets; empty starts a local env server."""
    server_args: tuple[str, ...] = ()
    """Extra flags for the local env server, e.g. ["--workers", "2"]."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_until_serving(address: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the env server exited with code {process.returncode} before serving")
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=READINESS_SERVICE), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the env server at {address} was not serving after {timeout_s:.0f} s")
            await asyncio.sleep(0.2)


def die_with_parent() -> None:
    """Runs in the child before exec: on Linux, SIGTERM it (so it drains) when the trainer dies, even by kill -9,
    instead of leaving an orphan server and its workers running."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@contextlib.asynccontextmanager
async def local_env_server(envs: Sequence[str], extra_args: Sequence[str] = (), log_file: Path | None = None,
                           start_timeout_s: float = 900.0,
                           extra_env: Mapping[str, str] | None = None) -> AsyncIterator[str]:
    """Yields the address of a `python -m env_server` child (this environment plus `extra_env`); drains it
    (SIGTERM) on exit."""
    port = free_port()
    command = [sys.executable, "-m", "env_server", "--envs", ",".join(envs), "--port", str(port),
               "--metrics-port", "-1", *extra_args]
    log = open(log_file, "ab") if log_file else subprocess.DEVNULL
    process = subprocess.Popen(command, stdout=log, stderr=log, env={**os.environ, **(extra_env or {})},
                               preexec_fn=die_with_parent)
    address = f"127.0.0.1:{port}"
    try:
        await wait_until_serving(address, process, start_timeout_s)
        yield address
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                process.kill()
        if log is not subprocess.DEVNULL:
            log.close()


@contextlib.asynccontextmanager
async def open_env_pool(servers: Sequence[str], envs: Sequence[str], server_args: Sequence[str] = (),
                        pool_config: PoolConfig | None = None, log_file: Path | None = None) -> AsyncIterator[EnvPool]:
    """An EnvPool on `servers`, or, when none are given, on a local env server started for the command (and
    drained when the pool closes): what every command that takes `env.servers` does."""
    async with contextlib.AsyncExitStack() as stack:
        targets = list(servers) or [await stack.enter_async_context(
            local_env_server(envs, server_args, log_file=log_file))]
        yield await stack.enter_async_context(EnvPool(targets, pool_config or PoolConfig()))
