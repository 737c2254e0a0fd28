"""The counters a trainer logs, kept in one place that every part of the pool counts into."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServerStats:
    opened: int = 0
    steps: int = 0
    lost: int = 0


@dataclass(frozen=True)
class PoolStats:
    """Counters a trainer logs. `replays`: lost sessions rebuilt elsewhere; `dropped`: episodes given up."""

    opened: int = 0
    closed: int = 0
    steps: int = 0
    retries: int = 0
    lost: int = 0
    replays: int = 0
    dropped: int = 0
    by_server: Mapping[str, ServerStats] = field(default_factory=dict)


class Counters:
    """Running counts of one pool, in total and per server address."""

    def __init__(self) -> None:
        self._total: Counter[str] = Counter()
        self._by_server: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def count(self, name: str, server: str | None = None) -> None:
        """One more `name` (a PoolStats field); also counted for `server` when given."""
        self._total[name] += 1
        if server is not None:
            self._by_server[server][name] += 1

    def snapshot(self) -> PoolStats:
        by_server = {address: ServerStats(**counts) for address, counts in sorted(self._by_server.items())}
        return PoolStats(**self._total, by_server=by_server)
