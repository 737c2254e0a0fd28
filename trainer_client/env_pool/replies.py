"""What the env servers reply, as the frozen values an env pool hands a trainer: transitions (Reset, Step) and
env descriptions (ListEnvs). No I/O here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from limen.env.v1 import env_pb2, outcome


@dataclass(frozen=True)
class Transition:
    """One reset (step_index 0) or step result, as the trainer uses it. `server` and `session_id` say
    where it was produced; after a replay they change while the episode stays the same."""

    observation: str
    admissible_actions: tuple[str, ...]
    reward: float
    terminated: bool
    truncated: bool
    won: bool
    score: float
    step_index: int
    env: str
    split: str
    task_id: str
    task_category: str
    instruction: str
    episode_id: str
    seed: int
    version: str
    server: str
    session_id: str
    info: Mapping[str, str] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def same_outcome(self, other: Transition) -> bool:
        """What a replay must reproduce at this step: everything the env decided, not where or when it ran."""
        return self.step_index == other.step_index and outcome.same_outcome(self, other)


def transition_from_proto(msg: env_pb2.Transition, *, episode_id: str, server: str) -> Transition:
    # The logical episode id, not the server's: a replayed session is opened under a derived id.
    return Transition(
        observation=msg.observation, admissible_actions=tuple(msg.admissible_actions), reward=msg.reward,
        terminated=msg.terminated, truncated=msg.truncated, won=msg.won, score=msg.score,
        step_index=msg.step_index, env=msg.env, split=msg.split, task_id=msg.task_id,
        task_category=msg.task_category, instruction=msg.instruction, episode_id=episode_id, seed=msg.seed,
        version=msg.version, server=server, session_id=msg.session_id, info=dict(msg.info),
    )


@dataclass(frozen=True)
class SplitInfo:
    name: str
    num_tasks: int
    categories: tuple[str, ...]
    num_excluded: int
    description: str


@dataclass(frozen=True)
class EnvInfo:
    """One env as the pool sees it across its servers."""

    name: str
    version: str
    default_max_turns: int
    splits: Mapping[str, SplitInfo]
    servers: tuple[str, ...]


def env_info_from_proto(msg: env_pb2.EnvInfo, servers: Iterable[str]) -> EnvInfo:
    splits = {
        s.name: SplitInfo(s.name, s.num_tasks, tuple(s.categories), s.num_excluded, s.description)
        for s in msg.splits
    }
    return EnvInfo(msg.name, msg.version, msg.default_max_turns, splits, tuple(sorted(servers)))
