"""The settings of a supervised warm start, one type for every command that runs one (the demo, the learning study,
`python -m trainer_client.sft`, the real-model benchmarks). Defaults are one set; a preset states its own values."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SFTConfig:
    episodes: int = 0
    """Expert episodes to fit: a seeded sample of this many tasks of the split, each played once (0: every task)."""
    mistake_rate: float = 0.0
    """Share of expert steps replaced by a mistake the expert then recovers from (trainer_client.experts).
    At 0.2 it cut the demo's rejected actions, but lowered both its SFT start and RL's gain (RESULTS_interpretation)."""
    epochs: float = 1.0
    """Passes over the expert turns; fractional ends mid-pass (a short warm start leaves RL room to improve)."""
    lr: float = 1e-3
    lr_decay: bool = False
    """Decay the learning rate linearly towards 0 after warm-up: a better fit for the same steps."""
    batch_turns: int = 32
    """Turn samples per optimizer step."""
    micro_batch_tokens: int = 16384
    """Tokens per forward/backward within a step (memory, not the result)."""
    prompt_loss_weight: float = 0.0
    """Also fit the prompt tokens at this weight (trainer_client.sft.sft): a random-init model learns the env's text."""


def expert_tasks(task_ids: Sequence[str], episodes: int, seed: int) -> list[str]:
    """The tasks expert play covers: a seeded sample of `episodes` of them (0: all), drawn from the sorted ids."""
    ordered = sorted(task_ids)
    return random.Random(seed).sample(ordered, min(episodes or len(ordered), len(ordered)))
