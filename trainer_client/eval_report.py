"""Tables and learning curves from `limen-eval` results files: mean ± std over eval seeds and runs, the anchor's
markdown table (one row per label, paired comparisons against the first), and `limen-eval combine`.

    limen-eval combine a.json b.json ... [--markdown table.md] [--runs [LABEL=]RUN_DIR ...] [--plot curves.png]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import yaml

from trainer_client.paired import paired_report
from trainer_client.train_config import TrainConfig

# The anchor table's columns: ALFWorld's six task types (short names as verl-agent reports them), WebShop's two.
ALFWORLD_CATEGORIES = ("pick", "look", "clean", "heat", "cool", "pick2")
WEBSHOP_COLUMNS = (("WS Score", "score"), ("WS Succ", "success"))


# ---- mean ± std over seeds and runs (pure) --------------------------------------------------------------


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation; the std is None for fewer than two values."""
    if not values:
        raise ValueError("no values to average")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def percentages(result: Mapping) -> dict[str, float]:
    """One result (EvalResult.as_dict) as the table's numbers: success and per-category success in %, score."""
    out = {"success": 100.0 * result["success"], "score": result["score"]}
    out |= {f"success/{k}": 100.0 * c["success"] for k, c in result["by_category"].items() if c["episodes"]}
    return out


def summarize_results(results: Sequence[Mapping]) -> dict[str, dict[str, float | None]]:
    """{metric: {"mean", "std", "n"}} over several results of one env (seeds and/or runs)."""
    samples: dict[str, list[float]] = defaultdict(list)
    for result in results:
        for key, value in percentages(result).items():
            if not math.isnan(value):
                samples[key].append(value)
    return {key: dict(zip(("mean", "std"), mean_std(values)), n=len(values)) for key, values in samples.items()}


def env_columns(env: str, categories: Iterable[str]) -> list[tuple[str, str]]:
    """(title, metric) of one env's columns: the anchor's for ALFWorld and WebShop, categories + All otherwise."""
    if env == "alfworld":
        return [(c.capitalize(), f"success/{c}") for c in ALFWORLD_CATEGORIES] + [("All", "success")]
    if env == "webshop":
        return list(WEBSHOP_COLUMNS)
    return [(f"{env} {c}", f"success/{c}") for c in sorted(categories)] + [(f"{env} All", "success")]


def _cell(summary: Mapping | None) -> str:
    if summary is None:
        return "–"
    return f"{summary['mean']:.1f}" if summary["std"] is None else f"{summary['mean']:.1f} ± {summary['std']:.1f}"


