"""Held-out curves of the learning study: every saved checkpoint of a run plays one fixed subset of the primary
held-out split (the first eval seed), so a reader sees when anything learned, against iterations and against the
run's own wall time; and the comparison at equal wall time that the curves make possible.

The SFT start (iteration 0) and the last checkpoint are not played again: their full evaluations hold the same
(game, eval seed) episodes, and an episode is a function of the weights, the game and the seed alone
(trainer_client.rollout.episode_seeds)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from study_config import StudyConfig

from trainer_client.checkpoints import checkpoint_dir
from trainer_client.eval_report import read_run
from trainer_client.evaluate import evaluate, subset
from trainer_client.policy import Policy, TransformersBackend


def curve_tasks(cfg: StudyConfig, split_task_ids: Sequence[str]) -> list[str]:
    return subset(split_task_ids, cfg.curve_episodes)


def episodes_of(evaluation: Mapping, eval_seed: int, task_ids: Sequence[str]) -> list[dict]:
    """The outcomes of one eval seed's run of a full evaluation, on `task_ids` only."""
    wanted = set(task_ids)
    run = next(run for run in evaluation["runs"] if run["seed"] == eval_seed)
    return [o for o in run["outcomes"] if o["task_id"] in wanted]


def cumulative_seconds(rows: Sequence[Mapping]) -> dict[int, float]:
    """{iteration index: seconds of iterations 0..index}: a run's own training time, from its metrics."""
    total, out = 0.0, {}
    for row in sorted(rows, key=lambda r: r["iteration"]):
        total += row.get("time/iteration", 0.0)
        out[row["iteration"]] = total
    return out


def saved_iterations(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("iter_*") if p.is_dir()
                  and not p.name.endswith(".tmp"))


def point(iterations_done: int, seconds: float, outcomes: list[dict]) -> dict:
    won = [o["won"] for o in outcomes]
    return {"iteration": iterations_done, "train_seconds": seconds,
            "success": statistics.fmean(won) if won else None, "outcomes": outcomes}


async def held_out_curve(pool, cfg: StudyConfig, run_dir: Path, split_task_ids: Sequence[str], sft: Mapping,
                         final_evaluations: Mapping) -> dict:
    """The run's held-out curve: {split, eval_seed, games, points: [{iteration, train_seconds, success, outcomes}]}
    at the SFT start, every saved checkpoint and the last."""
    split, eval_seed = cfg.eval_splits[0], cfg.eval_seeds[0]
    task_ids = curve_tasks(cfg, split_task_ids)
    seconds = cumulative_seconds(read_run(str(run_dir))[1])
    saved = saved_iterations(run_dir)
    rollout = dataclasses.replace(cfg.rl.rollout, temperature=cfg.rl.eval_temperature, batch_wait_s=0.0)
    points = [point(0, 0.0, episodes_of(sft["evaluations"][split], eval_seed, task_ids))]
    for index in saved[:-1]:
        policy = Policy.load(checkpoint_dir(run_dir, index) / "policy")
        result = await evaluate(pool, TransformersBackend.from_policy(policy), policy.tokenizer, cfg.env, split,
                                task_ids, rollout, cfg.rl.prompt, seed=eval_seed)
        points.append(point(index + 1, seconds.get(index, 0.0), result.as_dict()["outcomes"]))
    last = saved[-1]
    points.append(point(last + 1, seconds.get(last, 0.0), episodes_of(final_evaluations[split], eval_seed, task_ids)))
    return {"split": split, "eval_seed": eval_seed, "games": len(task_ids), "points": points}


# ---- pure: the numbers the report draws and states -------------------------------------------------------


def point_within(curve: Mapping, seconds: float) -> dict:
    """The last point of a curve its run had reached within `seconds` of training (the SFT start at least)."""
    reached = [p for p in curve["points"] if p["train_seconds"] <= seconds + 1e-9]
    return reached[-1]


def game_values(outcomes: Sequence[Mapping]) -> dict[str, float]:
    return {o["task_id"]: float(o["won"]) for o in outcomes}


