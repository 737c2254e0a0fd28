"""Hypothesis-driven requests against a real env server (in-process on port 0, its own event loop in a
thread, a real channel): every RPC with hostile fields. Each request must get a status code the contract
(env.proto) documents for its RPC; afterwards no worker has died, no session is left, and the server
still plays an episode.

One case is one RPC (an Episode stream counts once); an example is a program of ten calls. 2,000 cases
against the toy env run in the default suite (~15 s); the slow run adds WebShop and ALFWorld to the server.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env_server.config import ServerConfig
from env_server.server import READINESS_SERVICE, serve
from limen.env.v1 import env_pb2

Code = grpc.StatusCode
SERVICE = "/limen.env.v1.EnvService/"
MAX_ACTION_BYTES = ServerConfig().max_action_bytes     # the fuzzed server runs with the defaults
MAX_MESSAGE_BYTES = ServerConfig().max_message_bytes
CALL_TIMEOUT_S = 30.0
CALLS_PER_EXAMPLE = 10

# What env.proto documents for each RPC on a server without auth whose env is healthy (the toy env): no
# worker can crash or hang here, so ABORTED, DEADLINE_EXCEEDED, UNAVAILABLE, INTERNAL and UNKNOWN are bugs.
# Every RPC may answer INVALID_ARGUMENT (a request that does not parse) and RESOURCE_EXHAUSTED (a message
# over the size limit).
ANY_RPC = {Code.OK, Code.INVALID_ARGUMENT, Code.RESOURCE_EXHAUSTED}
DOCUMENTED: dict[str, frozenset[Code]] = {
    "ListEnvs": frozenset(ANY_RPC),
    "GetLoad": frozenset(ANY_RPC),
    "ListTasks": frozenset(ANY_RPC | {Code.NOT_FOUND}),
    "Reset": frozenset(ANY_RPC | {Code.NOT_FOUND, Code.FAILED_PRECONDITION}),
    "Step": frozenset(ANY_RPC | {Code.NOT_FOUND, Code.FAILED_PRECONDITION}),
    "Close": frozenset(ANY_RPC | {Code.NOT_FOUND}),
    "Episode": frozenset(ANY_RPC | {Code.NOT_FOUND, Code.FAILED_PRECONDITION}),
}
RESPONSE_TYPES = {"ListEnvs": env_pb2.ListEnvsResponse, "GetLoad": env_pb2.GetLoadResponse,
                  "ListTasks": env_pb2.ListTasksResponse, "Reset": env_pb2.Transition,
                  "Step": env_pb2.Transition, "Close": env_pb2.CloseResponse}


# ---- the server, on its own loop, so that hypothesis can drive it synchronously ----------------------
@contextmanager
def server_in_thread(config: ServerConfig) -> Iterator[str]:
    """Yields the address of `serve(config)` running on an event loop in a background thread."""
    started, address, failure = threading.Event(), [], []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def run() -> None:
        try:
            async with serve(config) as running:
                address.append(running.address)
                started.set()
                await stop.wait()
        except BaseException as error:
            failure.append(error)
            started.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    started.wait(120)
    if failure or not address:
        raise RuntimeError(f"the server did not start: {failure}")
    try:
        yield address[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
        loop.close()


# ---- strategies: hostile fields, and valid ones often enough to reach live sessions ------------------------
HOSTILE_NAMES = ["", "../../etc/passwd", "/etc/passwd", "..", "train/../test", "%2e%2e%2f", "\x00", "toy\x00",
                 "C:\\Windows\\win.ini", "a" * 10_000, "é" * 3_000]
int32s = st.integers(-2**31, 2**31 - 1)
int64s = st.integers(-2**63, 2**63 - 1)
names = st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(max_size=30))
# Bytes that cannot be UTF-8: a lone continuation byte, an overlong form, a surrogate, a cut sequence.
invalid_utf8 = st.sampled_from([b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"go to \xe2\x82", b"\xff" * 9])
oversize = st.sampled_from([MAX_ACTION_BYTES, MAX_ACTION_BYTES + 1, 1 << 20, MAX_MESSAGE_BYTES + 1])
WORDS = ["look", "inventory", "go to hall", "go to kitchen", "take key", "turn on lamp", "go to desk 1",
         "open drawer 1", "search[red shirt]", "click[buy now]", "click[< prev]", "click[item - 1]"]
commands = st.sampled_from(WORDS).map(str.encode)
actions = st.one_of(commands, commands, st.text(max_size=40).map(str.encode), st.binary(max_size=40), invalid_utf8,
                    oversize.map(lambda size: b"x" * size))
# A step index relative to the session: NEXT applies a step, PREVIOUS re-asks for the last one.
NEXT, PREVIOUS = "next", "previous"
step_indices = st.one_of(st.just(NEXT), st.just(NEXT), st.just(PREVIOUS), st.integers(-2, 3), int32s)
session_ids = st.one_of(st.sampled_from(["", "../../etc/passwd", "0" * 29]), st.text(max_size=40))
page_tokens = st.one_of(st.just(""), st.integers(-3, 200).map(str), st.sampled_from(["9" * 5_000, "٣", "1e3"]),
                        st.text(max_size=12))
raw_bodies = st.one_of(st.binary(max_size=64), st.just(b"\x1a\x02\xff\xfe"))  # the latter: bad UTF-8 in field 3


@dataclass(frozen=True)
class SessionRef:
    """A session this example opened, counted back from the latest; `live` picks among those not yet
    ended (as far as the client knows), else among all. Resolved when the call is sent."""

    back: int
    live: bool


session_refs = st.one_of(st.builds(SessionRef, st.integers(0, 3), st.just(True)),
                         st.builds(SessionRef, st.integers(0, 3), st.booleans()), session_ids)
# Steps and resets are drawn more often: they reach the env worker and the session table.
KINDS = ["step", "step", "step", "reset", "reset", "episode", "episode", "close", "list_tasks", "query", "raw"]


def calls_for(playable: list[tuple[str, str, str]]) -> st.SearchStrategy[tuple[str, tuple]]:
    """(kind, arguments) calls for a server whose playable tasks include `playable` (env, split, task_id)."""
    served = sorted({env for env, _, _ in playable})
    envs = st.one_of(st.sampled_from(served), st.sampled_from([e.upper() for e in served] + ["toy", "webshop"]),
                     names)
    splits = st.one_of(st.sampled_from(sorted({split for _, split, _ in playable})), names)
    task_ids = st.one_of(st.sampled_from([task_id for _, _, task_id in playable]), names)
    hostile_resets = st.builds(
        env_pb2.ResetRequest, env=envs, split=splits, task_id=task_ids, seed=int64s,
        episode_id=st.one_of(st.just(""), st.sampled_from(["ep-1", "ep-2"]), st.text(max_size=20)),
        options=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
        max_turns=st.one_of(st.just(0), st.integers(-3, 30), int32s),
    )
    valid_resets = st.builds(
        lambda task, seed, episode_id, max_turns: env_pb2.ResetRequest(
            env=task[0], split=task[1], task_id=task[2], seed=seed, episode_id=episode_id, max_turns=max_turns),
        st.sampled_from(playable), int64s, st.one_of(st.just(""), st.sampled_from(["ep-1", "ep-2"])),
        st.integers(0, 30))
    # Valid resets as often as hostile ones, so that steps and closes meet live sessions.
    reset_requests = st.one_of(valid_resets, hostile_resets)
    step_messages = st.builds(
        lambda index, action: env_pb2.EpisodeRequest(step=env_pb2.StepRequest(step_index=index, action=action)),
        st.one_of(st.just(0), st.integers(-1, 4), int32s), actions)
    episode_messages = st.one_of(
        reset_requests.map(lambda reset: env_pb2.EpisodeRequest(reset=reset).SerializeToString()),
        valid_resets.map(lambda reset: env_pb2.EpisodeRequest(reset=reset).SerializeToString()),
        step_messages.map(env_pb2.EpisodeRequest.SerializeToString),
        step_messages.map(env_pb2.EpisodeRequest.SerializeToString),
        st.just(env_pb2.EpisodeRequest().SerializeToString()),
        raw_bodies,
    )
    arguments = {
        "reset": st.tuples(reset_requests),
        "step": st.tuples(session_refs, step_indices, actions),
        "close": st.tuples(session_refs),
        "list_tasks": st.tuples(st.builds(env_pb2.ListTasksRequest, env=envs, split=splits,
                                          page_size=st.one_of(st.integers(-2, 130), int32s), page_token=page_tokens)),
        "query": st.tuples(st.sampled_from(["ListEnvs", "GetLoad"]), st.one_of(st.just(b""), raw_bodies)),
        "raw": st.tuples(st.sampled_from(sorted(RESPONSE_TYPES)), raw_bodies),
        "episode": st.tuples(st.lists(episode_messages, max_size=6)),
    }
    return st.sampled_from(KINDS).flatmap(lambda kind: arguments[kind].map(lambda args: (kind, args)))


@dataclass
class Tally:
    """Status codes seen, by RPC, and every answer the contract does not document."""

    codes: defaultdict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    undocumented: list[str] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return sum(sum(counter.values()) for counter in self.codes.values())

    def record(self, method: str, code: Code, details: str) -> None:
        self.codes[method][code.name] += 1
        if code not in DOCUMENTED[method]:
            self.undocumented.append(f"{method} -> {code.name}: {details[:300]}")

    def summary(self) -> str:
        return "; ".join(f"{method}: " + ", ".join(f"{code} {n}" for code, n in sorted(counts.items()))
                         for method, counts in sorted(self.codes.items()))


class FuzzClient:
    """Sends one example's calls over a shared channel, following the sessions they open, and closes
    what is still live at the end (so the server must end the run with none)."""

    def __init__(self, channel: grpc.Channel, tally: Tally) -> None:
        self.channel, self.tally = channel, tally
        self.opened: list[str] = []
        self.applied: dict[str, int] = {}   # live session id -> steps applied, as the server said

    def send(self, kind: str, arguments: tuple) -> None:
        getattr(self, kind)(*arguments)

    def finish(self) -> None:
        for session_id in list(self.applied):
            self.unary("Close", env_pb2.CloseRequest(session_id=session_id).SerializeToString())

    # ---- the calls -------------------------------------------------------------------------------------
    def reset(self, request: env_pb2.ResetRequest) -> None:
        self.follow(self.unary("Reset", request.SerializeToString()))

    def step(self, session, step_index, action: bytes) -> None:
        session_id = self.resolve(session)
        applied = self.applied.get(session_id, 0)
        index = {NEXT: applied + 1, PREVIOUS: applied}.get(step_index, step_index)
        request = env_pb2.StepRequest(session_id=session_id, step_index=index, action=action)
        self.follow(self.unary("Step", request.SerializeToString()))

    def close(self, session) -> None:
        session_id = self.resolve(session)
        if self.unary("Close", env_pb2.CloseRequest(session_id=session_id).SerializeToString()) is not None:
            self.applied.pop(session_id, None)

    def list_tasks(self, request: env_pb2.ListTasksRequest) -> None:
        self.unary("ListTasks", request.SerializeToString())

    def query(self, method: str, body: bytes) -> None:
        self.unary(method, body)

    def raw(self, method: str, body: bytes) -> None:
        reply = self.unary(method, body)
        if isinstance(reply, env_pb2.Transition):  # random bytes may parse as a valid Reset
            self.follow(reply)

    def episode(self, messages: list[bytes]) -> None:
        call = self.channel.stream_stream(SERVICE + "Episode")
        try:
            for _ in call(iter(messages), timeout=CALL_TIMEOUT_S):
                pass
        except grpc.RpcError as error:
            self.tally.record("Episode", error.code(), error.details() or "")
            return
        self.tally.record("Episode", Code.OK, "")

    # ---- plumbing --------------------------------------------------------------------------------------
    def unary(self, method: str, body: bytes):
        """The parsed reply, or None after an error status (recorded either way)."""
        try:
            reply = self.channel.unary_unary(SERVICE + method)(body, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            self.tally.record(method, error.code(), error.details() or "")
            return None
        self.tally.record(method, Code.OK, "")
        return RESPONSE_TYPES[method].FromString(reply)

    def resolve(self, session: SessionRef | str) -> str:
        if not isinstance(session, SessionRef):
            return session
        candidates = list(self.applied) if session.live and self.applied else self.opened
        return candidates[-1 - session.back % len(candidates)] if candidates else ""

    def follow(self, transition: env_pb2.Transition | None) -> None:
        if transition is None or not transition.session_id:
            return
        if transition.session_id not in self.opened:
            self.opened.append(transition.session_id)
        if transition.terminated or transition.truncated:
            self.applied.pop(transition.session_id, None)
        else:
            self.applied[transition.session_id] = transition.step_index


# ---- the test -----------------------------------------------------------------------------------------
def wait_for_no_sessions(channel: grpc.Channel, timeout_s: float = 10.0) -> env_pb2.GetLoadResponse:
    """Episode streams release their session just after they end; give that a moment."""
    get_load = channel.unary_unary(SERVICE + "GetLoad", response_deserializer=env_pb2.GetLoadResponse.FromString)
    for _ in range(int(timeout_s / 0.1)):
        load = get_load(env_pb2.GetLoadRequest().SerializeToString(), timeout=CALL_TIMEOUT_S)
        if load.active_sessions == 0:
            return load
        time.sleep(0.1)
    return load


def play_one_episode(channel: grpc.Channel) -> env_pb2.Transition:
    """An ordinary episode after the fuzz: the toy env's expert, to the end."""
    reset = channel.unary_unary(SERVICE + "Reset", response_deserializer=env_pb2.Transition.FromString)
    step = channel.unary_unary(SERVICE + "Step", response_deserializer=env_pb2.Transition.FromString)
    transition = reset(env_pb2.ResetRequest(env="toy", split="train", task_id="fetch-001").SerializeToString())
    session_id = transition.session_id
    while not (transition.terminated or transition.truncated):
        transition = step(env_pb2.StepRequest(session_id=session_id, step_index=transition.step_index + 1,
                                              action=transition.info["expert_action"].encode()).SerializeToString())
    return transition


