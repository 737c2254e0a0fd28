"""What the server and its worker processes exchange: the typed messages, one class per kind, framed as
length-prefixed pickles; and the env description a worker reports at start. Light on imports (no asyncio,
no metrics) so that a worker process starts fast.

A worker reads StartWorker first, then one SessionCall at a time. It answers each by ACK the moment it
has read it, then by one Reply.
"""

from __future__ import annotations

import pickle
import socket
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar

from env_server.envs.base import Split
from env_server.episode import EpisodeSpec

FRAME_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024
# Sent by a worker the moment it has read a request: a death before it is not that request's doing.
ACK = b"\x06"


# ---- what a worker reports about its env ----------------------------------------------------------
@dataclass(frozen=True)
class EnvDescription:
    name: str
    version: str
    code_version: str
    data_hash: str
    splits: dict[str, Split]
    default_max_turns: int
    reset_options: frozenset[str] = frozenset()  # the reset option keys the env reads


# ---- server -> worker --------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartWorker:
    """The first message: which env this worker hosts. Answered with the env's EnvDescription."""

    op: ClassVar[str] = "init"
    env_name: str
    entry_point: str  # "module:Class", registered in the worker under env_name
    options: dict[str, Any] = field(default_factory=dict)  # the env constructor's keyword arguments


@dataclass(frozen=True)
class SessionCall:
    """A call on one session's env instance; the Reply says whether the worker still holds it."""

    op: ClassVar[str]
    session_id: str


@dataclass(frozen=True)
class ResetCall(SessionCall):
    """Start the session's episode; answered with the first StepResult."""

    op: ClassVar[str] = "reset"
    spec: EpisodeSpec


@dataclass(frozen=True)
class StepCall(SessionCall):
    """Apply an action; answered with the StepResult."""

    op: ClassVar[str] = "step"
    action: str


@dataclass(frozen=True)
class CloseCall(SessionCall):
    """Let the session's env go; answered with None."""

    op: ClassVar[str] = "close"


@dataclass(frozen=True)
class RestoreCall(SessionCall):
    """Rebuild a session lost with another worker: reset, replay `actions`, and check that each
    observation has the recorded digest (digests[0] is the reset's). Answered with None."""

    op: ClassVar[str] = "restore"
    spec: EpisodeSpec
    actions: tuple[str, ...]
    digests: tuple[str, ...]


# ---- worker -> server --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reply:
    """The answer to one call: its value, or the exception the server re-raises; and whether the
    worker holds the call's session afterwards (the server mirrors this for placement and replay)."""

    value: Any = None
    error: Exception | None = None
    holds: bool = False


# ---- framing: a 4-byte big-endian length, then a pickle (the peer is our own child process) ---------
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
