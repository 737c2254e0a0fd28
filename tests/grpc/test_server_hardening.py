"""Hardening on every RPC, over real channels: the bearer token, the size limit, requests that do not
parse, request text echoed in errors, loopback by default, and mutual TLS end to end through the EnvPool."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import shutil
import subprocess
import sys

import grpc
import psutil
import pytest

from limen.env.v1 import env_pb2
from test_server_security import self_signed
from trainer_client.env_pool import EnvPool, NoServerAvailable

SERVICE = "/limen.env.v1.EnvService/"
TOKEN = "s3cret"
CALL_TIMEOUT_S = 30.0
# One well-formed request per RPC; each would succeed or fail on its own merits once authenticated.
REQUESTS: dict[str, bytes] = {
    "ListEnvs": env_pb2.ListEnvsRequest().SerializeToString(),
    "ListTasks": env_pb2.ListTasksRequest(env="toy", split="train").SerializeToString(),
    "Reset": env_pb2.ResetRequest(env="toy", split="train", task_id="goto-000").SerializeToString(),
    "Step": env_pb2.StepRequest(session_id="unknown", step_index=1, action=b"look").SerializeToString(),
    "Close": env_pb2.CloseRequest(session_id="unknown").SerializeToString(),
    "GetLoad": env_pb2.GetLoadRequest().SerializeToString(),
    "Episode": env_pb2.EpisodeRequest(reset=env_pb2.ResetRequest(
        env="toy", split="train", task_id="goto-000")).SerializeToString(),
}
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for test certs")


async def status_of(channel: grpc.aio.Channel, method: str, body: bytes, metadata=()) -> grpc.StatusCode:
    """The status one call of `method` ends with (Episode: a stream of that one message)."""
    try:
        if method == "Episode":
            stream = channel.stream_stream(SERVICE + method)(iter([body]), metadata=metadata, timeout=CALL_TIMEOUT_S)
            async for _ in stream:
                pass
        else:
            await channel.unary_unary(SERVICE + method)(body, metadata=metadata, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def unknown_field(size: int) -> bytes:
    """Field 99 with `size` bytes: every request type parses it (and ignores it), so it pads any request."""
    length, value = bytearray(), size
    while value > 0x7F:   # the base-128 varint of the length
        length.append(value & 0x7F | 0x80)
        value >>= 7
    return b"\x9a\x06" + bytes(length) + bytes([value]) + b"x" * size


@pytest.mark.parametrize("method", sorted(REQUESTS))
async def test_every_rpc_needs_the_token_before_anything_else(launch, method):
    async with launch(auth_token=TOKEN) as server:
        for metadata in [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)]:
            assert await status_of(server.channel, method, REQUESTS[method], metadata) \
                == grpc.StatusCode.UNAUTHENTICATED
        # Even a request that does not parse is refused for its missing token first.
        assert await status_of(server.channel, method, b"\xff\xff\xff") == grpc.StatusCode.UNAUTHENTICATED
        authorized = await status_of(server.channel, method, REQUESTS[method], (("authorization", f"Bearer {TOKEN}"),))
        assert authorized in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND)   # Step/Close name no session


async def test_every_rpc_refuses_a_message_over_the_size_limit(launch):
    limit = 64 * 1024
    async with launch(max_message_bytes=limit) as server:
        for method in REQUESTS:
            over = unknown_field(limit) + REQUESTS[method]
            assert await status_of(server.channel, method, over) == grpc.StatusCode.RESOURCE_EXHAUSTED
            under = unknown_field(limit // 2) + REQUESTS[method]
            assert await status_of(server.channel, method, under) != grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await server.load()).active_sessions <= 1   # only the accepted Reset's session, if any


@pytest.mark.parametrize("method", sorted(REQUESTS))
async def test_a_request_that_does_not_parse_is_invalid_argument(server, method):
    for garbage in (b"\xff\xff\xff", b"\n\x05to"):   # a corrupt tag; a field cut short
        assert await status_of(server.channel, method, garbage) == grpc.StatusCode.INVALID_ARGUMENT
    if method in ("Reset", "Episode"):   # bad UTF-8 in a string field (ResetRequest.task_id)
        bad_task_id = b"\x1a\x02\xff\xfe"
        body = bad_task_id if method == "Reset" else b"\x0a" + bytes([len(bad_task_id)]) + bad_task_id
        assert await status_of(server.channel, method, body) == grpc.StatusCode.INVALID_ARGUMENT


async def test_huge_request_fields_get_their_own_code_with_short_details(server):
    huge = "../" * 100_000
    digits = env_pb2.ListTasksRequest(env="toy", split="train", page_token="9" * 5000)
    for call, code in [(server.reset(huge), grpc.StatusCode.NOT_FOUND),
                       (server.step(huge, 1, "look"), grpc.StatusCode.NOT_FOUND),
                       (server.stub.ListTasks(digits), grpc.StatusCode.INVALID_ARGUMENT)]:
        error = await server.error(call)
        # Not RESOURCE_EXHAUSTED (details over the client's trailer limit) nor INTERNAL (int() of 5,000 digits).
        assert error.code() == code and len(error.details()) < 600


async def test_reset_options_an_env_does_not_take_are_invalid_argument(launch):
    async with launch(envs=("alfworld",), entry_points={}, reset_timeout_s=120) as server:
        split = next(iter(server.running.backend.groups["alfworld"].description.splits))
        task_id = (await server.stub.ListTasks(env_pb2.ListTasksRequest(env="alfworld", split=split,
                                                                        page_size=1))).task_ids[0]
        error = await server.error(server.reset(task_id, env="alfworld", split=split, options={"x": "y"}))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "takes no reset options" in error.details()
        assert (await server.reset(task_id, env="alfworld", split=split)).session_id   # the worker is fine


async def test_the_server_listens_on_loopback_only_by_default():
    # Every flag at its default except the ports (0: free ones), so the defaults decide the address.
    process = subprocess.Popen([sys.executable, "-m", "env_server", "--port", "0", "--metrics-port", "0",
                                "--workers", "1"], stderr=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(_line_matching, process, "listening on"), 60)
        assert re.search(r"listening on 127\.0\.0\.1:\d+ ", line)
        listening = [c.laddr for c in psutil.Process(process.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert len(listening) == 2 and all(is_loopback(address.ip) for address in listening)   # gRPC + metrics
    finally:
        process.kill()
        process.wait(30)
        process.stderr.close()


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback   # gRPC may bind ::ffff:127.0.0.1


def _line_matching(process: subprocess.Popen, text: str) -> str:
    for line in process.stderr:
        if text in line:
            return line
    raise RuntimeError(f"the server exited ({process.poll()}) before logging {text!r}")


@needs_openssl
async def test_mutual_tls_and_token_end_to_end_through_the_env_pool(launch, tmp_path):
    server_cert, server_key = self_signed(tmp_path, "server")
    client_cert, client_key = self_signed(tmp_path, "client")
    stranger_cert, stranger_key = self_signed(tmp_path, "stranger")
    trusted = grpc.ssl_channel_credentials(server_cert.read_bytes(), client_key.read_bytes(), client_cert.read_bytes())
    async with launch(tls_cert=str(server_cert), tls_key=str(server_key),
                      tls_client_ca=str(client_cert), auth_token=TOKEN, channel_credentials=trusted) as server:
        address = server.running.address
        async with EnvPool([address], tls_root_cert=str(server_cert), tls_client_cert=str(client_cert),
                           tls_client_key=str(client_key), auth_token=TOKEN) as pool:
            episode = await pool.open("toy", "train", "fetch-001")
            while not episode.done:
                await episode.step(episode.last.info["expert_action"])
            assert episode.last.won
            await episode.close()
        for identity in [dict(tls_client_cert=str(stranger_cert), tls_client_key=str(stranger_key)), {}]:
            async with EnvPool([address], tls_root_cert=str(server_cert), auth_token=TOKEN, placement_rounds=1,
                               **identity) as refused:
                with pytest.raises(NoServerAvailable, match="unreachable"):
                    await refused.open("toy", "train", "fetch-001")


# ---- issue 40: bounded reset fields, unknown options, page tokens, duplicate tokens ------------------------
async def test_episode_id_and_reset_options_over_their_limits_are_invalid_argument(server):
    too_long = [({"episode_id": "e" * 1_000_000}, "episode_id is 1000000 bytes"),
                ({"episode_id": "é" * 129}, "episode_id is 258 bytes"),   # bytes, not characters
                ({"options": {"reset_delay_s": "0" * 2_000_000}}, "reset options are 2000013 bytes"),
                ({"options": {"x" * 2_000_000: "1"}}, "reset options are 2000001 bytes")]
    for fields, details in too_long:
        for env in ("toy", "faulty"):
            error = await server.error(server.reset(env=env, **fields))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and details in error.details()
    assert (await server.load()).active_sessions == 0
    at_limits = await server.reset(env="faulty", episode_id="e" * 256, options={"reset_delay_s": "0" * 4000})
    assert at_limits.episode_id == "e" * 256


async def test_reset_option_keys_an_env_does_not_read_are_refused_with_the_keys_it_reads(server):
    error = await server.error(server.reset(env="faulty", options={"reset_delay_s": "0", "colour": "red"}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "faulty takes only the reset options ['reset_delay_s']; got ['colour']" in error.details()
    error = await server.error(server.reset(env="toy", options={"colour": "red"}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "toy takes no reset options" in error.details()
    assert (await server.load()).active_sessions == 0
    assert (await server.reset(env="faulty", options={"reset_delay_s": "0"})).session_id


async def test_list_tasks_takes_ascii_digits_only_as_a_page_token(server):
    request = env_pb2.ListTasksRequest(env="toy", split="train", page_size=2)
    assert (await server.stub.ListTasks(request)).next_page_token == "2"
    for token in ("٣", "３", "1٣"):   # Arabic-Indic and fullwidth digits: str.isdecimal() takes both
        request.page_token = token
        error = await server.error(server.stub.ListTasks(request))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not one this server issued" in error.details()
    request.page_token = "3"
    assert (await server.stub.ListTasks(request)).next_page_token == "5"


async def test_more_than_one_authorization_entry_is_refused(launch):
    right, wrong = ("authorization", f"Bearer {TOKEN}"), ("authorization", "Bearer wrong")
    async with launch(auth_token=TOKEN) as server:
        for method in ("GetLoad", "Episode"):
            assert await status_of(server.channel, method, REQUESTS[method], (right,)) == grpc.StatusCode.OK
            for metadata in [(wrong, right), (right, wrong), (right, right)]:
                assert await status_of(server.channel, method, REQUESTS[method], metadata) \
                    == grpc.StatusCode.UNAUTHENTICATED
        error = await server.error(server.stub.GetLoad(env_pb2.GetLoadRequest(), metadata=(wrong, right)))
        assert "2 'authorization' metadata entries" in error.details()
