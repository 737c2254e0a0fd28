"""What an episode needs of its pool: a session placed on the least-loaded host, each reply checked
against the run's env version, and the session given back (at once, or in the background when given up).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from limen.env.v1 import env_pb2
from trainer_client.env_pool.config import PoolConfig, backoff_s
from trainer_client.env_pool.errors import MixedVersions, NoServerAvailable
from trainer_client.env_pool.servers import ServerSet
from trainer_client.env_pool.stats import Counters
from trainer_client.env_pool.transport import Calls, SessionHandle
from trainer_client.env_pool.replies import Transition, transition_from_proto


class SessionBroker:
    def __init__(self, config: PoolConfig, servers: ServerSet, calls: Calls, counters: Counters) -> None:
        self.config = config
        self._servers = servers
        self._calls = calls
        self._counters = counters
        self._chores: set[asyncio.Task] = set()   # closes of abandoned sessions, run in the background

    async def open(self, request: env_pb2.ResetRequest,
                   avoid: frozenset[str]) -> tuple[SessionHandle, env_pb2.Transition]:
        """A new session answering `request`, and its reset. `avoid`: servers to try last."""
        # Full servers are back-pressure, not failure: while some host is up and merely full, the wait for a
        # slot (up to reset_timeout_s) uses up no placement round, so a burst of episodes queues instead of
        # dropping the ones that found no room.
        deadline = asyncio.get_running_loop().time() + self.config.reset_timeout_s
        failed_rounds = attempt = 0
        while failed_rounds < self.config.placement_rounds:
            if attempt:
                await asyncio.sleep(backoff_s(self.config, attempt))
                await self._servers.poll_all()
            attempt += 1
            for server in self._servers.placement(request.env, avoid):
                session = self._calls.new_session(server)
                # Reserve the slot before awaiting, so that concurrent opens spread instead of all
                # picking the server that looked emptiest before any of them landed.
                server.resetting += 1
                try:
                    first = await session.reset(request)
                except BaseException as error:
                    await session.close()
                    if not isinstance(error, NoServerAvailable):
                        raise
                    server.refused, server.problem = True, str(error)   # full or draining: try the next
                    continue
                finally:
                    server.resetting -= 1
                server.opened_since_poll += 1
                server.live += 1
                self._counters.count("opened", server.address)
                return session, first
            if not (self._servers.only_full(request.env) and asyncio.get_running_loop().time() < deadline):
                failed_rounds += 1
        raise NoServerAvailable(f"no server took a {request.env!r} session in {self.config.placement_rounds} "
                                f"rounds: {self._servers.describe_all()}")

    def accept(self, reply: env_pb2.Transition, env: str, episode_id: str, session: SessionHandle) -> Transition:
        """A reply of `session` as the trainer sees it, after the version check that keeps one run on one
        version of `env`."""
        server = session.server.address
        if not self._servers.version_allowed(reply.env or env, reply.version):
            raise MixedVersions(f"{server} answered {env!r} in version {reply.version!r}, but "
                                f"this run uses {self._servers.pinned_versions[env]!r}")
        if reply.step_index:
            self._counters.count("steps", server)
        return transition_from_proto(reply, episode_id=episode_id, server=server)

    async def release(self, session: SessionHandle) -> None:
        """Close a session the episode is done with."""
        session.server.live -= 1
        self._counters.count("closed")
        await session.close()

    def abandon(self, session: SessionHandle, lost: bool = False) -> None:
        """Give a session up without waiting: its close runs in the background. `lost`: it failed."""
        session.server.live -= 1
        if lost:
            self._counters.count("lost", session.server.address)
        chore = asyncio.create_task(_quietly(session.close()))
        self._chores.add(chore)
        chore.add_done_callback(self._chores.discard)

    def count(self, name: str) -> None:
        """Count an episode event ("replays", "dropped") in the pool's stats."""
        self._counters.count(name)

    async def finish_chores(self) -> None:
        """Wait for the background closes still running."""
        await asyncio.gather(*self._chores, return_exceptions=True)


async def _quietly(closing: Awaitable[None]) -> None:
    # Closing a session we already gave up on is best effort: its server may be gone with it.
    with contextlib.suppress(Exception):
        await closing
