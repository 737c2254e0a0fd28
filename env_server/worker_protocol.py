"""What the server and its worker processes exchange: length-prefixed pickle frames, the env
description a worker reports at start, and the failures a worker call can end in. Light on imports
(no asyncio, no metrics) so that a worker process starts fast.
"""

from __future__ import annotations

import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any

from env_server.envs.base import Split

FRAME_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024
# Sent by a worker the moment it has read a request: a death before it is not that request's doing.
ACK = b"\x06"


# ---- failures -------------------------------------------------------------------------------------
class WorkerFailure(Exception):
    """The env's process failed the session; the session ends (DEADLINE_EXCEEDED or ABORTED)."""

    reason = "failed"  # the limen_worker_restarts_total label when it costs the worker


class EnvTimeout(WorkerFailure):
    """A call ran past its time budget; the worker was killed (DEADLINE_EXCEEDED)."""

    reason = "timeout"


class WorkerCrashed(WorkerFailure):
    """The worker died while serving the call (ABORTED)."""

    reason = "crashed"


class EnvFailed(WorkerFailure):
    """The env raised an unexpected exception; its state is unknown, so the session ends (ABORTED)."""


class SessionLost(WorkerFailure):
    """The session's worker died and replaying it elsewhere failed or differed (ABORTED)."""


class ReplayMismatch(Exception):
    """A replayed observation differs from the recorded one (raised in the worker)."""


# ---- what a worker reports about its env ----------------------------------------------------------
@dataclass(frozen=True)
class EnvDescription:
    name: str
    version: str
    code_version: str
    data_hash: str
    splits: dict[str, Split]
    default_max_turns: int


# ---- framing: a 4-byte big-endian length, then a pickle (the peer is our own child process) ---------
# A request is answered by ACK, then one reply frame (status, value, holds).
def encode_frame(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(body) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return FRAME_HEADER.pack(len(body)) + body


def read_frame_blocking(sock: socket.socket) -> Any | None:
    """The next message, or None when the peer closed the socket."""
    header = _recv_exactly(sock, FRAME_HEADER.size)
    if header is None:
        return None
    (size,) = FRAME_HEADER.unpack(header)
    body = _recv_exactly(sock, size)
    if body is None:
        return None
    return pickle.loads(body)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
