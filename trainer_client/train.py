"""The RL loop, top to bottom: rollout over gRPC episodes -> readout -> advantages -> PPO epochs -> log.

    limen-train --config configs/<name>.yaml [key=value ...] [--resume]

Every estimator runs through the same loop; what differs is declared by the estimator's `needs`
(which values to read, group size, anchors, entropy), never by `if algo == ...` branches here.
Each iteration reseeds torch from (seed, iteration), so a resumed run samples what the original would have.

Where each step lives: the config in train_config.py; 1. the rollout in rollout.py (over env_pool/, with the
policy's generation backend); 2-4. readout, advantages and updates in learner.py (readout.py for where V comes from,
algorithms/ for the math, update.py for the PPO epochs); checkpoints in checkpoints.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import platform
import random
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainer_client import config, distributed, preflight
from trainer_client.algorithms import get_estimator
from trainer_client.checkpoints import checkpoint_dir, latest_checkpoint, save_checkpoint, trainer_state
from trainer_client.env_pool import EnvPool, PoolConfig
from trainer_client.evaluate import evaluate
from trainer_client.gpu_memory import check_fits
from trainer_client.learner import Learner, learn, load_learner
from trainer_client.local_server import open_env_pool
from trainer_client.log_lines import LogLines
from trainer_client.policy import Policy
from trainer_client.policy.generation import build_backend
from trainer_client.rollout import EpisodeRecord, TaskRef, collect
from trainer_client.run_summary import run_summary
from trainer_client.timing import Timer, breakdown_table, device_synchronizer, mean_stage_seconds
from trainer_client.train_config import TrainConfig, group_size_of
from trainer_client.warm_start import starting_point


# ---- small pieces the loop uses -----------------------------------------------------------------------


class TaskSampler:
    """Distinct tasks per iteration: walks seeded permutations of the split, one per pass over it."""

    def __init__(self, task_ids: list[str], seed: int, position: int = 0) -> None:
        if not task_ids:
            raise ValueError("the training split has no tasks")
        self.task_ids, self.seed, self.position = sorted(task_ids), seed, position
        self._order: tuple[int, list[str]] | None = None

    def draw(self, n: int) -> list[str]:
        drawn = []
        for _ in range(n):
            pass_index, offset = divmod(self.position, len(self.task_ids))
            if self._order is None or self._order[0] != pass_index:
                self._order = (pass_index, random.Random(f"{self.seed}/{pass_index}").sample(self.task_ids, len(self.task_ids)))
            drawn.append(self._order[1][offset])
            self.position += 1
        return drawn


def iteration_seed(seed: int, iteration: int) -> int:
    return random.Random(f"{seed}/iteration/{iteration}").getrandbits(31)


def plan_episodes(sampler: TaskSampler, cfg: TrainConfig, group_size: int, iteration: int) -> list[TaskRef]:
    """Tasks x group_size episodes; members of a group share the task and the env seed."""
    n_tasks = max(1, cfg.episodes_per_iteration // group_size)
    rng = random.Random(iteration_seed(cfg.seed, iteration))
    tasks = []
    for group, task_id in enumerate(sampler.draw(n_tasks)):
        env_seed = rng.getrandbits(31)
        tasks += [TaskRef(cfg.env.name, cfg.env.train_split, task_id, env_seed, group)] * group_size
    return tasks


def kept_episodes(records: list[EpisodeRecord], group_size: int) -> list[EpisodeRecord]:
    """Finished episodes; for group methods a group with any dropped member goes whole (never scored 0)."""
    broken = {r.task.group_id for r in records if not r.ok}
    return [r for r in records if r.ok and (group_size == 1 or r.task.group_id not in broken)]


def rollout_metrics(records: list[EpisodeRecord], kept: list[EpisodeRecord]) -> dict[str, float]:
    turns = [t for e in kept for t in e.turns]
    n = max(1, len(kept))
    return {
        "rollout/success": sum(e.won for e in kept) / n,
        "rollout/score": sum(e.score for e in kept) / n,
        "rollout/return": sum(t.reward - t.penalty for t in turns) / n,
        "rollout/turns": len(turns) / n,
        "rollout/valid_action_ratio": sum(t.valid for t in turns) / max(1, len(turns)),
        "rollout/truncated": sum(e.truncated for e in kept) / n,
        "rollout/response_tokens": sum(len(t.response_ids) for t in turns) / max(1, len(turns)),
        "rollout/episodes": len(kept),
        "rollout/dropped": len(records) - len(kept),
        "rollout/replays": sum(e.replays for e in records),
    }


class RunLog:
    """metrics.jsonl (one line per iteration, the source of every plot and table) + TensorBoard."""

    def __init__(self, run_dir: Path, resume_from: int) -> None:
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists():  # a resumed run rewrites what came after its checkpoint
            lines = [l for l in self.path.read_text().splitlines() if l and json.loads(l)["iteration"] < resume_from]
            self.path.write_text("".join(l + "\n" for l in lines))
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:  # TensorBoard is optional; the JSONL is the record
            self.tensorboard = None

    def write(self, iteration: int, metrics: dict[str, float | str]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
        if self.tensorboard is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, iteration)
            self.tensorboard.flush()


# ---- setting a run up, and what it does besides learning ----------------------------------------------


def start_run_dir(cfg: TrainConfig) -> Path:
    """The run directory, with the resolved config written into it (what `limen-eval` and reports read)."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(cfg), sort_keys=False))
    return run_dir


