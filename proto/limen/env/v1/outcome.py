"""What the env decides in one reset or step: the fields a replay (same task, seed and actions) or a retried
request must reproduce exactly. Defined once here, beside the wire it describes, for the trainer's replay
check, the server's own replay and the conformance suite.

Hand-written (`make proto` regenerates only env_pb2*), and it imports nothing, so a client and a server may
both use it. Where and when a step ran (server, session_id, version, info) is left out: `info` may carry
timings or debug text, and the rest changes when an episode is replayed elsewhere.
"""

from __future__ import annotations

# Every name is a field of the wire's Transition, of the trainer's Transition and of a server env's StepResult.
OUTCOME_FIELDS = ("observation", "admissible_actions", "instruction", "task_id", "task_category", "reward",
                  "terminated", "truncated", "won", "score")


def outcome(transition) -> tuple:
    """The outcome fields of any object that has them, as a plain tuple (admissible actions as a tuple,
    whatever sequence the object holds them in), so that two can be compared or serialized."""
    return tuple(tuple(getattr(transition, name)) if name == "admissible_actions" else getattr(transition, name)
                 for name in OUTCOME_FIELDS)


def same_outcome(a, b) -> bool:
    """Whether two transitions (of the same step) say the same thing the env decided."""
    return outcome(a) == outcome(b)