def equal_time(runs: Mapping[str, Mapping[int, Mapping]], base: str = "boundary") -> dict[str, dict]:
    """Per arm against `base`, seed by seed: where the arm stood when `base` finished (its last curve point within
    base's training seconds) against where `base` ended, on the curve's games. Arms faster than base stop at their
    last iteration: the runs are not continued past the study's iteration count."""
    if base not in runs:
        return {}
    out = {}
    for arm, by_seed in runs.items():
        seeds = sorted(s for s in by_seed.keys() & runs[base].keys()
                       if "curve" in by_seed[s] and "curve" in runs[base][s])
        if arm == base or not seeds:
            continue
        per_seed = {}
        for seed in seeds:
            base_end = runs[base][seed]["curve"]["points"][-1]
            reached = point_within(by_seed[seed]["curve"], base_end["train_seconds"])
            per_seed[seed] = {"base_seconds": base_end["train_seconds"], "iteration": reached["iteration"],
                              "seconds": reached["train_seconds"], "arm": game_values(reached["outcomes"]),
                              "base": game_values(base_end["outcomes"])}
        out[arm] = per_seed
    return out


def band(curves: Sequence[Mapping], x: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, mean, low, high) of held-out success over seeds at each curve point (points matched by position; x is
    the mean over seeds of `iteration` or `train_seconds`). The band is min to max over seeds."""
    length = min(len(c["points"]) for c in curves)
    xs, mean, low, high = [], [], [], []
    for k in range(length):
        values = [c["points"][k]["success"] for c in curves]
        xs.append(statistics.fmean(c["points"][k][x] for c in curves))
        mean.append(statistics.fmean(values))
        low.append(min(values))
        high.append(max(values))
    return xs, mean, low, high


PANELS = (("boundary", "grpo"), ("boundary", "ppo_critic_turn", "ppo_critic_verl"))


def plot_held_out_curves(runs: Mapping[str, Mapping[int, Mapping]], path: Path) -> Path | None:
    """Held-out success against iterations (top) and training minutes (bottom), one column per comparison, mean
    over seeds with a min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [[arm for arm in panel if any("curve" in r for r in runs.get(arm, {}).values())] for panel in PANELS]
    if not any(panels):
        return None
    fig, axes = plt.subplots(2, len(panels), figsize=(6 * len(panels), 8), squeeze=False)
    for column, arms in enumerate(panels):
        for row, (x, label, scale) in enumerate((("iteration", "iteration", 1.0), ("train_seconds", "training minutes", 60.0))):
            ax = axes[row][column]
            for arm in arms:
                curves = [r["curve"] for r in runs[arm].values() if "curve" in r]
                xs, mean, low, high = band(curves, x)
                xs = [v / scale for v in xs]
                ax.plot(xs, mean, marker="o", label=f"{arm} ({len(curves)} seeds)")
                ax.fill_between(xs, low, high, alpha=0.2)
            ax.set_xlabel(label)
            ax.set_ylabel("held-out success")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            if row == 0:
                ax.set_title(" vs ".join(arms))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gains(comparisons: Mapping[str, Mapping], path: Path) -> Path | None:
    """Each comparison's paired gain with its two intervals: over games with the seeds held fixed (thin) and with
    the seeds resampled too (thick), the one the verdict follows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(name, c) for name, c in comparisons.items() if c.get("seed_ci95")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.5))
    for y, (name, c) in enumerate(rows):
        gain = 100 * c["gain"]
        for (low, high), width, color in ((c["seed_ci95"], 6, "tab:blue"), (c["ci95"], 2, "tab:orange")):
            ax.plot([100 * low, 100 * high], [y, y], linewidth=width, color=color, alpha=0.7)
        ax.plot([gain], [y], "ko")
        ax.scatter([100 * d for d in c["per_seed"].values()], [y] * len(c["per_seed"]), marker="|", s=200, color="k")
    ax.axvline(0, color="gray", linewidth=1)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.set_xlabel("paired gain, points\n(thick: 95 % CI, seeds then games resampled; thin: games only; |: each seed)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
