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

# A session keeps its spec for replay and echoes episode_id in every reply, and the server holds up to
# max_sessions live plus max_finished_sessions finished ones: unbounded, these two fields alone could fill
# its memory. Both limits are in UTF-8 bytes; the options' one counts keys and values together.
MAX_EPISODE_ID_BYTES = 256
MAX_OPTIONS_BYTES = 4096


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
        id_bytes = len(self.episode_id.encode())
        if id_bytes > MAX_EPISODE_ID_BYTES:
            raise InvalidRequest(f"episode_id is {id_bytes} bytes; this server accepts at most "
                                 f"{MAX_EPISODE_ID_BYTES}")
        options_bytes = options_size(self.options)
        if options_bytes > MAX_OPTIONS_BYTES:
            raise InvalidRequest(f"the reset options are {options_bytes} bytes (keys and values); this server "
                                 f"accepts at most {MAX_OPTIONS_BYTES}")


def options_size(options: tuple[tuple[str, str], ...]) -> int:
    """UTF-8 bytes of the options' keys and values together."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in options)


@dataclass(frozen=True)
class RecordedStep:
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
