"""Env instances live in worker processes; a crash or hang kills one worker, not the server.

    protocol.py  the typed messages between server and worker, and their framing (both sides import it)
    child.py     the worker process itself (`python -m env_server.workers.child --fd N`)
    worker.py    one worker as the server sees it: spawn, calls under a time budget, kill
    group.py     the workers of one env: least-loaded placement, replacement, recycling

The server-side names are re-exported here lazily: importing this package must stay cheap, because
every worker process imports it on the way to child.py (the server side pulls in asyncio and metrics).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from env_server.errors import NoWorker
    from env_server.workers.group import RecyclePolicy, WorkerGroup
    from env_server.workers.worker import Worker, WorkerGone, read_frame, worker_environment

_EXPORTS = {
    "Worker": "env_server.workers.worker",
    "read_frame": "env_server.workers.worker",
    "worker_environment": "env_server.workers.worker",
    "RecyclePolicy": "env_server.workers.group",
    "WorkerGroup": "env_server.workers.group",
    "NoWorker": "env_server.errors",
    "WorkerGone": "env_server.workers.worker",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
