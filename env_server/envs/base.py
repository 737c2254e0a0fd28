"""The TextEnv interface every limen environment implements, and the plain types it speaks.

Env code never imports protobuf: the same class runs in-process in tests and behind gRPC in deploy.
Semantics follow Gymnasium: `terminated` (the task's own end) is kept apart from `truncated` (the
turn limit). The turn limit itself is enforced here, once, for every env (see `TextEnv.step`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar


class EnvError(Exception):
    """Base of the errors an env raises on bad requests; the server maps each to one status code."""


class UnknownSplit(EnvError):
    """The split does not exist in this env (NOT_FOUND)."""


class UnknownTask(EnvError):
    """The task id does not exist in the split (NOT_FOUND)."""


class TaskExcluded(EnvError):
    """The task exists but cannot be played, e.g. an unsolvable game (FAILED_PRECONDITION)."""


class EpisodeOver(EnvError):
    """A step after the episode terminated or was truncated (FAILED_PRECONDITION)."""


class NotReset(EnvError):
    """A step before any reset (FAILED_PRECONDITION)."""


class InvalidOptions(EnvError, ValueError):
    """Reset options the env does not take (INVALID_ARGUMENT); a ValueError too, as bad arguments are."""


def unknown_options_problem(env: str, known: Iterable[str], options: Iterable[str]) -> str:
    """Why reset `options` (their keys) are refused by an env that reads `known`; "" when they are not."""
    unknown = sorted(set(options) - set(known))
    if not unknown:
        return ""
    quoted = [key if len(key) <= 40 else f"{key[:40]}..." for key in unknown[:5]]
    takes = f"takes only the reset options {sorted(known)}" if known else "takes no reset options"
    return f"{env} {takes}; got {quoted}{' and more' if len(unknown) > 5 else ''}"


@dataclass(frozen=True)
class Task:
    task_id: str
    category: str
    # Non-empty when the task is listed but cannot be played; never dropped silently.
    excluded_reason: str = ""


@dataclass(frozen=True)
class Split:
    name: str
    tasks: tuple[Task, ...]
    description: str = ""

    @property
    def playable(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if not t.excluded_reason)

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(sorted({t.category for t in self.tasks}))


@dataclass
class StepResult:
    """What the env says after a reset or a step. Mirrors the wire's Transition minus session fields."""

    observation: str
    admissible_actions: list[str]
    instruction: str
    task_id: str
    task_category: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    won: bool = False
    score: float = 0.0
    info: dict[str, str] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def replace(self, **changes) -> "StepResult":
        return dataclasses.replace(self, **changes)


class TextEnv(abc.ABC):
    """One episode at a time. An instance is reused across episodes (reset again after the end).

    Subclasses implement `splits`, `_reset`, `_step` and may override `close` and `data_hash`.
    Heavy read-only state (a catalog, an index, a parsed domain) belongs in a per-process cache in the
    env's module, so that every session of one worker process shares it.
    """

    name: ClassVar[str]
    code_version: ClassVar[str] = "0"
    default_max_turns: ClassVar[int] = 50
    # The reset option keys this env reads; a reset naming any other is refused (InvalidOptions).
    reset_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        self._turns = 0
        self._max_turns = self.default_max_turns
        self._over = True
        self._started = False

    # ---- what subclasses implement -------------------------------------------------------------
    @abc.abstractmethod
    def splits(self) -> dict[str, Split]:
        """Every split, with its tasks in a stable order. Cheap after the first call (cache it)."""

    @abc.abstractmethod
    def _reset(self, split: str, task: Task, seed: int, options: dict[str, str]) -> StepResult:
        """Start the episode of `task`; the same (task, seed) must give the same episode."""

    @abc.abstractmethod
    def _step(self, action: str) -> StepResult:
        """Apply one action. An action the env does not understand is answered, not raised."""

    def data_hash(self) -> str:
        """A digest of the data this env serves (files, or generator parameters)."""
        return "none"

    def close(self) -> None:
        """Free what this instance holds. Called once per session; must tolerate a second call."""

    # ---- the shared mechanism -------------------------------------------------------------------
    @property
    def version(self) -> str:
        return f"{self.code_version}+{self.data_hash()[:12]}"

    def task(self, split: str, task_id: str) -> Task:
        """Look a task up by id. Ids are looked up, never joined into paths."""
        splits = self.splits()
        if split not in splits:
            raise UnknownSplit(f"{self.name}: no split {split!r}; splits are {sorted(splits)}")
        for t in splits[split].tasks:
            if t.task_id == task_id:
                return t
        raise UnknownTask(f"{self.name}: no task {task_id!r} in split {split!r}")

    def reset(
        self, split: str, task_id: str, seed: int = 0, max_turns: int = 0, options: dict[str, str] | None = None
    ) -> StepResult:
        task = self.task(split, task_id)
        if task.excluded_reason:
            raise TaskExcluded(f"{self.name}: task {task_id!r} is excluded: {task.excluded_reason}")
        if max_turns < 0:
            raise ValueError(f"max_turns must be >= 0, got {max_turns}")
        problem = unknown_options_problem(self.name, self.reset_options, options or {})
        if problem:
            raise InvalidOptions(problem)
        self._max_turns = max_turns or self.default_max_turns
        self._turns = 0
        result = self._reset(split, task, seed, dict(options or {}))
        self._started = True
        self._over = result.done
        return result

    def step(self, action: str) -> StepResult:
        if not self._started:
            raise NotReset(f"{self.name}: step before reset")
        if self._over:
            raise EpisodeOver(f"{self.name}: the episode is over; reset to start another")
        result = self._step(action)
        self._turns += 1
        if not result.terminated and self._turns >= self._max_turns:
            result = result.replace(truncated=True)
        self._over = result.done
        return result

    @property
    def turns(self) -> int:
        return self._turns
