"""The env worker process: hosts the env instances of many sessions of one env, one request at a time.

Started by worker.py as `python -m env_server.workers.child --fd N`; it speaks protocol.py's messages
over the inherited socket N, never stdout (env code prints there). It exits when the socket closes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import signal
import socket
import sys
import traceback
from typing import Any

from env_server import registry
from env_server.envs.base import EnvError, StepResult, TextEnv
from env_server.episode import EpisodeSpec, result_digest
from env_server.errors import EnvFailed, ReplayMismatch
from env_server.workers.protocol import (
    ACK, CloseCall, EnvDescription, Reply, ResetCall, RestoreCall, SessionCall, StartWorker, StepCall,
    encode_frame, read_frame_blocking,
)

PR_SET_PDEATHSIG = 1


class WorkerState:
    """The env instances of one worker, by session id, and the handlers of each request."""

    def __init__(self, env_name: str, entry_point: str, options: dict[str, Any]) -> None:
        registry.register(env_name, entry_point)
        self.env_name = env_name
        self.options = options
        self.envs: dict[str, TextEnv] = {}

    def describe(self) -> EnvDescription:
        env = registry.make(self.env_name, **self.options)
        try:
            return EnvDescription(env.name, env.version, env.code_version, env.data_hash(), env.splits(),
                                  env.default_max_turns, frozenset(env.reset_options))
        finally:
            env.close()

    def reset(self, session_id: str, spec: EpisodeSpec) -> StepResult:
        env, result = self._start(spec)
        self._keep_unless_done(session_id, env, result.done)
        return result

    def step(self, session_id: str, action: str) -> StepResult:
        result = self.envs[session_id].step(action)
        self._keep_unless_done(session_id, self.envs[session_id], result.done)
        return result

    def close(self, session_id: str) -> None:
        env = self.envs.pop(session_id, None)
        if env is not None:
            env.close()

    def restore(self, session_id: str, spec: EpisodeSpec, actions: tuple[str, ...],
                digests: tuple[str, ...]) -> None:
        """Rebuild a session lost with another worker: reset, replay its actions, and check that every
        observation equals the recorded one."""
        env, result = self._start(spec)
        try:
            _expect_digest(session_id, 0, result, digests)
            for index, action in enumerate(actions, start=1):
                _expect_digest(session_id, index, env.step(action), digests)
        except BaseException:
            env.close()
            raise
        self.envs[session_id] = env

    def handle(self, call: SessionCall) -> Any:
        match call:
            case ResetCall(session_id, spec):
                return self.reset(session_id, spec)
            case StepCall(session_id, action):
                return self.step(session_id, action)
            case CloseCall(session_id):
                return self.close(session_id)
            case RestoreCall(session_id, spec, actions, digests):
                return self.restore(session_id, spec, actions, digests)
        raise ValueError(f"unknown worker request {call!r}")

    def holds(self, call: SessionCall) -> bool:
        """Whether the call's session still has an env here; the server mirrors this."""
        return call.session_id in self.envs

    def drop(self, call: SessionCall) -> None:
        """After an unexpected env exception the session's env is in an unknown state: let it go."""
        self.envs.pop(call.session_id, None)

    def _start(self, spec: EpisodeSpec) -> tuple[TextEnv, StepResult]:
        env = registry.make(self.env_name, **self.options)
        try:
            return env, env.reset(spec.split, spec.task_id, spec.seed, spec.max_turns, dict(spec.options))
        except BaseException:
            env.close()
            raise

    def _keep_unless_done(self, session_id: str, env: TextEnv, done: bool) -> None:
        # A finished episode needs no env: free it now so recycling and capacity see the truth.
        if done:
            self.envs.pop(session_id, None)
            env.close()
        else:
            self.envs[session_id] = env


def _expect_digest(session_id: str, index: int, result: StepResult, digests: tuple[str, ...]) -> None:
    if result_digest(result) != digests[index]:
        raise ReplayMismatch(f"session {session_id}: replaying step {index} gave a different observation than "
                             "the recorded one; the env is not deterministic for this task and seed")


def serve_requests(sock: socket.socket) -> None:
    """Answer a StartWorker, then SessionCalls, each with a Reply, until the socket closes."""
    start: StartWorker | None = _receive(sock)
    if start is None:
        return
    try:
        state = WorkerState(start.env_name, start.entry_point, start.options)
        sock.sendall(encode_frame(Reply(state.describe())))
    except Exception as exc:  # the server logs why this worker could not start
        traceback.print_exc()
        sock.sendall(encode_frame(Reply(error=EnvFailed(f"{type(exc).__name__}: {exc}"))))
        return
    while (call := _receive(sock)) is not None:
        try:
            value, error = state.handle(call), None
        except (EnvError, ReplayMismatch) as exc:
            value, error = None, exc
        except Exception as exc:
            traceback.print_exc()
            state.drop(call)
            value, error = None, EnvFailed(f"env {start.env_name} raised {type(exc).__name__}: {exc}")
        sock.sendall(encode_frame(Reply(value, error, state.holds(call))))


def _receive(sock: socket.socket) -> Any:
    message = read_frame_blocking(sock)
    if message is not None:
        sock.sendall(ACK)
    return message


def _die_with_parent() -> None:
    """A worker outlives nothing: if the server is killed, even a hung env step must not linger."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the server")
    args = parser.parse_args(argv)
    _die_with_parent()
    # A reset or broken channel means the server is gone or done with this worker: exit quietly.
    with socket.socket(fileno=args.fd) as sock, contextlib.suppress(ConnectionError):
        serve_requests(sock)


if __name__ == "__main__":
    main()