def results_table(files: Sequence[Mapping]) -> str:
    """The anchor-style markdown table: one row per label, one column group per env in the files."""
    by_label_env: dict[str, dict[str, list[Mapping]]] = defaultdict(lambda: defaultdict(list))
    categories: dict[str, set[str]] = defaultdict(set)
    splits: dict[str, set[str]] = defaultdict(set)
    temperatures = {f["temperature"] for f in files}
    for f in files:
        by_label_env[f["label"]][f["env"]] += f["runs"]
        splits[f["env"]].add(f"{f['split']} ({f['tasks_played']} of {f['split_tasks']} tasks)")
        for run in f["runs"]:
            categories[f["env"]].update(run["by_category"])
    envs = sorted(categories, key=lambda e: ({"alfworld": 0, "webshop": 1}.get(e, 2), e))
    columns = [(env, title, metric) for env in envs for title, metric in env_columns(env, categories[env])]
    lines = ["| Method | " + " | ".join(title for _, title, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    counts = set()
    for label, by_env in by_label_env.items():
        summaries = {env: summarize_results(runs) for env, runs in by_env.items()}
        cells = [_cell(summaries.get(env, {}).get(metric)) for env, _, metric in columns]
        counts |= {len(runs) for runs in by_env.values()}
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", f"Success in %, WebShop score = mean reward x 100; mean ± sample std over "
                  f"{'/'.join(str(n) for n in sorted(counts))} result(s) per cell (runs x eval seeds), "
                  f"sampled at T = {'/'.join(str(t) for t in sorted(temperatures))}. Splits: "
                  + "; ".join(f"{env} {', '.join(sorted(s))}" for env, s in sorted(splits.items())) + "."]
    return "\n".join(lines)


# ---- learning curves ------------------------------------------------------------------------------------


def read_run(spec: str) -> tuple[str, list[dict]]:
    """`[LABEL=]RUN_DIR` -> (label, its metrics.jsonl rows); the label defaults to the run's algo."""
    label, _, directory = spec.rpartition("=")
    run_dir = Path(directory)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{metrics} does not exist (is {run_dir} a training run directory?)")
    if not label:
        saved = run_dir / "config.yaml"
        label = yaml.safe_load(saved.read_text()).get("algo", run_dir.name) if saved.is_file() else run_dir.name
    return label, [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def mean_curve(runs: Sequence[Sequence[Mapping]], key: str) -> tuple[list[int], list[float], list[float]]:
    """(iterations, mean, std) of `key` over runs, at every iteration some run logged it (std 0 for one run)."""
    values: dict[int, list[float]] = defaultdict(list)
    for rows in runs:
        for row in rows:
            if isinstance(row.get(key), (int, float)) and not math.isnan(row[key]):
                values[row["iteration"]].append(float(row[key]))
    iterations = sorted(values)
    stats = [mean_std(values[i]) for i in iterations]
    return iterations, [m for m, _ in stats], [s or 0.0 for _, s in stats]


def moving_mean(values: Sequence[float], window: int) -> list[float]:
    """Each value's mean with the (window - 1) before it (fewer at the start)."""
    return [sum(values[max(0, k - window + 1):k + 1]) / len(values[max(0, k - window + 1):k + 1])
            for k in range(len(values))]


def plot_curves(runs: Mapping[str, Sequence[Sequence[Mapping]]], out: Path,
                eval_temperature: float = TrainConfig.eval_temperature, smooth: int = 1) -> Path:
    """A PNG of success over iterations per label (mean ± std band over its runs): training rollouts, and
    held-out evaluation where the runs logged it; `smooth` > 1 draws the moving mean over that many iterations."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("rollout/success", "training rollouts (T = 1.0)")]
    if any("eval/success" in row for label_runs in runs.values() for rows in label_runs for row in rows):
        panels.append(("eval/success", f"held-out (T = {eval_temperature})"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        for label, label_runs in runs.items():
            iterations, mean, std = mean_curve(label_runs, key)
            if smooth > 1:
                mean, std = moving_mean(mean, smooth), moving_mean(std, smooth)
            if iterations:
                line, = ax.plot(iterations, mean, marker="o" if len(iterations) <= 30 else None,
                                label=f"{label} ({len(label_runs)} run(s))")
                ax.fill_between(iterations, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                color=line.get_color(), alpha=0.2)
        smoothed = f", moving mean over {smooth}" if smooth > 1 else ""
        ax.set(title=f"success, {title}{smoothed}", xlabel="iteration", ylim=(0, 1.02))
        ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ---- limen-eval combine -----------------------------------------------------------------------------------


def combine_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="limen-eval combine",
                                     description="Pool results files by label: markdown table and learning curves.")
    parser.add_argument("results", nargs="*", help="results files written by limen-eval --out")
    parser.add_argument("--markdown", help="write the table here (it is printed either way)")
    parser.add_argument("--runs", nargs="*", default=[], help="[LABEL=]RUN_DIR with metrics.jsonl, for --plot")
    parser.add_argument("--plot", help="PNG of the learning curves of --runs")
    return parser


def combine(argv: Sequence[str]) -> int:
    parser = combine_parser()
    args = parser.parse_args(argv)
    if not args.results and not args.runs:
        parser.error("give results files and/or --runs")
    if args.plot and not args.runs:
        parser.error("--plot needs --runs")
    if args.results:
        files = [json.loads(Path(p).read_text()) for p in args.results]
        table = results_table(files)
        if paired := paired_report(files):   # two or more labels: each against the first, paired
            table += "\n\nPaired against the first label (same tasks and eval seeds):\n\n" + paired
        print(table)
        if args.markdown:
            Path(args.markdown).write_text(table + "\n")
    if args.plot:
        runs: dict[str, list[list[dict]]] = defaultdict(list)
        for spec in args.runs:
            label, rows = read_run(spec)
            runs[label].append(rows)
        print(f"learning curves: {plot_curves(runs, Path(args.plot))}")
    return 0
