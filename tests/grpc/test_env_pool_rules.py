"""The env pool's pure rules, on hand-written cases: target parsing and resolution, status code ->
typed error, placement order, replay equality, config validation. No server needed."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from trainer_client.env_pool import (
    EpisodeOver, InvalidAction, NoServerAvailable, PoolConfig, ServerError, SessionLost, StepTimedOut, Transition,
    Unauthenticated, UnknownEnvOrTask,
)
from trainer_client.env_pool.config import backoff_s
from trainer_client.env_pool.discovery import Target, parse_target, parse_targets, resolve, system_lookup
from trainer_client.env_pool.errors import status_error
from trainer_client.env_pool.servers import ServerLoad, placement_order

# ---- targets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, target", [
    ("127.0.0.1:50051", Target("127.0.0.1", 50051, dynamic=False)),
    ("env-server:7000", Target("env-server", 7000, dynamic=False)),
    ("[::1]:50051", Target("::1", 50051, dynamic=False)),
    ("dns:///alfworld-headless:50051", Target("alfworld-headless", 50051, dynamic=True)),
    ("  dns:///[::1]:9 ", Target("::1", 9, dynamic=True)),
])
def test_parse_target(text, target):
    assert parse_target(text) == target
    assert parse_target(str(target)) == target


@pytest.mark.parametrize("text, reason", [
    ("localhost", "host:port"),
    ("localhost:", "port must be"),
    ("localhost:0", "port must be"),
    ("localhost:70000", "port must be"),
    (":50051", "empty host"),
    ("::1:50051", "bracket IPv6"),
    ("[::1]50051", "[ipv6]:port"),
    ("dns://8.8.8.8/env:50051", "authority is not supported"),
    ("http://env:50051", "only host:port"),
    ("dns:///env", "host:port"),
])
def test_bad_targets_say_why(text, reason):
    with pytest.raises(ValueError, match=reason.replace("[", r"\[")):
        parse_target(text)


def test_parse_targets_accepts_the_cli_form_and_drops_duplicates():
    targets = parse_targets("dns:///a:1, b:2,dns:///a:1,")
    assert targets == (Target("a", 1, True), Target("b", 2, False))
    with pytest.raises(ValueError, match="no env-server targets"):
        parse_targets(" , ")


async def test_resolve_asks_the_lookup_only_for_dns_names():
    asked = []

    async def lookup(host, port):
        asked.append((host, port))
        return {"pods": [f"10.0.0.1:{port}", f"10.0.0.2:{port}"], "gone": []}[host]

    targets = parse_targets("dns:///pods:50051,10.0.0.1:50051,dns:///gone:1,fixed:3,dns:///127.0.0.9:4")
    assert await resolve(targets, lookup) == ["10.0.0.1:50051", "10.0.0.2:50051", "fixed:3", "127.0.0.9:4"]
    assert asked == [("pods", 50051), ("gone", 1)]


async def test_a_name_that_fails_to_resolve_contributes_nothing():
    async def lookup(host, port):
        raise OSError("Name or service not known")

    assert await resolve(parse_targets("dns:///nowhere:1,fixed:2"), lookup) == ["fixed:2"]


async def test_system_lookup_resolves_localhost_for_real():
    addresses = await system_lookup("localhost", 50051)
    assert addresses and all(a.endswith(":50051") for a in addresses)
    assert "127.0.0.1:50051" in addresses or "[::1]:50051" in addresses


# ---- status codes -------------------------------------------------------------------------------------

S = grpc.StatusCode


@pytest.mark.parametrize("code, phase, error", [
    (S.NOT_FOUND, "reset", UnknownEnvOrTask),
    (S.INVALID_ARGUMENT, "reset", UnknownEnvOrTask),
    (S.FAILED_PRECONDITION, "reset", UnknownEnvOrTask),
    (S.RESOURCE_EXHAUSTED, "reset", NoServerAvailable),
    (S.UNAVAILABLE, "reset", NoServerAvailable),
    (S.ABORTED, "reset", SessionLost),
    (S.DEADLINE_EXCEEDED, "reset", StepTimedOut),
    (S.NOT_FOUND, "step", SessionLost),
    (S.INVALID_ARGUMENT, "step", InvalidAction),
    (S.FAILED_PRECONDITION, "step", EpisodeOver),
    (S.UNAVAILABLE, "step", SessionLost),
    (S.ABORTED, "step", SessionLost),
    (S.DEADLINE_EXCEEDED, "step", StepTimedOut),
    (S.UNAUTHENTICATED, "step", Unauthenticated),
    (S.PERMISSION_DENIED, "query", Unauthenticated),
    (S.UNIMPLEMENTED, "query", ServerError),
    (S.NOT_FOUND, "query", UnknownEnvOrTask),
])
def test_status_codes_map_to_typed_errors(code, phase, error):
    mapped = status_error(code, "why", phase, "h:1")
    assert type(mapped) is error
    assert mapped.server == "h:1" and "h:1" in str(mapped) and "why" in str(mapped)


def test_only_lost_sessions_and_timeouts_are_recoverable():
    recoverable = {type(status_error(code, "", phase, "h:1")) for code in S for phase in ("reset", "step", "query")
                   if status_error(code, "", phase, "h:1").recoverable}
    assert recoverable == {SessionLost, StepTimedOut}


# ---- placement -------------------------------------------------------------------------------------------


def test_placement_prefers_the_emptiest_and_skips_full_and_draining():
    loads = [
        ServerLoad("a:1", active=5, capacity=10, draining=False),
        ServerLoad("b:1", active=2, capacity=10, draining=False),
        ServerLoad("c:1", active=0, capacity=10, draining=True),
        ServerLoad("d:1", active=4, capacity=4, draining=False),
        ServerLoad("e:1", active=2, capacity=100, draining=False),
        ServerLoad("f:1", active=0, capacity=0, draining=False),
    ]
    assert placement_order(loads) == ["e:1", "b:1", "a:1"]


def test_placement_puts_the_avoided_server_last_but_keeps_it():
    loads = [ServerLoad("a:1", 0, 10, False), ServerLoad("b:1", 9, 10, False)]
    assert placement_order(loads, avoid=frozenset({"a:1"})) == ["b:1", "a:1"]


def test_placement_breaks_ties_by_count_then_address():
    loads = [ServerLoad("b:1", 2, 4, False), ServerLoad("a:1", 2, 4, False), ServerLoad("c:1", 1, 2, False)]
    assert placement_order(loads) == ["c:1", "a:1", "b:1"]


# ---- replay equality, config ------------------------------------------------------------------------------


def _transition(**changes) -> Transition:
    base = Transition(observation="You are in the hall.", admissible_actions=("look",), reward=0.0,
                      terminated=False, truncated=False, won=False, score=0.0, step_index=1, env="toy",
                      split="train", task_id="goto-000", task_category="goto", instruction="go to the hall",
                      episode_id="e", seed=0, version="toy-1+abc", server="a:1", session_id="s1", info={"x": "1"})
    return dataclasses.replace(base, **changes)


def test_same_outcome_ignores_where_it_ran_but_not_what_the_env_said():
    t = _transition()
    assert t.same_outcome(_transition(server="b:2", session_id="s2", info={"x": "2"}, episode_id="e~replay1"))
    for change in ({"observation": "You are in the attic."}, {"admissible_actions": ("look", "go to attic")},
                   {"reward": 1.0}, {"terminated": True}, {"truncated": True}, {"step_index": 2}):
        assert not t.same_outcome(_transition(**change)), change


def test_transition_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _transition().reward = 1.0


@pytest.mark.parametrize("change", [{"transport": "carrier-pigeon"}, {"step_timeout_s": 0},
                                    {"replay_attempts": -1}, {"retry_attempts": 0}])
def test_config_refuses_nonsense(change):
    with pytest.raises(ValueError):
        PoolConfig(**change)


def test_auth_token_stays_out_of_the_config_repr():
    assert "s3cret" not in repr(PoolConfig(auth_token="s3cret"))


def test_backoff_doubles_up_to_its_cap():
    config = PoolConfig(retry_initial_backoff_s=0.1, retry_max_backoff_s=0.35)
    assert [backoff_s(config, n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.35, 0.35]