def record_start(run_dir: Path, iteration: int) -> None:
    """One line per start or resume in starts.jsonl: where, and with how many threads, the run went on from
    `iteration`. Same-seed runs agree only at the same thread count (float reduction order)."""
    row = {"iteration": iteration, "host": platform.node(), "torch": torch.__version__,
           "torch_threads": torch.get_num_threads()}
    with (run_dir / "starts.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")


def restore_optimizers(learner: Learner, state: dict) -> None:
    """The optimizer states, and what the first iteration learned about the sampler's readout (a resumed run
    must take the old log-probs from where the unbroken run took them)."""
    learner.sampler_readout_exact = state.get("sampler_readout_exact")
    if "optimizer" not in state:   # carried without its moments (benchmarks/real_model_carry.py): Adam starts afresh
        return
    learner.optimizer.load_state_dict(state["optimizer"])
    if learner.critic_optimizer is not None:
        learner.critic_optimizer.load_state_dict(state["critic_optimizer"])


def generation_copy(cfg: TrainConfig, policy: Policy, checkpoint: Path | None) -> Policy:
    """The policy that generates and saves: the learner's own, or under torchrun a full copy (a sharded
    policy can do neither)."""
    return distributed.full_copy(policy, lambda: Policy.load(
        checkpoint / "policy" if checkpoint else cfg.model.path, tokenizer=policy.tokenizer,
        dtype=getattr(torch, cfg.model.dtype), device=cfg.model.device if cfg.generation.backend == "transformers"
        else "cpu"))


async def eval_task_lists(pool: EnvPool, cfg: TrainConfig) -> dict[str, list[str]]:
    """Split -> the tasks evaluated during training; the first is env.eval_split, then env.report_splits."""
    eval_tasks: dict[str, list[str]] = {}
    for split in ((cfg.env.eval_split, *cfg.env.report_splits) if cfg.env.eval_split and cfg.eval_every else ()):
        tasks = sorted(await pool.list_tasks(cfg.env.name, split))
        eval_tasks[split] = tasks[:cfg.eval_episodes] if cfg.eval_episodes else tasks
    return eval_tasks


