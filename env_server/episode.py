"""The plain values of one episode: its spec (all that is needed to replay it), its transitions, and the
digest a replay must reproduce. No asyncio and no I/O: worker processes import it as well.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from env_server.envs.base import StepResult
from env_server.errors import InvalidRequest
from limen.env.v1.outcome import outcome


@dataclass(frozen=True)
class EpisodeSpec:
    """Everything that determines an episode: replaying it with the same actions gives the same episode."""

    env: str
    split: str
    task_id: str
    seed: int = 0
    max_turns: int = 0
    options: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs: hashable and order-free
    episode_id: str = ""

    def __post_init__(self) -> None:
        # env and split are checked against what the server serves (backend); these need no lookup.
        if not self.task_id:
            raise InvalidRequest("task_id must be set")
        if self.max_turns < 0:
            raise InvalidRequest(f"max_turns must be >= 0 (0 = the env's default), got {self.max_turns}")


@dataclass(frozen=True)
class Transition:
    """One answered reset (step_index 0) or step of a session: the env's result plus where it belongs."""

    session_id: str
    step_index: int
    spec: EpisodeSpec
    result: StepResult
    version: str


def result_digest(result: StepResult) -> str:
    """A digest of a reset's or step's outcome (limen.env.v1.outcome: what the env decided, without `info`);
    a replay must reproduce it exactly."""
    return hashlib.sha256(json.dumps(outcome(result)).encode()).hexdigest()
