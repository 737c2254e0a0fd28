"""Held-out evaluation and `limen-eval`: success per task category, WebShop score, mean ± std over seeds.

    limen-eval --checkpoint DIR --env alfworld --split valid_seen [--env-servers HOST:PORT,...] [--episodes N]
               [--seeds 0,1,2] [--prompting zero-shot|react] [--out results.json] [--config PRESET] [key=value ...]
               [--dry-run]
    limen-eval combine a.json b.json ... [--markdown table.md] [--runs [LABEL=]RUN_DIR ...] [--plot curves.png]

Sampling is at the anchor's temperature 0.4 (TrainConfig.eval_temperature). Each results file holds one
checkpoint's counts per eval seed; `combine` pools files by label into the anchor's table
(docs/DESIGN.md#anchor-numbers) and plots learning curves from runs' metrics.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainer_client import config, preflight
from trainer_client.checkpoints import find_run_config
from trainer_client.env_pool import EnvPool
from trainer_client.local_server import EnvTarget, open_env_pool
from trainer_client.paired import paired_report
from trainer_client.policy import Policy, TransformersBackend
from trainer_client.policy.dtypes import ModelDtype, names, torch_dtype
from trainer_client.policy.generation import GenerationBackend
from trainer_client.policy.qwen import QWEN25_CHAT_TEMPLATE
from trainer_client.prompting_baselines import PROMPTING_STYLES, prompt_config
from trainer_client.prompts import PromptConfig
from trainer_client.rollout import EpisodeRecord, RolloutConfig, TaskRef, collect
from trainer_client.train_config import TrainConfig

# The anchor table's columns: ALFWorld's six task types (short names as verl-agent reports them), WebShop's two.
ALFWORLD_CATEGORIES = ("pick", "look", "clean", "heat", "cool", "pick2")
WEBSHOP_COLUMNS = (("WS Score", "score"), ("WS Succ", "success"))
CHAT_TEMPLATES = {"": None, "qwen25": QWEN25_CHAT_TEMPLATE}  # "": the checkpoint's own


@dataclass(frozen=True)
class CategoryResult:
    episodes: int
    won: int
    score_sum: float

    @property
    def success(self) -> float:
        return self.won / self.episodes if self.episodes else float("nan")


@dataclass(frozen=True)
class EpisodeOutcome:
    won: bool
    score: float
    category: str


@dataclass(frozen=True)
class EvalResult:
    env: str
    split: str
    by_category: dict[str, CategoryResult]
    dropped: int = 0
    episodes: tuple[EpisodeRecord, ...] = field(default=(), repr=False)

    @property
    def total(self) -> CategoryResult:
        cats = self.by_category.values()
        return CategoryResult(sum(c.episodes for c in cats), sum(c.won for c in cats), sum(c.score_sum for c in cats))

    @property
    def success(self) -> float:
        return self.total.success

    @property
    def score(self) -> float:
        """Mean env score x 100 (WebShop's "Score"; for ALFWorld equal to success x 100)."""
        total = self.total
        return 100.0 * total.score_sum / total.episodes if total.episodes else float("nan")

    @property
    def outcomes(self) -> dict[tuple[str, int], EpisodeOutcome]:
        """Each finished episode's outcome keyed by (task id, env/eval seed): what paired comparisons use."""
        return {(r.task.task_id, r.task.seed): EpisodeOutcome(r.won, r.score, r.category or "all")
                for r in self.episodes if r.ok}

    def as_dict(self) -> dict:
        return {
            "env": self.env, "split": self.split, "episodes": self.total.episodes, "success": self.success,
            "score": self.score, "dropped": self.dropped,
            "by_category": {k: {"episodes": c.episodes, "won": c.won, "success": c.success}
                            for k, c in sorted(self.by_category.items())},
            "outcomes": [{"task_id": task_id, "seed": seed, "won": o.won, "score": o.score, "category": o.category}
                         for (task_id, seed), o in sorted(self.outcomes.items())],
        }


def summarize(env: str, split: str, records: Sequence[EpisodeRecord]) -> EvalResult:
    counts: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    for r in records:
        if r.ok:
            c = counts[r.category or "all"]
            c[0], c[1], c[2] = c[0] + 1, c[1] + int(r.won), c[2] + r.score
    return EvalResult(env, split, {k: CategoryResult(*v) for k, v in counts.items()},
                      dropped=sum(not r.ok for r in records), episodes=tuple(records))


async def evaluate(pool: EnvPool, backend: GenerationBackend, tokenizer, env: str, split: str,
                   task_ids: Sequence[str], rollout: RolloutConfig, prompts: PromptConfig, seed: int = 0) -> EvalResult:
    """Play every task once (env seed and sampling seed `seed`) and count wins per category; dropped episodes
    are not counted. Each episode samples from its own seeds (rollout.episode_seeds: eval seed and task), so
    the result is a function of the weights, the tasks and the seed, not of batching or concurrency."""
    tasks = [TaskRef(env, split, task_id, seed=seed, group_id=i) for i, task_id in enumerate(task_ids)]
    records, _ = await collect(pool, backend, tokenizer, tasks, rollout, prompts, seed=seed)
    return summarize(env, split, records)


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


def plot_curves(runs: Mapping[str, Sequence[Sequence[Mapping]]], out: Path,
                eval_temperature: float = TrainConfig.eval_temperature) -> Path:
    """A PNG of success over iterations per label (mean ± std band over its runs): training rollouts, and
    held-out evaluation where the runs logged it."""
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
            if iterations:
                line, = ax.plot(iterations, mean, marker="o" if len(iterations) <= 30 else None,
                                label=f"{label} ({len(label_runs)} run(s))")
                ax.fill_between(iterations, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                color=line.get_color(), alpha=0.2)
        ax.set(title=f"success, {title}", xlabel="iteration", ylim=(0, 1.02))
        ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ---- limen-eval -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalJob:
    """One `limen-eval` run: a checkpoint on one split, once per seed."""

    checkpoint: str = ""
    """Policy checkpoint dir (or any HF causal LM dir)."""
    env: EnvTarget = field(default_factory=EnvTarget)
    """The env, its held-out split, and the servers (empty: a local server is started)."""
    episodes: int = 0
    """Play a fixed random N tasks of the split (0: all)."""
    seeds: tuple[int, ...] = (0,)
    """Eval seeds (env and sampling), e.g. --seeds 0,1,2."""
    prompting: str = ""
    """A prompting baseline (zero-shot, react) instead of the trained prompt."""
    label: str = ""
    """Row name in tables (default: the run's algo, or the checkpoint's name and the prompting style)."""
    chat_template: str = ""
    """For checkpoints without one: qwen25 (Qwen2.5's ChatML template)."""
    temperature: float = TrainConfig.eval_temperature
    max_turns: int = 0
    """0: the env's default (ALFWorld 50, WebShop 15)."""
    max_new_tokens: int = 0
    """0: the run's setting (or 512)."""
    concurrency: int = 32
    """Episodes played at once."""
    device: str = "cpu"
    dtype: ModelDtype = "float32"
    run_config: str = ""
    """The run's config.yaml (default: found beside the checkpoint)."""
    out: str = ""
    """Write the results file here."""

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("give a checkpoint (--checkpoint DIR or checkpoint=DIR)")
        if self.prompting and self.prompting not in PROMPTING_STYLES:
            raise ValueError(f"prompting must be one of {list(PROMPTING_STYLES)}, got {self.prompting!r}")
        if not self.seeds:
            raise ValueError("give at least one seed")
        if self.episodes < 0 or self.max_turns < 0 or self.max_new_tokens < 0 or self.concurrency < 1:
            raise ValueError("episodes, max_turns and max_new_tokens must be >= 0, concurrency >= 1")
        if self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(f"chat_template must be one of {[n for n in CHAT_TEMPLATES if n]}, got {self.chat_template!r}")
        if self.dtype not in names(ModelDtype):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")


def job_settings(job: EvalJob) -> tuple[str, PromptConfig, RolloutConfig]:
    """(label, prompts, rollout): the run's own prompt and response length when its config is found, the
    job's overrides, the eval temperature, the env's own turn limit unless the job sets one, and lock-step
    generation so a seed replays exactly."""
    config_path = Path(job.run_config) if job.run_config else find_run_config(Path(job.checkpoint))
    run = yaml.safe_load(config_path.read_text()) if config_path else {}
    prompts = config.from_dict(PromptConfig, run.get("prompt", {}), "prompt")
    rollout = config.from_dict(RolloutConfig, run.get("rollout", {}), "rollout")
    if job.prompting:
        prompts = prompt_config(job.prompting, job.env.name, prompts)
    rollout = dataclasses.replace(
        rollout, temperature=job.temperature, batch_wait_s=0.0, max_concurrent_episodes=job.concurrency,
        max_turns=job.max_turns, max_new_tokens=job.max_new_tokens or rollout.max_new_tokens)
    name = Path(job.checkpoint).name
    label = job.label or (f"{name} ({job.prompting})" if job.prompting else run.get("algo", name))
    return label, prompts, rollout


async def run_job(job: EvalJob) -> dict:
    """Evaluate the checkpoint once per seed; returns the results file's content."""
    label, prompts, rollout = job_settings(job)
    policy = Policy.load(job.checkpoint, device=job.device, dtype=torch_dtype(job.dtype),
                         chat_template=CHAT_TEMPLATES[job.chat_template])
    backend = TransformersBackend.from_policy(policy)
    runs = []
    env = job.env
    async with open_env_pool(env.servers, [env.name], env.server_args) as pool:
        split = (await pool.list_envs())[env.name].splits[env.split]
        task_ids = subset(await pool.list_tasks(env.name, env.split), job.episodes)
        for seed in job.seeds:
            result = await evaluate(pool, backend, policy.tokenizer, env.name, env.split, task_ids, rollout, prompts,
                                    seed=seed)
            runs.append({"seed": seed, **result.as_dict()})
            print(f"{label} seed {seed}: {describe(result)}", file=sys.stderr)
    return {"label": label, "checkpoint": job.checkpoint, "env": env.name, "split": env.split,
            "split_tasks": split.num_tasks, "split_excluded": split.num_excluded, "tasks_played": len(task_ids),
            "prompting": job.prompting, "temperature": job.temperature, "seeds": list(job.seeds),
            "env_versions": pool.versions, "runs": runs}


def subset(task_ids: Sequence[str], n: int) -> list[str]:
    """Every task (n = 0), or a fixed random n of them: the same for every seed and checkpoint, and not one
    category only, as a prefix of the sorted ids would be."""
    ordered = sorted(task_ids)
    return ordered if n == 0 or n >= len(ordered) else sorted(random.Random(0).sample(ordered, n))


def describe(result: EvalResult) -> str:
    cats = ", ".join(f"{k} {c.won}/{c.episodes}" for k, c in sorted(result.by_category.items()))
    return (f"success {100 * result.success:.1f}% score {result.score:.1f} over {result.total.episodes} episodes "
            f"({cats}; dropped {result.dropped})")


def eval_parser() -> argparse.ArgumentParser:
    """The preset, the aliases and key=value overrides of an EvalJob (trainer_client.config), --dry-run."""
    parser = config.Parser(prog="limen-eval", description="Evaluate a checkpoint on a held-out split "
                                  "(or `limen-eval combine ...` to tabulate results files).")
    config.add_config_arguments(parser, EvalJob, dry_run=True)
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["combine"]:
        return combine(argv[1:])
    parser = eval_parser()
    args = parser.parse_intermixed_args(argv)
    job = config.config_from_args(EvalJob, parser, args)
    if preflight.check_eval(job).settle(parser.prog, job, args.dry_run):
        return 0
    results = asyncio.run(run_job(job))
    summary = summarize_results(results["runs"])
    print(json.dumps({"label": results["label"], "env": job.env.name, "split": job.env.split,
                      "success": summary.get("success"), "score": summary.get("score")}))
    if job.out:
        Path(job.out).parent.mkdir(parents=True, exist_ok=True)
        Path(job.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
