"""The server as a process: `python -m env_server` flags, its start line, SIGTERM drain, exit code 0,
and no worker outliving it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from env_server.__main__ import build_parser, config_from_args
from env_server.server import READINESS_SERVICE
from limen.env.v1 import env_pb2, env_pb2_grpc

START_TIMEOUT_S = 30


class ServerProcess:
    def __init__(self, *flags: str) -> None:
        command = [sys.executable, "-m", "env_server", "--envs", "toy", "--port", "0", "--metrics-port", "-1",
                   "--workers", "1", *flags]  # a later --envs wins
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        self.address = self._read_address()

    def _read_address(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if match := re.search(r"listening on (\S+) ", line):
                return match.group(1)
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"the server did not start (exit code {self.proc.poll()})")

    async def exit_code(self, timeout: float = 20) -> int:
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


@pytest.fixture
def server_process():
    started = []

    def start(*flags: str) -> ServerProcess:
        started.append(ServerProcess(*flags))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def episode_request(**reset_or_step) -> env_pb2.EpisodeRequest:
    if "action" in reset_or_step:
        return env_pb2.EpisodeRequest(step=env_pb2.StepRequest(**reset_or_step))
    return env_pb2.EpisodeRequest(reset=env_pb2.ResetRequest(env="toy", split="train", **reset_or_step))


async def test_sigterm_drains_live_episodes_refuses_new_ones_and_exits_0(server_process):
    server = server_process("--drain-grace-s", "20")
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub, health = env_pb2_grpc.EnvServiceStub(channel), health_pb2_grpc.HealthStub(channel)
        worker_pids = [w.pid for w in (await stub.GetLoad(env_pb2.GetLoadRequest())).workers]
        call = stub.Episode()
        await call.write(episode_request(task_id="fetch-001"))
        transition = await call.read()

        server.proc.send_signal(signal.SIGTERM)
        readiness = health_pb2.HealthCheckRequest(service=READINESS_SERVICE)
        while (await health.Check(readiness)).status != health_pb2.HealthCheckResponse.NOT_SERVING:
            await asyncio.sleep(0.05)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Reset(env_pb2.ResetRequest(env="toy", split="train", task_id="goto-000"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        while not (transition.terminated or transition.truncated):  # the live episode plays to its end
            await call.write(episode_request(step_index=transition.step_index + 1,
                                             action=transition.info["expert_action"].encode()))
            transition = await call.read()
        assert transition.won
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
    assert await server.exit_code() == 0
    assert not any(psutil.pid_exists(pid) for pid in worker_pids)


async def test_the_drain_grace_bounds_how_long_a_live_episode_keeps_the_server(server_process):
    server = server_process("--drain-grace-s", "0.5", "--stop-grace-s", "0.5")
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        await stub.Reset(env_pb2.ResetRequest(env="toy", split="train", task_id="goto-000"))  # never finished
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert await server.exit_code() == 0
        assert time.monotonic() - started < 10


async def test_a_worker_stuck_in_a_step_dies_with_a_killed_server(server_process):
    server = server_process("--envs", "faulty", "--env-entry-point", "faulty=env_server.envs.testing:FaultyEnv")
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        first = await stub.Reset(env_pb2.ResetRequest(env="faulty", split="train", task_id="goto-000"))
        worker = psutil.Process((await stub.GetLoad(env_pb2.GetLoadRequest())).workers[0].pid)
        hung = asyncio.ensure_future(stub.Step(env_pb2.StepRequest(session_id=first.session_id, step_index=1,
                                                                    action=b"hang")))
        await asyncio.sleep(0.3)
        os.kill(server.proc.pid, signal.SIGKILL)
        await server.exit_code()
        with pytest.raises(grpc.aio.AioRpcError):
            await hung
    worker.wait(timeout=10)  # a hung worker never reads its socket's EOF: the kernel ends it with its parent


def test_start_line_and_bad_flags(server_process):
    server = server_process("--workers", "toy=1")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", server.address)
    failed = subprocess.run([sys.executable, "-m", "env_server", "--workers", "toy=zero"], capture_output=True,
                            text=True, timeout=30)
    assert failed.returncode == 2 and "expected a whole number" in failed.stderr


def test_flags_map_onto_the_config(monkeypatch):
    monkeypatch.setenv("LIMEN_AUTH_TOKEN", "from-env")
    args = build_parser().parse_args([
        "--envs", "toy,webshop", "--workers", "toy=1,webshop=3", "--max-sessions", "64", "--idle-ttl-s", "30",
        "--env-option", "webshop.observation_mode=text", "--env-option", "webshop.num_products=1000",
        "--env-entry-point", "faulty=env_server.envs.testing:FaultyEnv", "--host", "0.0.0.0",
        "--max-connection-age-s", "300", "--max-connection-age-grace-s", "900"])
    config = config_from_args(args)
    assert config.envs == ("toy", "webshop") and config.host == "0.0.0.0"
    assert (config.workers_for("toy"), config.workers_for("webshop")) == (1, 3)
    assert config.env_options["webshop"] == {"observation_mode": "text", "num_products": 1000}
    assert config.entry_points == {"faulty": "env_server.envs.testing:FaultyEnv"}
    assert (config.max_sessions, config.idle_ttl_s, config.max_connection_age_grace_s) == (64, 30.0, 900.0)
    assert config.auth_token == "from-env" and "from-env" not in repr(config)
    assert config_from_args(build_parser().parse_args(["--auth-token", "flag"])).auth_token == "flag"


@pytest.mark.parametrize("flags, reason", [
    (["--envs", "toy", "--workers", "webshop=2"], "not served"),
    (["--env-option", "webshop"], "ENV.KEY=VALUE"),
    (["--tls-cert", "cert.pem"], "go together"),
    (["--max-action-bytes", "8388608"], "must exceed max_action_bytes"),
    (["--step-timeout-s", "0"], "must be > 0"),
])
def test_bad_flag_combinations_are_refused(flags, reason):
    with pytest.raises(ValueError, match=reason):
        config_from_args(build_parser().parse_args(flags))
