"""Toy variants that misbehave on purpose, for the env pool tests. Server worker processes import this
module by its entry point ("test_env_pool_envs:Class"), so it holds env classes only, no tests."""

from __future__ import annotations

import itertools
import time

from env_server.envs.base import StepResult, Task
from env_server.envs.toy import ToyEnv

# Per worker process: every env instance in it draws from the same counter.
_RESETS = itertools.count()


class RestlessToyEnv(ToyEnv):
    """Not deterministic: each reset in a process shows a new number, so no replay can match."""

    name = "restless"

    def _reset(self, split: str, task: Task, seed: int, options: dict[str, str]) -> StepResult:
        result = super()._reset(split, task, seed, options)
        return result.replace(observation=f"{result.observation} (reset number {next(_RESETS)})")


class SleepyToyEnv(ToyEnv):
    """The action "sleep S" blocks the env for S seconds, like a hung engine."""

    name = "sleepy"

    def _step(self, action: str) -> StepResult:
        if action.startswith("sleep "):
            time.sleep(float(action.removeprefix("sleep ")))
        return super()._step(action)


class VersionedToyEnv(ToyEnv):
    """The toy env under a code version chosen by the server's env options."""

    name = "versioned"

    def __init__(self, code_version: str = "toy-1") -> None:
        super().__init__()
        self.code_version = code_version
