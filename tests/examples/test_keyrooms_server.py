"""The keyrooms example env server (JavaScript, examples/keyrooms) as a running node process: the conformance kit
passes against it, and the promises of env.proto that the kit does not check hold too (bearer token, a request
that does not parse, capacity, drain on SIGTERM, finished sessions released with a reason)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from keyrooms_server import EXAMPLE, REPO, keyrooms_server, node_ready
from limen.env.v1 import env_pb2, env_pb2_grpc

S = grpc.StatusCode
SERVICE = "limen.env.v1.EnvService"
TOKEN = "keyrooms-test-token"


def run_conformance_kit(address: str, *extra: str) -> subprocess.CompletedProcess:
    """tests/conformance against the running server, as `make conformance CONFORMANCE_TARGET=...` runs it."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/conformance",
                           "--conformance-target", address, "--conformance-env", "keyrooms", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_the_conformance_kit_passes_against_the_running_example(tmp_path):
    with keyrooms_server(tmp_path, token=TOKEN) as server:
        done = run_conformance_kit(server.address, "--conformance-token", TOKEN)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


def test_the_conformance_kit_fails_without_the_token(tmp_path):
    """The kit can fail against this server: without the bearer token every EnvService call is refused."""
    with keyrooms_server(tmp_path, token=TOKEN) as server:
        done = run_conformance_kit(server.address)
    assert done.returncode != 0 and "UNAUTHENTICATED" in done.stdout + done.stderr


def test_the_example_passes_its_own_unit_tests():
    node = node_ready()
    done = subprocess.run([node, "--test", "test/"], cwd=EXAMPLE, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def stub_for(address: str) -> tuple[grpc.Channel, env_pb2_grpc.EnvServiceStub]:
    channel = grpc.insecure_channel(address)
    return channel, env_pb2_grpc.EnvServiceStub(channel)


def code_of(call) -> grpc.StatusCode:
    """The status code a call (a function of no arguments) fails with."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()


def readiness(channel: grpc.Channel, service: str = SERVICE) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def reset(stub, task_id: str = "one-lock-001", **fields) -> env_pb2.Transition:
    return stub.Reset(env_pb2.ResetRequest(env="keyrooms", split="test", task_id=task_id, **fields), timeout=10)


def test_token_guards_the_env_service_but_not_health(tmp_path):
    bearer = (("authorization", f"Bearer {TOKEN}"),)
    with keyrooms_server(tmp_path, token=TOKEN) as server:
        channel, stub = stub_for(server.address)
        with channel:
            assert code_of(lambda: stub.ListEnvs(env_pb2.ListEnvsRequest(), timeout=10)) == S.UNAUTHENTICATED
            wrong = (("authorization", "Bearer nope"),)
            assert code_of(lambda: stub.GetLoad(env_pb2.GetLoadRequest(), timeout=10, metadata=wrong)) == S.UNAUTHENTICATED
            assert stub.GetLoad(env_pb2.GetLoadRequest(), timeout=10, metadata=bearer).capacity == 256
            # Probes cannot send metadata: liveness and readiness answer without the token.
            assert readiness(channel, "") == readiness(channel) == health_pb2.HealthCheckResponse.SERVING


def test_a_request_that_does_not_parse_is_invalid_argument(tmp_path):
    with keyrooms_server(tmp_path) as server, grpc.insecure_channel(server.address) as channel:
        raw_reset = channel.unary_unary(f"/{SERVICE}/Reset", request_serializer=None, response_deserializer=None)
        assert code_of(lambda: raw_reset(b"\x0a\xff\xff\xff", timeout=10)) == S.INVALID_ARGUMENT  # field 1 claims more bytes than sent


def test_full_server_refuses_resets_and_is_not_ready(tmp_path):
    with keyrooms_server(tmp_path, "--max-sessions", "2") as server:
        channel, stub = stub_for(server.address)
        with channel:
            first, second = reset(stub), reset(stub)
            assert code_of(lambda: reset(stub)) == S.RESOURCE_EXHAUSTED
            assert readiness(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            assert readiness(channel, "") == health_pb2.HealthCheckResponse.SERVING  # full is busy, not broken
            stub.Close(env_pb2.CloseRequest(session_id=first.session_id), timeout=10)
            assert readiness(channel) == health_pb2.HealthCheckResponse.SERVING
            assert reset(stub).step_index == 0
            stub.Close(env_pb2.CloseRequest(session_id=second.session_id), timeout=10)


def test_reset_requests_the_proto_refuses(tmp_path):
    with keyrooms_server(tmp_path) as server:
        channel, stub = stub_for(server.address)
        with channel:
            episode_id = uuid.uuid4().hex
            first = reset(stub, episode_id=episode_id)
            assert reset(stub, episode_id=episode_id).session_id == first.session_id
            assert code_of(lambda: reset(stub, "two-locks-002", episode_id=episode_id)) == S.INVALID_ARGUMENT
            assert code_of(lambda: reset(stub, max_turns=-1)) == S.INVALID_ARGUMENT
            assert code_of(lambda: reset(stub, options={"size": "large"})) == S.INVALID_ARGUMENT
            assert code_of(lambda: reset(stub, episode_id="x" * 257)) == S.INVALID_ARGUMENT
            # Once its episode ended, the id is not started over: FAILED_PRECONDITION until the session goes.
            ended_id = uuid.uuid4().hex
            short = reset(stub, episode_id=ended_id, max_turns=1)
            stub.Step(env_pb2.StepRequest(session_id=short.session_id, step_index=1, action=b"look"), timeout=10)
            assert code_of(lambda: reset(stub, episode_id=ended_id, max_turns=1)) == S.FAILED_PRECONDITION
            stub.Close(env_pb2.CloseRequest(session_id=short.session_id), timeout=10)
            assert reset(stub, episode_id=ended_id, max_turns=1).session_id != short.session_id


def test_a_finished_session_frees_its_slot_and_is_released_after_its_grace(tmp_path):
    with keyrooms_server(tmp_path, "--finished-grace-s", "1") as server:
        channel, stub = stub_for(server.address)
        with channel:
            first = reset(stub, max_turns=1)
            last = stub.Step(env_pb2.StepRequest(session_id=first.session_id, step_index=1, action=b"look"), timeout=10)
            assert last.truncated and stub.GetLoad(env_pb2.GetLoadRequest(), timeout=10).active_sessions == 0
            time.sleep(2.5)  # the grace, plus the server's one-second sweep
            with pytest.raises(grpc.RpcError) as caught:
                stub.Step(env_pb2.StepRequest(session_id=first.session_id, step_index=1, action=b"look"), timeout=10)
            assert caught.value.code() == S.NOT_FOUND and "released after 1 s" in caught.value.details()


def test_sigterm_drains_live_episodes_then_stops(tmp_path):
    with keyrooms_server(tmp_path, "--drain-grace-s", "30") as server:
        channel, stub = stub_for(server.address)
        with channel:
            live = reset(stub)
            server.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while readiness(channel) != health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < deadline, "readiness stayed SERVING after SIGTERM"
                time.sleep(0.05)
            assert code_of(lambda: reset(stub)) == S.UNAVAILABLE
            assert stub.GetLoad(env_pb2.GetLoadRequest(), timeout=10).draining
            # The live episode goes on; closing it lets the server stop before its grace is over.
            step = stub.Step(env_pb2.StepRequest(session_id=live.session_id, step_index=1, action=b"look"), timeout=10)
            assert step.step_index == 1
            stub.Close(env_pb2.CloseRequest(session_id=live.session_id), timeout=10)
        assert server.process.wait(15) == 0, server.output()