async def evaluate_splits(pool: EnvPool, backend, tokenizer, cfg: TrainConfig, eval_tasks: dict[str, list[str]],
                          timer: Timer) -> dict[str, float]:
    """Held-out success and score of the current weights, at the evaluation temperature."""
    metrics = {}
    for position, (split, tasks) in enumerate(eval_tasks.items()):
        with timer("eval"):
            result = await evaluate(pool, backend, tokenizer, cfg.env.name, split, tasks,
                                    dataclasses.replace(cfg.rollout, temperature=cfg.eval_temperature),
                                    cfg.prompt, seed=cfg.seed)
        prefix = "eval" if position == 0 else f"eval/{split}"
        metrics[f"{prefix}/success"] = result.success
        metrics[f"{prefix}/score"] = result.score
        metrics |= {f"{prefix}/success/{k}": c.success for k, c in result.by_category.items()}
    return metrics


def save(run_dir: Path, iteration: int, learner: Learner, generator: Policy, sampler: TaskSampler,
         context: distributed.DistributedContext) -> None:
    if context.world_size == 1:
        save_checkpoint(run_dir, iteration, learner, sampler.position)
    elif context.is_main:   # optimizer states stay sharded: the weights only
        generator.save(checkpoint_dir(run_dir, iteration) / "policy")


def print_breakdown(console: Console, rows: list[dict], title: str) -> None:
    mean = mean_stage_seconds(rows)
    share = {k: 100.0 * v / mean["iteration"] for k, v in mean.items()} if mean["iteration"] > 0 else {}
    console.print(breakdown_table({"mean s": mean, "share %": share}, title), markup=False, highlight=False)


# ---- the loop -----------------------------------------------------------------------------------------