def playable_tasks(channel: grpc.Channel, per_env: int = 20) -> list[tuple[str, str, str]]:
    """(env, split, task_id) of the first playable tasks of each env's first split, as the server lists them."""
    listing = channel.unary_unary(SERVICE + "ListEnvs", response_deserializer=env_pb2.ListEnvsResponse.FromString)
    list_tasks = channel.unary_unary(SERVICE + "ListTasks", response_deserializer=env_pb2.ListTasksResponse.FromString)
    playable = []
    for info in listing(b"").envs:
        split = info.splits[0].name
        page = list_tasks(env_pb2.ListTasksRequest(env=info.name, split=split, page_size=per_env).SerializeToString())
        playable += [(info.name, split, task_id) for task_id in page.task_ids]
    return playable


# Hypothesis warns when it prints the megabyte actions it made on purpose.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
@pytest.mark.parametrize("envs, cases", [
    (("toy",), 2_000),
    # The real envs: their workers take seconds to start (WebShop builds its search index).
    pytest.param(("toy", "webshop", "alfworld"), 2_000, marks=pytest.mark.slow),
])
def test_hostile_requests_get_documented_codes_and_leave_the_server_healthy(envs, cases):
    config = ServerConfig(envs=envs, port=0, metrics_port=-1, workers=1, max_sessions=64)
    tally = Tally()
    with server_in_thread(config) as address, grpc.insecure_channel(address) as channel:
        get_load = channel.unary_unary(SERVICE + "GetLoad", response_deserializer=env_pb2.GetLoadResponse.FromString)
        workers_before = [w.pid for w in get_load(b"").workers]
        calls = calls_for(playable_tasks(channel))

        @settings(max_examples=cases // CALLS_PER_EXAMPLE, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(calls, min_size=CALLS_PER_EXAMPLE, max_size=CALLS_PER_EXAMPLE))
        def fuzz(program: list[tuple[str, tuple]]) -> None:
            client = FuzzClient(channel, tally)
            try:
                for kind, arguments in program:
                    client.send(kind, arguments)
            finally:
                client.finish()

        fuzz()
        print(f"\nfuzz {'+'.join(envs)}: {tally.cases} cases; {tally.summary()}")

        assert tally.cases >= cases
        assert not tally.undocumented, "\n".join(tally.undocumented[:20])
        assert set(tally.codes) == set(DOCUMENTED), "every RPC is fuzzed"
        load = wait_for_no_sessions(channel)
        assert load.active_sessions == 0, "no session is left behind"
        assert [w.pid for w in load.workers] == workers_before, "no worker died or was replaced"
        assert play_one_episode(channel).won
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=READINESS_SERVICE))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
