"""The pool a trainer holds: one object over every env server the targets name, which opens episodes on
the least-loaded host, lists envs and tasks, and keeps loads and discovery fresh in the background.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping

from limen.env.v1 import env_pb2
from trainer_client.env_pool.broker import SessionBroker
from trainer_client.env_pool.config import PoolConfig
from trainer_client.env_pool.discovery import HostLookup, system_lookup
from trainer_client.env_pool.episode import Episode, EpisodeRecipe
from trainer_client.env_pool.errors import NoServerAvailable, SessionLost, StepTimedOut, Unauthenticated
from trainer_client.env_pool.servers import Server, ServerSet
from trainer_client.env_pool.stats import Counters, PoolStats
from trainer_client.env_pool.transport import Calls
from trainer_client.env_pool.replies import EnvInfo, env_info_from_proto

log = logging.getLogger(__name__)


class EnvPool:
    """Sessions over every server the targets name, placed by load and pinned where they live.

    `targets`: "host:port" / "dns:///name:port" entries (a list, or one comma-separated string).
    `lookup`: resolves dns:/// names; tests pass their own table. Other keywords override `config`.
    """

    def __init__(self, targets: str | Iterable[str], config: PoolConfig | None = None, *,
                 lookup: HostLookup = system_lookup, **overrides) -> None:
        self.config = dataclasses.replace(config or PoolConfig(), **overrides)
        self._servers = ServerSet(targets, self.config, lookup)
        self._counters = Counters()
        self._calls = Calls(self.config, self._counters)
        self._broker = SessionBroker(self.config, self._servers, self._calls, self._counters)
        self._episodes: set[Episode] = set()
        self._loops: list[asyncio.Task] = []

    # ---- life cycle ---------------------------------------------------------------------------------
    async def __aenter__(self) -> EnvPool:
        try:
            await self.start()
        except BaseException:
            await self.aclose()   # the channels opened so far
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Resolve the targets and poll every server once; then keep both fresh in the background."""
        await self._servers.refresh()
        deadline, wait = time.monotonic() + self.config.start_resolve_s, self.config.retry_initial_backoff_s
        while not len(self._servers) and time.monotonic() < deadline:
            await asyncio.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            wait = min(2 * wait, self.config.retry_max_backoff_s)
            await self._servers.refresh()
        if not len(self._servers):
            raise NoServerAvailable(f"no address resolves from {', '.join(map(str, self._servers.targets))} "
                                    f"(asked for {self.config.start_resolve_s:g} s)")
        refused = self._servers.refusing_our_credentials()
        if refused:
            raise Unauthenticated("servers refuse our credentials: " + "; ".join(refused))
        self._servers.check_versions_agree()
        self._loops.append(asyncio.create_task(_every(self.config.load_poll_interval_s, self._servers.poll_all)))
        if any(target.dynamic for target in self._servers.targets):
            self._loops.append(asyncio.create_task(_every(self.config.resolve_interval_s, self._servers.refresh)))

    async def aclose(self) -> None:
        for loop_task in self._loops:
            loop_task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await asyncio.gather(*(episode.close() for episode in list(self._episodes)), return_exceptions=True)
        await self._broker.finish_chores()
        await self._servers.close()

    # ---- what a trainer calls -----------------------------------------------------------------------
    async def open(self, env: str, split: str, task_id: str, *, seed: int = 0, max_turns: int = 0,
                   options: Mapping[str, str] | None = None, episode_id: str | None = None) -> Episode:
        """Start an episode on the least-loaded server that hosts `env`; `episode.first` is the reset."""
        if not self._loops:
            raise RuntimeError("the pool is not started: use `async with EnvPool(...)` or await start()")
        if max_turns < 0:
            raise ValueError(f"max_turns must be >= 0, got {max_turns}")
        spec = EpisodeRecipe(env, split, task_id, seed, max_turns, dict(options or {}),
                           episode_id or uuid.uuid4().hex)
        episode = await Episode.open(self._broker, spec, on_end=self._episodes.discard)
        self._episodes.add(episode)
        return episode

    async def list_envs(self) -> dict[str, EnvInfo]:
        """Every env the reachable servers host (in the version this run uses)."""
        await self._servers.poll_all()
        hosts: defaultdict[str, list[Server]] = defaultdict(list)
        for server in self._servers.reachable():
            for name, info in server.envs.items():
                if self._servers.version_allowed(name, info.version):
                    hosts[name].append(server)
        if not hosts:
            raise NoServerAvailable("no server answers: " + self._servers.describe_all())
        return {name: env_info_from_proto(servers[0].envs[name], (s.address for s in servers))
                for name, servers in sorted(hosts.items())}

    async def list_tasks(self, env: str, split: str) -> list[str]:
        """The playable task ids of one split, in the server's stable order (every page)."""
        failures = []
        for server in self._servers.hosts(env):
            try:
                return await self._all_task_ids(server, env, split)
            except (NoServerAvailable, SessionLost, StepTimedOut) as error:
                failures.append(str(error))
        raise NoServerAvailable(f"no server answered ListTasks for {env!r}: "
                                + "; ".join(failures or [self._servers.describe_all()]))

    @property
    def stats(self) -> PoolStats:
        return self._counters.snapshot()

    @property
    def versions(self) -> dict[str, str]:
        """env -> the version this run is pinned to (the first one seen)."""
        return self._servers.pinned_versions

    @property
    def servers(self) -> dict[str, str]:
        """address -> its state in words, for logs and error messages."""
        return self._servers.describe()

    async def _all_task_ids(self, server: Server, env: str, split: str) -> list[str]:
        task_ids, token = [], ""
        while True:
            request = env_pb2.ListTasksRequest(env=env, split=split, page_size=0, page_token=token)
            page = await self._calls.unary(server, "ListTasks", request, phase="query")
            task_ids.extend(page.task_ids)
            token = page.next_page_token
            if not token:
                return task_ids


async def _every(interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await job()
        except Exception:   # a monitor that stops silently would freeze placement; log and go on
            log.exception("env pool background job failed")
