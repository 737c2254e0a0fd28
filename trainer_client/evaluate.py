"""Held-out evaluation and `limen-eval`: success per task category, WebShop score, mean ± std over seeds.

    limen-eval --checkpoint DIR --env alfworld --split valid_seen [--env-servers HOST:PORT,...] [--episodes N]
               [--seeds 0,1,2] [--prompting zero-shot|react] [--out results.json] [--config PRESET] [key=value ...]
               [--dry-run]
    limen-eval combine a.json b.json ... [--markdown table.md] [--runs [LABEL=]RUN_DIR ...] [--plot curves.png]

Sampling is at the anchor's temperature 0.4 (TrainConfig.eval_temperature). Each results file holds one
checkpoint's counts per eval seed; `combine` (eval_report.py) pools files by label into the anchor's table
(docs/DESIGN.md#anchor-numbers) and plots learning curves from runs' metrics.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainer_client import config, preflight
from trainer_client.checkpoints import find_run_config
from trainer_client.env_pool import EnvPool
from trainer_client.eval_report import combine, summarize_results
from trainer_client.local_server import EnvTarget, open_env_pool
from trainer_client.policy import Policy, TransformersBackend
from trainer_client.policy.dtypes import ModelDtype, names, torch_dtype
from trainer_client.policy.generation import GenerationBackend
from trainer_client.policy.qwen import QWEN25_CHAT_TEMPLATE
from trainer_client.prompting_baselines import PROMPTING_STYLES, prompt_config
from trainer_client.prompts import PromptConfig
from trainer_client.rollout import EpisodeRecord, RolloutConfig, TaskRef, collect
from trainer_client.train_config import TrainConfig

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
