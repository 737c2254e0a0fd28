"""Paired comparison of two evaluations on the same games and seeds: the gain and a bootstrap interval.

Two checkpoints evaluated on the same games with the same eval seeds see the same game layouts, so most of
the game-to-game spread (easy and hard rooms) cancels in the per-game differences. The interval resamples
games (not episodes): with several eval seeds a game's outcome is its mean over them, so the seeds of one
game are not counted as independent evidence.

    values = outcome_values(results)                   # EvalResults or results-file runs -> {(task, seed): won}
    gain, lo, hi = paired_gain(game_means(before), game_means(after))
    gain, lo, hi = seed_game_gain({0: game_means(before_0), 1: ...}, {0: game_means(after_0), 1: ...})  # seeds as units
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Key = tuple[str, int]          # (task id, eval seed)


def outcome_values(results: Iterable, metric: str = "won") -> dict[Key, float]:
    """{(task id, seed): won (0/1) or score} from EvalResults (their `outcomes`) or from the runs of a
    results file (EvalResult.as_dict, with its "outcomes" list)."""
    if metric not in ("won", "score"):
        raise ValueError(f"metric must be won or score, got {metric!r}")
    values: dict[Key, float] = {}
    for result in results:
        if isinstance(result, Mapping):
            if "outcomes" not in result:
                raise ValueError("this result has no per-episode outcomes (written before they were kept)")
            items = (((o["task_id"], int(o["seed"])), o[metric]) for o in result["outcomes"])
        else:
            items = ((key, getattr(o, metric)) for key, o in result.outcomes.items())
        for key, value in items:
            if key in values:
                raise ValueError(f"episode {key} appears twice")
            values[key] = float(value)
    return values


def game_means(values: Mapping[Key, float]) -> dict[str, float]:
    """Each game's mean over the eval seeds it was played with."""
    by_game: dict[str, list[float]] = defaultdict(list)
    for (task_id, _), value in values.items():
        by_game[task_id].append(value)
    return {task_id: sum(v) / len(v) for task_id, v in by_game.items()}


