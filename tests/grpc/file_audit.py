"""Proof of "nothing is read": a Python audit hook that records file-system events while armed, and envs
whose reset runs armed inside the worker process and logs what it touched.

A worker imports the envs by entry point (e.g. "file_audit:AuditedToyEnv"; the worker's path includes this
directory) and appends one JSON line {"task_id", "events"} per reset to $LIMEN_FILE_AUDIT_LOG. Only the
reset sees the task id (the env's constructor does not), so it is the whole path a task id can take.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator

from env_server.envs.alfworld.env import AlfWorldEnv
from env_server.envs.base import StepResult
from env_server.envs.toy import ToyEnv
from env_server.envs.webshop.env import WebShopEnv

AUDIT_LOG_ENV = "LIMEN_FILE_AUDIT_LOG"
# Audit events (docs.python.org/3/library/audit_events.html) that open, list or change a path.
FILE_EVENTS = frozenset({
    "open", "os.listdir", "os.scandir", "glob.glob", "os.chdir", "os.mkdir", "os.remove", "os.rename",
    "os.rmdir", "os.symlink", "os.link", "os.truncate", "os.chmod", "os.chown", "os.utime", "shutil.copyfile",
    "shutil.rmtree", "shutil.move", "os.exec", "os.posix_spawn", "subprocess.Popen",
})
_armed: list[list[tuple[str, str]]] = []   # the recordings open now (innermost last)


def _hook(event: str, args: tuple) -> None:
    if _armed and event in FILE_EVENTS:
        _armed[-1].append((event, str(args[0]) if args else ""))


sys.addaudithook(_hook)   # once per process; costs one list check per event while nothing is armed


@contextlib.contextmanager
def file_events() -> Iterator[list[tuple[str, str]]]:
    """The (event, path) pairs this process raises inside the block."""
    seen: list[tuple[str, str]] = []
    _armed.append(seen)
    try:
        yield seen
    finally:
        _armed.remove(seen)


class FileAudit:
    """Mixin: the env's reset runs under `file_events`; the events go to $LIMEN_FILE_AUDIT_LOG."""

    def reset(self, split: str, task_id: str, seed: int = 0, max_turns: int = 0,
              options: dict[str, str] | None = None) -> StepResult:
        events: list[tuple[str, str]] = []
        try:
            with file_events() as events:
                return super().reset(split, task_id, seed, max_turns, options)
        finally:   # outside the recording, so the log's own open is not in it
            with open(os.environ[AUDIT_LOG_ENV], "a") as log:
                log.write(json.dumps({"task_id": task_id, "events": events}) + "\n")


class AuditedToyEnv(FileAudit, ToyEnv):
    pass


class AuditedAlfWorldEnv(FileAudit, AlfWorldEnv):
    pass


class AuditedWebShopEnv(FileAudit, WebShopEnv):
    pass
