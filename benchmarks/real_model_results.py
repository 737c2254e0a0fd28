"""The real-model run's results (benchmarks/real_model.py): success tables per ALFWorld category, the paired RL
gain, which checkpoints the held-out curve reads, and the plot. Pure functions of outcome rows, apart from the plot."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from trainer_client.eval_report import ALFWORLD_CATEGORIES
from trainer_client.experts import ExpertEpisode
from trainer_client.paired import compare, outcome_values


def category_table(rows: Sequence[dict]) -> dict[str, dict[str, float | int]]:
    """Success per ALFWorld category and All, over rows {category, won} (every seed's episodes counted)."""
    table = {}
    for name in (*ALFWORLD_CATEGORIES, "all"):
        chosen = [r for r in rows if name == "all" or r["category"] == name]
        table[name] = {"episodes": len(chosen), "won": sum(r["won"] for r in chosen),
                       "success": sum(r["won"] for r in chosen) / len(chosen) if chosen else float("nan")}
    return table


def curve_points(checkpoints: Sequence[tuple[int, Path]], every: int) -> list[tuple[int, Path]]:
    """The SFT start (iteration 0), every `every`-th saved iteration and the last one."""
    last = len(checkpoints) - 1
    return [c for k, c in enumerate(checkpoints) if k in (0, last) or (c[0] + 1) % every == 0]


def rows_already_played(rows: Sequence[dict], split: str, seed: int, games: Sequence[str]) -> list[dict] | None:
    """The outcomes of `games` on `split` under eval seed `seed` from a full evaluation's rows, or None when one is
    missing: the curve's start and end are the SFT and final checkpoints, whose episodes the full evaluations played."""
    wanted = set(games)
    chosen = [r for r in rows if r["split"] == split and r["seed"] == seed and r["task_id"] in wanted]
    return chosen if len(chosen) == len(wanted) else None


def paired_rl_gain(before: Sequence[dict], after: Sequence[dict]) -> dict:
    """The paired gain of `after` over `before` on the (game, seed) episodes both played, 95% bootstrap over games."""
    result = compare(outcome_values([{"outcomes": list(before)}]), outcome_values([{"outcomes": list(after)}]))
    return dataclasses.asdict(result)


def plot(results: dict, out: Path) -> None:
    """Held-out success over RL iterations (the curve subset) beside the full evaluation's All columns."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve_ax, bars_ax) = plt.subplots(1, 2, figsize=(11, 4))
    points = results.get("curve", {}).get("points", [])
    if points:
        curve_ax.plot([p["iteration"] for p in points], [p["success"] for p in points], marker="o")
    curve_ax.axhline(results["target"]["valid_seen_all"], color="grey", linestyle="--", label="target 21.8%")
    curve_ax.set(xlabel="RL iteration", ylabel="success",
                 title=f"held-out success on {results['config']['curve_games']} {results['config']['curve_split']} games")
    curve_ax.legend(loc="lower right")
    labels = list(results["rows"])
    for offset, split in enumerate(results["config"]["eval_splits"]):
        values = [results["rows"][label][split]["all"]["success"] for label in labels]
        bars_ax.bar([i + 0.4 * offset for i in range(len(labels))], values, width=0.4, label=split)
    bars_ax.set_xticks([i + 0.2 for i in range(len(labels))], labels, rotation=20)
    bars_ax.axhline(results["target"]["valid_seen_all"], color="grey", linestyle="--")
    bars_ax.set(ylabel="success (All)", title="full evaluation")
    if labels:
        bars_ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def merge_curve(path: Path, iteration: int, rows: Sequence[dict]) -> None:
    """Append one checkpoint's curve outcomes, tagged with the RL iterations it had done (0: the SFT start), once."""
    kept = [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []
    kept = [r for r in kept if r["iteration"] != iteration] + [{"iteration": iteration, **r} for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))


def expert_record(episode: ExpertEpisode) -> dict:
    """What `read_jsonl` reads back."""
    return {"env": episode.env, "task_id": episode.task_id, "category": episode.category,
            "instruction": episode.instruction, "won": episode.won,
            "turns": [{"observation": t.observation, "admissible_actions": list(t.admissible_actions),
                       "expert_action": t.action} for t in episode.turns]}