def paired_gain(before: Mapping[str, float], after: Mapping[str, float], n_boot: int = 10_000, seed: int = 0,
                level: float = 0.95) -> tuple[float, float, float]:
    """(mean of after - before over games, lower, upper): the percentile bootstrap over games at `level`.

    Both must hold the same games (a paired comparison); the result is a function of its arguments."""
    if set(before) != set(after):
        raise ValueError(f"a paired comparison needs the same games: {len(set(before) - set(after))} only before, "
                         f"{len(set(after) - set(before))} only after")
    if not before:
        raise ValueError("no games to compare")
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"n_boot must be >= 1 and level in (0, 1), got {n_boot}, {level}")
    games = sorted(before)
    differences = np.array([after[g] - before[g] for g in games], dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    chunk = max(1, 4_000_000 // len(games))      # bounded memory for many games
    for start in range(0, n_boot, chunk):
        rows = min(chunk, n_boot - start)
        means[start:start + rows] = differences[rng.integers(0, len(games), (rows, len(games)))].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(differences.mean()), float(lo), float(hi)


def seed_game_gain(before: Mapping[int, Mapping[str, float]], after: Mapping[int, Mapping[str, float]],
                   n_boot: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean gain, lower, upper) with training seeds as the unit: each bootstrap draw resamples the training seeds,
    then, within each drawn seed, the games. `before`/`after` map training seed -> {game: mean over eval seeds}.

    paired_gain holds the training seeds fixed, so its interval says nothing about another seed's SFT start and RL
    run; this one widens with the seed-to-seed spread (and with few seeds it is still optimistic: 3 seeds give only
    10 distinct draws at the first stage)."""
    seeds = sorted(before)
    if set(seeds) != set(after) or not seeds:
        raise ValueError(f"both sides need the same training seeds, got {sorted(before)} and {sorted(after)}")
    games = sorted(before[seeds[0]])
    if any(set(before[s]) != set(games) or set(after[s]) != set(games) for s in seeds) or not games:
        raise ValueError("every training seed must hold the same games on both sides")
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"n_boot must be >= 1 and level in (0, 1), got {n_boot}, {level}")
    differences = np.array([[after[s][g] - before[s][g] for g in games] for s in seeds], dtype=np.float64)
    rng = np.random.default_rng(seed)
    n_seeds, n_games = differences.shape
    means = np.empty(n_boot)
    chunk = max(1, 4_000_000 // (n_seeds * n_games))
    for start in range(0, n_boot, chunk):
        rows = min(chunk, n_boot - start)
        drawn_seeds = rng.integers(0, n_seeds, (rows, n_seeds, 1))
        drawn_games = rng.integers(0, n_games, (rows, n_seeds, n_games))
        means[start:start + rows] = differences[drawn_seeds, drawn_games].mean((1, 2))
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(differences.mean()), float(lo), float(hi)


@dataclass(frozen=True)
class PairedComparison:
    gain: float
    lo: float
    hi: float
    before: float          # mean over the compared games (each game's mean over seeds)
    after: float
    games: int
    episodes: int          # (game, seed) pairs both sides finished
    left_out: int          # episodes only one side finished (dropped on the other), not compared

    def describe(self, level: float = 0.95) -> str:
        return (f"{self.before:.3f} -> {self.after:.3f}: gain {self.gain:+.3f} "
                f"[{self.lo:+.3f}, {self.hi:+.3f}] ({round(100 * level)}% bootstrap over {self.games} games"
                f"{f', {self.left_out} unpaired episodes left out' if self.left_out else ''})")


def compare(before: Mapping[Key, float], after: Mapping[Key, float], n_boot: int = 10_000,
            seed: int = 0) -> PairedComparison:
    """Paired gain over the (game, seed) episodes both evaluations finished; an episode dropped on one side
    (infrastructure, never scored) leaves its pair out."""
    common = set(before) & set(after)
    b = game_means({k: before[k] for k in common})
    a = game_means({k: after[k] for k in common})
    gain, lo, hi = paired_gain(b, a, n_boot, seed)
    return PairedComparison(gain, lo, hi, sum(b.values()) / len(b), sum(a.values()) / len(a), len(b), len(common),
                            len(set(before) ^ set(after)))


def paired_report(files: Sequence[Mapping], n_boot: int = 10_000, seed: int = 0) -> str:
    """For results files (`limen-eval --out`) of two or more labels: each label against the first one, per env
    and split, paired over the (task, seed) episodes both played. A label with several files (training runs)
    counts an episode as its mean over them. "" when there is nothing to compare."""
    values: dict[tuple[str, str], dict[str, dict[Key, list[float]]]] = defaultdict(lambda: defaultdict(dict))
    missing = set()
    for f in files:
        if not all("outcomes" in run for run in f["runs"]):
            missing.add(f["label"])
            continue
        by_label = values[(f["env"], f["split"])][f["label"]]
        for key, value in outcome_values(f["runs"]).items():
            by_label.setdefault(key, []).append(value)
    lines = []
    for (env, split), by_label in values.items():
        labels = list(by_label)
        means = {label: {k: sum(v) / len(v) for k, v in by_label[label].items()} for label in labels}
        for label in labels[1:]:
            if not means[labels[0]].keys() & means[label].keys():
                lines.append(f"- {env} {split}, {label} vs {labels[0]}: no (task, seed) episode in common")
                continue
            result = compare(means[labels[0]], means[label], n_boot, seed)
            lines.append(f"- {env} {split}, {label} vs {labels[0]}: {result.describe()}")
    if lines and missing:
        lines.append(f"(not compared, no per-episode outcomes in their files: {', '.join(sorted(missing))})")
    return "\n".join(lines)
