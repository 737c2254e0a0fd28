"""The servers behind one pool: which addresses the targets name, a channel and the last known load of
each, the env versions this run is pinned to, and which of them a new session may go to, least loaded first.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from limen.env.v1 import env_pb2, env_pb2_grpc
from trainer_client.env_pool.config import PoolConfig
from trainer_client.env_pool.discovery import HostLookup, Target, parse_targets, resolve
from trainer_client.env_pool.errors import MixedVersions, UnknownEnvOrTask


@dataclass(frozen=True)
class ServerLoad:
    """A server's load as placement sees it: the last GetLoad plus sessions this pool opened since."""

    address: str
    active: int
    capacity: int
    draining: bool

    @property
    def has_room(self) -> bool:
        return not self.draining and self.active < self.capacity


def placement_order(loads: Iterable[ServerLoad], avoid: frozenset[str] = frozenset()) -> list[str]:
    """Servers that can take a session, least loaded (by fill fraction, then count) first. `avoid` (the
    server an episode was just lost on) goes last rather than out: it may be the only one left."""
    open_servers = [load for load in loads if load.has_room]
    open_servers.sort(key=lambda s: (s.address in avoid, s.active / s.capacity, s.active, s.address))
    return [s.address for s in open_servers]


@dataclass(eq=False)
class Server:
    """One server address with its channel and what the pool knows of it."""

    address: str
    channel: grpc.aio.Channel
    stub: env_pb2_grpc.EnvServiceStub
    server_id: str = ""
    envs: dict[str, env_pb2.EnvInfo] = field(default_factory=dict)
    load: env_pb2.GetLoadResponse | None = None   # None: no answer at the last poll
    failure: grpc.StatusCode | None = None        # the last poll's error code
    problem: str = "not polled yet"
    # Sessions the last poll may not count: resets still in flight, and resets answered since it was sent.
    # Both only ever over-estimate the load (the server may count some already), never under-estimate.
    resetting: int = 0
    opened_since_poll: int = 0
    refused: bool = False                         # refused a session since the last poll
    live: int = 0                                 # this pool's sessions on it
    retired: bool = False                         # no target names it any more: no new sessions

    def load_view(self) -> ServerLoad | None:
        if self.load is None or self.retired or self.refused:
            return None
        return ServerLoad(self.address, self.estimated_active, self.load.capacity, self.load.draining)

    @property
    def estimated_active(self) -> int:
        return self.load.active_sessions + self.resetting + self.opened_since_poll

    def describe(self) -> str:
        if self.retired:
            return f"{self.address}: no longer resolved"
        if self.load is None or self.refused:
            return f"{self.address}: {self.problem}"
        if self.load.draining:
            return f"{self.address}: draining"
        return f"{self.address}: {self.estimated_active}/{self.load.capacity} sessions"


