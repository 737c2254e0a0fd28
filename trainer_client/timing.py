"""Per-iteration runtime breakdown: named stage timers and the compact table that train.py and benchmarks print.

The stage names are verl's `timing_raw` keys (docs/DESIGN.md#runtime-anchor), so our numbers line up with the
seed's 451.2 s -> 301.4 s claim; every algorithm reports every stage, 0 where it has none.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

ITERATION_STAGES = (
    "generation",     # the policy sampling responses (wall time the backend was busy)
    "env_wait",       # rollout wall time with no generation running: envs and the wire
    "trunk",          # the frozen lower layers, once per turn (model.trainable_layers; 0 when every layer trains)
    "old_log_prob",   # no-grad policy pass: old log-probs, entropy, the boundary V, Q (0 where the sampler's are reused)
    "ref",            # no-grad reference pass (KL term)
    "values",         # no-grad pass of a separate critic, and bootstrap values of truncated episodes
    "adv",            # advantage estimation
    "update_critic",  # the separate critic's epochs
    "update_actor",   # the actor's epochs (with the boundary V, Q losses) and the weight push
)


def device_synchronizer(device: str | torch.device) -> Callable[[], None] | None:
    """On an accelerator, kernels run after the Python call returns: a section's clock must wait for them."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else None


class Timer:
    """Wall-clock seconds per named section of one iteration; every stage starts at 0.

    `synchronize` (see device_synchronizer) is called when a section starts and ends, so queued device
    work is charged to the section that queued it.
    """

    def __init__(self, stages: Sequence[str] = ITERATION_STAGES,
                 synchronize: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(stages, 0.0)
        self._synchronize = synchronize or (lambda: None)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self._synchronize()
        started = time.perf_counter()
        try:
            yield
        finally:
            self._synchronize()
            self.add(name, time.perf_counter() - started)

    @property
    def iteration_s(self) -> float:
        """One iteration's time: the sum of the iteration stages (evaluation and checkpoints are not in it)."""
        return sum(self.seconds.get(stage, 0.0) for stage in ITERATION_STAGES)


def mean_stage_seconds(rows: Sequence[Mapping[str, float]], prefix: str = "time/") -> dict[str, float]:
    """Mean of each stage (and of the iteration total) over logged metric rows, e.g. the last N iterations."""
    if not rows:
        raise ValueError("no iterations to average")
    names = (*ITERATION_STAGES, "iteration")
    return {name: sum(float(row.get(prefix + name, 0.0)) for row in rows) / len(rows) for name in names}


def _cell(value: float) -> str:
    return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def breakdown_table(columns: Mapping[str, Mapping[str, float]], title: str = "") -> str:
    """A fixed-width table: one row per stage plus the iteration total, one column per run (or ratio).

    `columns` maps a column name to {stage: value}; a stage a column lacks shows as "-".
    """
    names = (*ITERATION_STAGES, "iteration")
    header = ["stage", *columns]
    body = [[name, *(_cell(c[name]) if name in c else "-" for c in columns.values())] for name in names]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))

    rule = "-" * len(line(header))
    lines = [title] if title else []
    lines += [line(header), rule, *(line(row) for row in body[:-1]), rule, line(body[-1])]
    return "\n".join(lines)
