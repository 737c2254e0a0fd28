"""Three `python -m env_server` processes on 127.0.0.1 behind one pool (issue 7 "Must show"): sessions
spread, a SIGTERM drain loses nothing, a server added to the name mid-run gets sessions, and a SIGKILLed
server's episodes are replayed elsewhere with unchanged outcomes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from limen.env.v1 import env_pb2, env_pb2_grpc
from trainer_client.env_pool import EnvPool, Episode, Transition

TRANSPORTS = ("stream", "unary")
QUICK = dict(load_poll_interval_s=0.1, resolve_interval_s=0.1, retry_initial_backoff_s=0.01,
             retry_max_backoff_s=0.05)
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """One env server in its own process, as a deployment runs it."""

    def __init__(self, log_dir: Path, name: str) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.log = log_dir / f"{name}.log"
        command = [sys.executable, "-m", "env_server", "--envs", "toy", "--port", self.address.rsplit(":", 1)[1],
                   "--metrics-port", "-1", "--workers", "1", "--drain-grace-s", "60"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.log.open("w"),
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})

    async def load(self) -> env_pb2.GetLoadResponse:
        async with grpc.aio.insecure_channel(self.address) as channel:
            return await env_pb2_grpc.EnvServiceStub(channel).GetLoad(env_pb2.GetLoadRequest(), timeout=5)

    async def wait_started(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while loop.time() < deadline:
            assert self.proc.poll() is None, f"server exited early:\n{self.log.read_text()}"
            try:
                await self.load()
                return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
        raise TimeoutError(f"server {self.address} did not start:\n{self.log.read_text()}")

    async def wait_draining(self) -> None:
        while not (await self.load()).draining:
            await asyncio.sleep(0.05)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest_asyncio.fixture
async def start_servers(tmp_path):
    started: list[ServerProcess] = []

    async def start(count: int) -> list[ServerProcess]:
        servers = [ServerProcess(tmp_path, f"server-{len(started) + i}") for i in range(count)]
        started.extend(servers)
        await asyncio.gather(*(server.wait_started() for server in servers))
        return servers

    yield start
    for server in started:
        server.stop()


async def play_expert(episode: Episode) -> list[Transition]:
    while not episode.done:
        await episode.step(episode.last.info["expert_action"])
    await episode.close()
    return list(episode.transitions)


async def open_many(pool: EnvPool, count: int, offset: int = 0) -> list[Episode]:
    return list(await asyncio.gather(*(pool.open("toy", "train", f"fetch-{3 * (offset + i) + 1:03d}", seed=i)
                                       for i in range(count))))


async def eventually(predicate, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_sessions_spread_across_three_servers(start_servers):
    servers = await start_servers(3)
    async with EnvPool([s.address for s in servers], **QUICK) as pool:
        episodes = await open_many(pool, 30)
        spread = Counter(e.server for e in episodes)
        assert set(spread) == {s.address for s in servers} and max(spread.values()) - min(spread.values()) <= 2
        played = await asyncio.gather(*(play_expert(e) for e in episodes))
        assert all(p[-1].won for p in played)
        assert {address: stats.opened for address, stats in pool.stats.by_server.items()} == spread


@pytest.mark.parametrize("transport", ["stream", pytest.param("unary", marks=pytest.mark.slow)])
async def test_a_draining_server_finishes_its_episodes_and_takes_no_new_ones(start_servers, transport):
    servers = await start_servers(3)
    drained = servers[1]
    async with EnvPool([s.address for s in servers], transport=transport, **QUICK) as pool:
        first_wave = await open_many(pool, 12)
        on_drained = [e for e in first_wave if e.server == drained.address]
        assert on_drained
        for episode in first_wave:
            await episode.step(episode.last.info["expert_action"])

        drained.signal(signal.SIGTERM)
        await drained.wait_draining()
        second_wave = await open_many(pool, 12, offset=12)
        assert drained.address not in {e.server for e in second_wave}

        played = await asyncio.gather(*(play_expert(e) for e in first_wave + second_wave))
        assert all(p[-1].won for p in played)
        # Its live episodes finished where they lived: no session lost, none replayed, none dropped.
        assert all(t.server == drained.address for e in on_drained for t in e.transitions)
        assert (pool.stats.lost, pool.stats.replays, pool.stats.dropped) == (0, 0, 0)
        assert pool.stats.by_server[drained.address].opened == len(on_drained)
    # With its last episode over, the drained server exits on its own, cleanly.
    assert await asyncio.to_thread(drained.proc.wait, 30) == 0


async def test_a_server_added_to_the_name_mid_run_receives_sessions(start_servers):
    servers = await start_servers(3)
    named = [s.address for s in servers]

    async def lookup(host: str, port: int) -> list[str]:
        assert (host, port) == ("toy-headless.test", 50051)
        return list(named)

    async with EnvPool(["dns:///toy-headless.test:50051"], lookup=lookup, **QUICK) as pool:
        first_wave = await open_many(pool, 9)
        assert Counter(e.server for e in first_wave) == Counter({address: 3 for address in named})

        (fourth,) = await start_servers(1)
        named.append(fourth.address)
        await eventually(lambda: "sessions" in pool.servers.get(fourth.address, ""))
        second_wave = await open_many(pool, 3, offset=9)
        assert {e.server for e in second_wave} == {fourth.address}   # the emptiest by far

        # A server that leaves the name keeps its live episodes but takes no new session.
        left = named.pop(0)
        await eventually(lambda: "no longer resolved" in pool.servers[left])
        third_wave = await open_many(pool, 6, offset=12)
        assert left not in {e.server for e in third_wave}

        played = await asyncio.gather(*(play_expert(e) for e in first_wave + second_wave + third_wave))
        assert all(p[-1].won for p in played)
        assert (pool.stats.lost, pool.stats.dropped) == (0, 0)
        # Once its last episode closed, the pool let go of the server that left.
        await eventually(lambda: left not in pool.servers)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_killed_server_loses_no_episode(start_servers, transport):
    servers = await start_servers(3)
    victim = servers[0]
    async with EnvPool([s.address for s in servers], transport=transport, **QUICK) as pool:
        uninterrupted = await asyncio.gather(*(play_expert(e) for e in await open_many(pool, 12)))

        episodes = await open_many(pool, 12)
        for episode in episodes:
            await episode.step(episode.last.info["expert_action"])
        on_victim = [e for e in episodes if e.server == victim.address and not e.done]
        assert on_victim
        victim.signal(signal.SIGKILL)

        played = await asyncio.gather(*(play_expert(e) for e in episodes))
        for before, after in zip(uninterrupted, played):
            assert len(before) == len(after) and all(b.same_outcome(a) for b, a in zip(before, after))
        assert all(e.replays == 1 for e in on_victim)
        assert all(t.server != victim.address for e in on_victim for t in e.transitions[2:])
        assert (pool.stats.replays, pool.stats.dropped) == (len(on_victim), 0)
        # Unary steps are first retried in place (the server might only have blinked); a stream cannot be.
        retries_before_replay = pool.config.retry_attempts - 1 if transport == "unary" else 0
        assert pool.stats.retries == retries_before_replay * len(on_victim)
