"""The env worker process: hosts the env instances of many sessions of one env, one request at a time.

Started by workers.py as `python -m env_server.worker_main --fd N`; it speaks length-prefixed pickles
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
from env_server.worker_protocol import ACK, EnvDescription, EnvFailed, ReplayMismatch, encode_frame, read_frame_blocking

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
                                  env.default_max_turns)
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

    def restore(self, session_id: str, spec: EpisodeSpec, actions: list[str], digests: list[str]) -> None:
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

    def handle(self, request: tuple) -> Any:
        op, *args = request
        handlers = {"reset": self.reset, "step": self.step, "close": self.close, "restore": self.restore}
        if op not in handlers:
            raise ValueError(f"unknown worker request {op!r}")
        return handlers[op](*args)

    def holds(self, request: tuple) -> bool:
        """Whether the request's session still has an env here; the server mirrors this."""
        return request[1] in self.envs

    def drop(self, request: tuple) -> None:
        """After an unexpected env exception the session's env is in an unknown state: let it go."""
        self.envs.pop(request[1], None)

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


def _expect_digest(session_id: str, index: int, result: StepResult, digests: list[str]) -> None:
    if result_digest(result) != digests[index]:
        raise ReplayMismatch(f"session {session_id}: replaying step {index} gave a different observation than "
                             "the recorded one; the env is not deterministic for this task and seed")


def serve_requests(sock: socket.socket) -> None:
    """Answer (op, session_id, *args) requests with (status, value, holds) until the socket closes."""
    init = _receive(sock)
    if init is None:
        return
    _, _, env_name, entry_point, options = init
    try:
        state = WorkerState(env_name, entry_point, options)
        sock.sendall(encode_frame(("ok", state.describe(), False)))
    except Exception as exc:  # the server logs why this worker could not start
        traceback.print_exc()
        sock.sendall(encode_frame(("error", EnvFailed(f"{type(exc).__name__}: {exc}"), False)))
        return
    while (request := _receive(sock)) is not None:
        try:
            reply = ("ok", state.handle(request))
        except (EnvError, ReplayMismatch) as exc:
            reply = ("error", exc)
        except Exception as exc:
            traceback.print_exc()
            state.drop(request)
            reply = ("error", EnvFailed(f"env {env_name} raised {type(exc).__name__}: {exc}"))
        sock.sendall(encode_frame((*reply, state.holds(request))))


def _receive(sock: socket.socket) -> tuple | None:
    request = read_frame_blocking(sock)
    if request is not None:
        sock.sendall(ACK)
    return request


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
