"""A grpc.health.v1 probe for Docker HEALTHCHECK and compose: exit 0 when the service answers SERVING.

`python -m env_server.healthcheck [--address HOST:PORT] [--service NAME]`; the service "" is liveness,
"limen.env.v1.EnvService" readiness (NOT_SERVING while the server is full or draining).
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from limen.env.v1 import env_pb2

LIVENESS_SERVICE = ""
READINESS_SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name  # "limen.env.v1.EnvService"


def probe(address: str, service: str, timeout_s: float) -> str:
    """The health status name the server reports for `service`, e.g. "SERVING" or "NOT_SERVING"."""
    request = health_pb2.HealthCheckRequest(service=service)
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout_s)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m env_server.healthcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--service", default=LIVENESS_SERVICE, help='"" (liveness, default) or a service name')
    parser.add_argument("--timeout-s", type=float, default=3.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = probe(args.address, args.service, args.timeout_s)
    except grpc.RpcError as error:
        print(f"{args.address} {args.service!r}: {error.code().name} {error.details()}", file=sys.stderr)
        return 1
    print(f"{args.address} {args.service!r}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
