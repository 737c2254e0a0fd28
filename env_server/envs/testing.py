"""A toy env that misbehaves on command, for tests of the server's fault handling (crash, hang, leak,
raise, non-determinism). It lives in the package so that any worker process can import it; it is not
registered by default: `registry.register("faulty", "env_server.envs.testing:FaultyEnv")`.
"""

from __future__ import annotations

import os
import time

from env_server.envs.base import Split, StepResult, Task
from env_server.envs.toy import ToyEnv

EXCLUDED_TASK = Task("excluded-000", "goto", excluded_reason="unsolvable by construction (test fixture)")
# Kept at module level, as a real leak would be: it outlives every session of the worker.
_leaked: list[bytes] = []


class FaultyEnv(ToyEnv):
    """ToyEnv plus these actions: "crash" (the process exits), "hang" (never answers), "sleep <s>",
    "raise" (an unexpected exception), "leak <MB>" (memory that is never freed), "coin" (an observation
    that differs on every run, so a replay cannot match). The reset option "reset_delay_s" slows a reset.
    Its train split also lists one excluded task."""

    name = "faulty"
    code_version = "faulty-1"
    reset_options = frozenset({"reset_delay_s"})

    def splits(self) -> dict[str, Split]:
        splits = super().splits()
        train = splits["train"]
        return {**splits, "train": Split(train.name, (*train.tasks, EXCLUDED_TASK), train.description)}

    def _reset(self, split: str, task: Task, seed: int, options: dict[str, str]) -> StepResult:
        time.sleep(float(options.get("reset_delay_s", 0)))
        return super()._reset(split, task, seed, options)

    def _step(self, action: str) -> StepResult:
        command, _, argument = action.strip().partition(" ")
        if command == "crash":
            os._exit(3)
        if command == "hang":
            while True:
                time.sleep(3600)
        if command == "sleep":
            time.sleep(float(argument))
            return self._result(f"Slept {argument} s.")
        if command == "raise":
            raise RuntimeError("the env failed on purpose")
        if command == "leak":
            _leaked.append(b"\x01" * int(float(argument) * 1024 * 1024))  # written, so it counts in RSS
            return self._result(f"Leaked {argument} MB.")
        if command == "coin":
            return self._result(f"The coin shows {os.urandom(8).hex()}.")
        return super()._step(action)