async def train(cfg: TrainConfig, resume: bool = False, console: Console | None = None,
                on_checkpoint: Callable[[Path], None] | None = None) -> Path:
    """Run cfg's iterations (from the latest checkpoint with `resume`); `on_checkpoint(folder)` is called after
    each checkpoint is written, e.g. to carry it elsewhere."""
    context = distributed.setup()   # under torchrun: this rank; otherwise one process
    if context.world_size > 1 and resume:
        raise ValueError("--resume under torchrun is not supported: checkpoints keep only the weights there")
    if cfg.hardware.gpus:
        check_fits(cfg)
    console = console or Console(stderr=True, quiet=not context.is_main)
    run_dir = start_run_dir(cfg)

    needs = get_estimator(cfg.algo).needs(cfg.advantage)
    group_size = group_size_of(cfg)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    state = trainer_state(checkpoint) if checkpoint else None
    start = state["iteration"] + 1 if state else 0
    learner = load_learner(cfg, needs, checkpoint)
    if state:
        restore_optimizers(learner, state)
        console.print(f"resuming from {checkpoint} at iteration {start}", markup=False, highlight=False)
    policy = learner.policy
    generator = generation_copy(cfg, policy, checkpoint)
    backend = build_backend(cfg.generation, generator)
    log = RunLog(run_dir if context.is_main else run_dir / f"rank{context.rank}", start)
    if context.is_main:
        record_start(run_dir, start)
    timings: list[dict] = []

    pool_config = PoolConfig(transport=cfg.env.transport, allow_mixed_versions=cfg.env.allow_mixed_versions)
    async with open_env_pool(cfg.env.servers, [cfg.env.name], cfg.env.server_args, pool_config,
                             log_file=run_dir / "env_server.log") as pool:
        sampler = TaskSampler(await pool.list_tasks(cfg.env.name, cfg.env.train_split), cfg.seed,
                              state["sampler_position"] if state else 0)
        eval_tasks = await eval_task_lists(pool, cfg)
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[status]}"), console=console)
        lines = LogLines(progress.console, every_s=0)   # an iteration takes long enough to say each one
        with progress:
            bar = progress.add_task(f"{cfg.algo} on {cfg.env.name}", total=cfg.iterations, completed=start, status="")
            for iteration in range(start, cfg.iterations):
                timer = Timer(synchronize=device_synchronizer(cfg.model.device))
                torch.manual_seed(iteration_seed(cfg.seed, iteration) + context.rank)

                # 1. Rollout: N tasks x group_size episodes over the wire (each rank plays its share).
                tasks = distributed.local_share(plan_episodes(sampler, cfg, group_size, iteration))
                records, rollout_times = await collect(pool, backend, policy.tokenizer, tasks, cfg.rollout, cfg.prompt,
                                                       seed=iteration_seed(cfg.seed, iteration) + context.rank)
                records = distributed.gather_shares(records)
                timer.add("generation", rollout_times.generation_s)
                timer.add("env_wait", rollout_times.env_wait_s)
                episodes = kept_episodes(records, group_size)
                metrics = rollout_metrics(records, episodes)
                if not episodes:
                    log.write(iteration, {**metrics, "skipped": "every episode was dropped"})
                    progress.update(bar, advance=1, status="all episodes dropped")
                    continue

                # 2-4. Readout, advantages, updates; then the next rollout samples from the new weights.
                distributed.reseed_together(iteration_seed(cfg.seed, iteration))   # the same mini-batches
                metrics |= learn(learner, episodes, cfg, timer, iteration)
                with timer("update_actor"):
                    distributed.copy_full_weights(policy, generator)
                    backend.update_weights(generator)

                # 5. Held-out evaluation, the log line, a checkpoint.
                if eval_tasks and context.is_main and (iteration + 1) % cfg.eval_every == 0:
                    metrics |= await evaluate_splits(pool, backend, policy.tokenizer, cfg, eval_tasks, timer)
                metrics |= {f"time/{k}": v for k, v in timer.seconds.items()}
                metrics["time/rollout"] = rollout_times.wall_s
                metrics["time/iteration"] = timer.iteration_s
                metrics["env_versions"] = json.dumps(pool.versions, sort_keys=True)
                log.write(iteration, metrics)
                timings.append(metrics)
                if cfg.save_every and ((iteration + 1) % cfg.save_every == 0 or iteration + 1 == cfg.iterations):
                    save(run_dir, iteration, learner, generator, sampler, context)
                    if on_checkpoint is not None and context.is_main:
                        on_checkpoint(checkpoint_dir(run_dir, iteration))
                if cfg.timing_every and len(timings) % cfg.timing_every == 0:
                    print_breakdown(progress.console, timings[-cfg.timing_every:],
                                    f"{cfg.algo}: runtime of iterations {iteration + 1 - cfg.timing_every}-{iteration}")
                status = (f"success {metrics['rollout/success']:.2f}  valid {metrics['rollout/valid_action_ratio']:.2f}  "
                          f"{metrics['time/iteration']:.1f}s/it")
                progress.update(bar, advance=1, status=status)
                lines.say(f"iteration {iteration + 1}/{cfg.iterations}: {status}")
    if timings:
        print_breakdown(console, timings, f"{cfg.algo}: mean runtime per iteration over {len(timings)} iteration(s)")
    return run_dir


def main(argv: list[str] | None = None) -> int:
    parser = config.Parser(prog="limen-train", description="Train a policy with RL over limen env servers.")
    config.add_config_arguments(parser, TrainConfig, dry_run=True)
    parser.add_argument("--resume", action="store_true", help="continue from the run dir's latest checkpoint")
    args = parser.parse_intermixed_args(argv)
    cfg = config.config_from_args(TrainConfig, parser, args)
    if preflight.check_train(cfg).settle(parser.prog, cfg, args.dry_run):
        return 0
    # A tiny-model:SIZE spec becomes the checkpoint it names, and init: sft its warm start (each built once,
    # cached) before the run loads it. The run's config.yaml then names what was loaded, with init cleared: a run
    # started again from that file must not fine-tune the warm start a second time.
    start = asyncio.run(starting_point(cfg))
    if os.environ.get("RANK", "0") == "0":   # under torchrun, one line for all ranks
        print(start.line, file=sys.stderr)
    cfg = dataclasses.replace(cfg, init="", model=dataclasses.replace(cfg.model, path=start.path))
    run_dir = asyncio.run(train(cfg, resume=args.resume))
    if distributed.rank() == 0:
        print("\n".join(run_summary(cfg, run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