class ServerSet:
    """Every server the targets name: resolved again by `refresh`, polled by `poll_all`, and closed by `close`.

    `targets`: "host:port" / "dns:///name:port" entries (a list, or one comma-separated string).
    """

    def __init__(self, targets: str | Iterable[str], config: PoolConfig, lookup: HostLookup) -> None:
        self.config = config
        self.targets: tuple[Target, ...] = parse_targets(targets)
        self._lookup = lookup
        self._servers: dict[str, Server] = {}
        self._pinned_versions: dict[str, str] = {}
        self._metadata = config.call_metadata()
        self._credentials = _channel_credentials(config)

    def __getitem__(self, address: str) -> Server:
        return self._servers[address]

    def __len__(self) -> int:
        return len(self._servers)

    def describe(self) -> dict[str, str]:
        """address -> its state in words, for logs and error messages."""
        return {address: server.describe() for address, server in sorted(self._servers.items())}

    def describe_all(self) -> str:
        return "; ".join(self.describe().values()) or "no servers"

    def refusing_our_credentials(self) -> list[str]:
        return [s.describe() for s in self._servers.values() if s.failure is grpc.StatusCode.UNAUTHENTICATED]

    # ---- which servers may take a session -------------------------------------------------------------
    def reachable(self) -> list[Server]:
        return [s for s in self._servers.values() if s.load is not None and not s.retired]

    def hosts(self, env: str) -> list[Server]:
        """Reachable, current servers hosting `env` in an allowed version. Raises when every server
        answered and none hosts it: waiting would not help."""
        reachable = self.reachable()
        hosts = [s for s in reachable if env in s.envs and self.version_allowed(env, s.envs[env].version)]
        if not hosts and reachable and len(reachable) == sum(not s.retired for s in self._servers.values()):
            hosted = sorted({name for s in reachable for name in s.envs})
            raise UnknownEnvOrTask(f"no server hosts env {env!r} (in version "
                                   f"{self._pinned_versions.get(env, 'any')}); hosted: {hosted}")
        return hosts

    def placement(self, env: str, avoid: frozenset[str]) -> list[Server]:
        """The hosts of `env` with room, in the order to try them."""
        loads = [view for view in (server.load_view() for server in self.hosts(env)) if view is not None]
        return [self._servers[address] for address in placement_order(loads, avoid)]

    def only_full(self, env: str) -> bool:
        """Some server hosting `env` answers and is not draining: it refused for want of room only."""
        return any(not server.load.draining for server in self.hosts(env))

    # ---- versions: one run, one version of each env ------------------------------------------------
    def version_allowed(self, env: str, version: str) -> bool:
        """Whether `version` of `env` may be used; the first version seen is pinned for the run."""
        return self.config.allow_mixed_versions or self._pinned_versions.setdefault(env, version) == version

    @property
    def pinned_versions(self) -> dict[str, str]:
        return dict(self._pinned_versions)

    def check_versions_agree(self) -> None:
        seen: defaultdict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for server in self.reachable():
            for name, info in server.envs.items():
                seen[name][info.version].append(server.address)
        mixed = {name: dict(by_version) for name, by_version in seen.items() if len(by_version) > 1}
        if mixed and not self.config.allow_mixed_versions:
            raise MixedVersions(f"servers disagree on env versions {mixed}; pass allow_mixed_versions=True "
                                "to train on a mix")

    # ---- discovery and load polls --------------------------------------------------------------------
    async def refresh(self) -> None:
        """Resolve the targets again: dial new addresses, retire the ones no target names any more."""
        addresses = await resolve(self.targets, self._lookup)
        fresh = [self._add(address) for address in addresses if address not in self._servers]
        for address, server in self._servers.items():
            server.retired = address not in addresses
        await asyncio.gather(*(self._poll(server) for server in fresh))
        await self._remove_idle_retired()

    async def poll_all(self) -> None:
        await asyncio.gather(*(self._poll(server) for server in list(self._servers.values())))
        await self._remove_idle_retired()

    async def close(self) -> None:
        await asyncio.gather(*(server.channel.close() for server in self._servers.values()))
        self._servers.clear()

    def _add(self, address: str) -> Server:
        options = self.config.channel_options()
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(address, options=options)
        else:
            channel = grpc.aio.secure_channel(address, self._credentials, options=options)
        server = Server(address, channel, env_pb2_grpc.EnvServiceStub(channel))
        self._servers[address] = server
        return server

    async def _remove_idle_retired(self) -> None:
        idle = [s for s in self._servers.values() if s.retired and s.live <= 0]
        for server in idle:
            del self._servers[server.address]
        await asyncio.gather(*(server.channel.close() for server in idle))

    async def _poll(self, server: Server) -> None:
        opened_before = server.opened_since_poll
        timeout, metadata = self.config.query_timeout_s, self._metadata
        try:
            load = await server.stub.GetLoad(env_pb2.GetLoadRequest(), timeout=timeout, metadata=metadata)
            if load.server_id != server.server_id or not server.envs:
                # A new server behind this address (a restarted pod) may host other envs or versions.
                listing = await server.stub.ListEnvs(env_pb2.ListEnvsRequest(), timeout=timeout, metadata=metadata)
                server.envs = {info.name: info for info in listing.envs}
        except grpc.aio.AioRpcError as error:
            server.load, server.failure = None, error.code()
            server.problem = f"unreachable: {error.code().name}: {error.details()}"
            return
        server.server_id, server.load, server.failure = load.server_id, load, None
        # Sessions opened while the poll was in flight are not in its count yet; keep those.
        server.opened_since_poll = max(0, server.opened_since_poll - opened_before)
        server.refused, server.problem = False, ""


def _channel_credentials(config: PoolConfig) -> grpc.ChannelCredentials | None:
    if not (config.tls_root_cert or config.tls_client_cert):
        return None
    return grpc.ssl_channel_credentials(*(
        Path(pem).read_bytes() if pem else None
        for pem in (config.tls_root_cert, config.tls_client_key, config.tls_client_cert)))
