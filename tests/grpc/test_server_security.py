"""Bearer token on every EnvService call (health stays open), TLS, and mutual TLS, over real channels."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from limen.env.v1 import env_pb2

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for test certs")


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A P-256 certificate for 127.0.0.1/localhost that is its own CA; returns (cert, key)."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)
    return cert, key


def reset_request() -> env_pb2.ResetRequest:
    return env_pb2.ResetRequest(env="toy", split="train", task_id="goto-000")


async def test_every_env_call_needs_the_bearer_token_but_health_does_not(launch):
    async with launch(auth_token="s3cret") as server:
        for metadata in [(), (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)]:
            error = await server.error(server.stub.Reset(reset_request(), metadata=metadata))
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in error.details()
        stream = server.stub.Episode(iter([env_pb2.EpisodeRequest(reset=reset_request())]))
        assert (await server.error(stream.read())).code() == grpc.StatusCode.UNAUTHENTICATED
        assert (await server.error(server.load())).code() == grpc.StatusCode.UNAUTHENTICATED

        first = await server.stub.Reset(reset_request(), metadata=(("authorization", "Bearer s3cret"),))
        assert first.session_id
        liveness = await server.health.Check(health_pb2.HealthCheckRequest(service=""))
        assert liveness.status == health_pb2.HealthCheckResponse.SERVING
        errors = server.running.backend.metrics.registry.get_sample_value(
            "limen_errors_total", {"method": "Reset", "code": "UNAUTHENTICATED"})
        assert errors == 3


async def test_tls_serves_trusting_clients_only(launch, tmp_path):
    cert, key = self_signed(tmp_path, "server")
    trusting = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    async with launch(tls_cert=str(cert), tls_key=str(key), channel_credentials=trusting) as server:
        assert (await server.stub.Reset(reset_request())).session_id
        async with grpc.aio.insecure_channel(server.running.address) as plaintext:
            error = await server.error(plaintext.unary_unary("/limen.env.v1.EnvService/GetLoad")(b"", timeout=5))
            assert error.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_refuses_clients_without_a_certificate_it_trusts(launch, tmp_path):
    server_cert, server_key = self_signed(tmp_path, "server")
    client_cert, client_key = self_signed(tmp_path, "client")
    stranger_cert, stranger_key = self_signed(tmp_path, "stranger")
    credentials = {
        name: grpc.ssl_channel_credentials(root_certificates=server_cert.read_bytes(),
                                           private_key=key.read_bytes() if key else None,
                                           certificate_chain=cert.read_bytes() if cert else None)
        for name, cert, key in [("client", client_cert, client_key), ("stranger", stranger_cert, stranger_key),
                                ("anonymous", None, None)]
    }
    async with launch(tls_cert=str(server_cert), tls_key=str(server_key), tls_client_ca=str(client_cert),
                      channel_credentials=credentials["client"]) as server:
        assert (await server.stub.Reset(reset_request())).session_id
        for refused in ("stranger", "anonymous"):
            async with grpc.aio.secure_channel(server.running.address, credentials[refused]) as channel:
                call = channel.unary_unary("/limen.env.v1.EnvService/GetLoad")(b"", timeout=5)
                assert (await server.error(call)).code() == grpc.StatusCode.UNAVAILABLE
