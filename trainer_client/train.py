"""The RL loop, top to bottom: rollout over gRPC episodes -> readout -> advantages -> PPO epochs -> log.

    limen-train --config configs/<name>.yaml [key=value ...] [--resume]

Every estimator runs through the same loop; what differs is declared by the estimator's `needs`
(which values to read, group size, anchors, entropy), never by `if algo == ...` branches here.
Each iteration reseeds torch from (seed, iteration), so a resumed run samples what the original would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainer_client import cli, configuration, distributed
from trainer_client.algorithms import (
    AdvantageConfig, Advantages, EstimatorNeeds, LossConfig, ValueSource, explained_variance, get_estimator,
    masked_mean,
)
from trainer_client.env_pool import EnvPool, PoolConfig
from trainer_client.evaluate import EVAL_TEMPERATURE, evaluate
from trainer_client.experience import critic_readout, pad_id, policy_readout, turn_batch, turn_samples
from trainer_client.local_server import local_env_server
from trainer_client.memory import HardwareConfig, check_fits
from trainer_client.policy import Critic, Policy, TurnSample
from trainer_client.policy.backends import GenerationConfig, build_backend
from trainer_client.prompts import PromptConfig
from trainer_client.rollout import EpisodeRecord, RolloutConfig, TaskRef, collect
from trainer_client.timing import Timer, breakdown_table, device_synchronizer, mean_stage_seconds
from trainer_client.update import UpdateTargets, critic_update, ppo_policy_update


# ---- configuration ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    """Checkpoint directory or hub name of the policy (and of the separate critic, for ppo_critic)."""
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of every model (bfloat16 halves memory; the value readout stays fp32 either way)."""
    bf16_autocast: bool = False
    """bf16 autocast for forward/backward (fp32 master weights; the value readout stays fp32)."""
    gradient_checkpointing: bool = False


@dataclass(frozen=True)
class EnvConfig:
    name: str = "alfworld"
    train_split: str = "train"
    eval_split: str = ""
    report_splits: tuple[str, ...] = ()
    """More splits evaluated beside eval_split at the same cadence, logged as eval/<split>/... (e.g. ALFWorld's
    out-of-distribution valid_unseen beside the anchor's in-distribution valid_seen)."""
    servers: tuple[str, ...] = ()
    """host:port or dns:///name:port targets; empty starts a local env server for this run."""
    server_args: tuple[str, ...] = ()
    """Extra flags for the local env server, e.g. ["--workers", "2"]."""
    transport: str = "stream"
    allow_mixed_versions: bool = False


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    value_lr: float = 1e-4
    """Learning rate of the two boundary readout rows (their own optimizer group)."""
    critic_lr: float = 1e-5
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    """AdamW's epsilon. Tiny models want ~1e-5 (as PPO implementations use): at 1e-8, parameters whose
    gradient is only noise still step by ~lr each update, and the policy drifts."""
    grad_clip: float = 1.0
    """Gradient-norm clip of the model (backbone and output layer)."""
    value_grad_clip: float = 1.0
    """Gradient-norm clip of the two value rows, apart from the model's (update.ppo_policy_update)."""
    grad_sources_every: int = 0
    """Every this many iterations, log the backbone gradient norm from the policy loss and from the value
    loss separately (grad/backbone_from_*; two extra backward passes over one micro-batch). 0: never."""
    epochs: int = 1
    mini_batch_turns: int = 256
    micro_batch_tokens: int = 16384


@dataclass(frozen=True)
class TrainConfig:
    algo: str = "boundary"
    iterations: int = 150
    episodes_per_iteration: int = 128
    """Equal for every algorithm: tasks = episodes / group_size (boundary 128 x 1, grpo 16 x 8)."""
    group_size: int = 0
    """Rollouts per task; 0 takes the estimator's default."""
    seed: int = 0
    run_dir: str = "runs/default"
    save_every: int = 10
    eval_every: int = 0
    """Evaluate on env.eval_split every this many iterations (0: never during training)."""
    eval_episodes: int = 0
    """Tasks of the eval split to play (0: all)."""
    timing_every: int = 10
    """Print the mean runtime breakdown of the last this many iterations (and of the whole run at the end)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    """The GPUs the run is sized for; when set, the trainer checks its memory estimate first (memory.py)."""


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


# ---- the models of one algorithm, and one learning step ------------------------------------------------


@dataclass
class Learner:
    """What an algorithm trains and reads: the policy (its own critic, through the boundary readout), and
    what some baselines add: a frozen reference for the KL term, a separate critic with its own optimizer."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    reference: Policy | None = None
    critic: Critic | None = None
    critic_optimizer: torch.optim.Optimizer | None = None

    @property
    def pad(self) -> int:
        return pad_id(self.policy.tokenizer)


def load_learner(cfg: TrainConfig, needs: EstimatorNeeds, checkpoint: Path | None = None) -> Learner:
    """The models `cfg` and the estimator's `needs` call for, from cfg.model.path or a run checkpoint
    (whose optimizer states the caller restores)."""
    load = dict(dtype=getattr(torch, cfg.model.dtype), device=cfg.model.device,
                use_bf16_autocast=cfg.model.bf16_autocast)
    # Under torchrun every model is FSDP-sharded before an optimizer holds its parameters (distributed.py).
    policy = distributed.shard(Policy.load(checkpoint / "policy" if checkpoint else cfg.model.path,
                                           gradient_checkpointing=cfg.model.gradient_checkpointing, **load))
    learner = Learner(policy, torch.optim.AdamW(
        policy.parameter_groups(cfg.optim.lr, cfg.optim.value_lr, cfg.optim.weight_decay), eps=cfg.optim.adam_eps))
    if cfg.loss.kl_coef > 0:  # the frozen starting policy (the run's, not the resumed one's)
        learner.reference = distributed.shard(Policy.load(cfg.model.path, tokenizer=policy.tokenizer, **load))
        learner.reference.requires_grad_(False)
    if needs.values in (ValueSource.CRITIC_TURN, ValueSource.CRITIC_TOKEN):
        learner.critic = distributed.shard(Critic.load(checkpoint / "critic" if checkpoint else cfg.model.path,
                                                       gradient_checkpointing=cfg.model.gradient_checkpointing, **load))
        learner.critic_optimizer = torch.optim.AdamW(learner.critic.parameters(), lr=cfg.optim.critic_lr,
                                                       eps=cfg.optim.adam_eps)
    return learner


def learn(learner: Learner, episodes: list[EpisodeRecord], cfg: TrainConfig, timer: Timer,
          iteration: int = 0) -> dict[str, float]:
    """Steps 2-4 of an iteration on finished episodes: readout, advantages, updates. Returns the metrics."""
    estimator = get_estimator(cfg.algo)
    needs = estimator.needs(cfg.advantage)
    samples, tokens = turn_samples(episodes), cfg.optim.micro_batch_tokens

    # 2. Readout (no grad): old log-probs, entropy, and V, Q from the policy's own backbone. A stage an
    #    algorithm does not have is not entered, so its time stays exactly 0.
    with timer("old_log_prob"):  # at the sampling temperature, as the sampler drew the tokens
        old = policy_readout(learner.policy, samples, tokens, cfg.rollout.temperature)
    ref = critic_values = last_values = None
    if learner.reference is not None:
        with timer("ref"):
            ref = policy_readout(learner.reference, samples, tokens, cfg.rollout.temperature)
    if learner.critic is not None:
        with timer("values"):
            critic_values = critic_readout(learner.critic, samples, learner.pad, tokens)
    if needs.last_values:
        with timer("values"):
            last_values = bootstrap_values(learner, episodes, needs, tokens)

    # 3. Advantages: one estimator signature for every algorithm.
    with timer("adv"):
        batch = turn_batch(episodes, old, needs, critic_values, last_values, cfg.advantage.anchor_similarity)
        advantages = estimator(batch, cfg.advantage)
        targets = update_targets(batch, advantages, old, ref, needs)
    metrics = value_metrics(batch, advantages, needs) | sampler_drift(episodes, old)

    # 4. Updates: a separate critic on its own, then the actor (+ V and Q with the readout).
    if learner.critic is not None:
        with timer("update_critic"):
            metrics |= train_critic(learner, samples, batch, advantages, critic_values, needs, cfg)
    with timer("update_actor"):
        metrics |= ppo_policy_update(
            learner.policy, learner.optimizer, samples, targets, cfg.loss, epochs=cfg.optim.epochs,
            mini_batch_turns=cfg.optim.mini_batch_turns, micro_batch_tokens=tokens,
            grad_clip=cfg.optim.grad_clip, pad_id=learner.pad, value_grad_clip=cfg.optim.value_grad_clip,
            temperature=cfg.rollout.temperature,
            measure_gradient_sources=bool(cfg.optim.grad_sources_every) and iteration % cfg.optim.grad_sources_every == 0)
    return metrics


def group_size_of(cfg: TrainConfig) -> int:
    """Rollouts per task; every algorithm plays the same episodes per iteration, so it must divide them."""
    group_size = cfg.group_size or get_estimator(cfg.algo).needs(cfg.advantage).group_size
    if cfg.episodes_per_iteration < group_size or cfg.episodes_per_iteration % group_size:
        raise ValueError(f"episodes_per_iteration={cfg.episodes_per_iteration} is not a multiple of {cfg.algo}'s "
                         f"group size {group_size}: every algorithm must play the same number of episodes")
    return group_size


def print_breakdown(console: Console, rows: list[dict], title: str) -> None:
    mean = mean_stage_seconds(rows)
    share = {k: 100.0 * v / mean["iteration"] for k, v in mean.items()} if mean["iteration"] > 0 else {}
    console.print(breakdown_table({"mean s": mean, "share %": share}, title), markup=False, highlight=False)


# ---- checkpoints --------------------------------------------------------------------------------------


def save_checkpoint(run_dir: Path, iteration: int, learner: Learner, sampler: TaskSampler) -> Path:
    """checkpoints/iter_NNNNNN/{policy/, critic/, trainer_state.pt}, written to a temp dir then renamed."""
    final = run_dir / "checkpoints" / f"iter_{iteration:06d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    learner.policy.save(tmp / "policy")
    if learner.critic is not None:
        learner.critic.save(tmp / "critic")
    torch.save({
        "iteration": iteration,
        "sampler_position": sampler.position,
        "optimizer": learner.optimizer.state_dict(),
        "critic_optimizer": learner.critic_optimizer.state_dict() if learner.critic_optimizer is not None else None,
    }, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    # Replaced in one rename: a trainer killed here leaves the old pointer or the new one, never an empty file.
    pointer = run_dir / "checkpoints" / "latest"
    staged = pointer.with_name("latest.tmp")
    staged.write_text(final.name)
    staged.replace(pointer)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    return run_dir / "checkpoints" / pointer.read_text().strip() if pointer.exists() else None


# ---- the loop -----------------------------------------------------------------------------------------


async def train(cfg: TrainConfig, resume: bool = False, console: Console | None = None) -> Path:
    context = distributed.setup()   # under torchrun: this rank; otherwise one process
    if context.world_size > 1 and resume:
        raise ValueError("--resume under torchrun is not supported: checkpoints keep only the weights there")
    if cfg.hardware.gpus:
        check_fits(cfg)
    console = console or Console(stderr=True, quiet=not context.is_main)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(configuration.to_dict(cfg), sort_keys=False))

    needs = get_estimator(cfg.algo).needs(cfg.advantage)
    group_size = group_size_of(cfg)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=False) if checkpoint else None
    start = state["iteration"] + 1 if state else 0

    learner = load_learner(cfg, needs, checkpoint)
    if state:
        learner.optimizer.load_state_dict(state["optimizer"])
        if learner.critic_optimizer is not None:
            learner.critic_optimizer.load_state_dict(state["critic_optimizer"])
    policy = learner.policy
    # A sharded policy can neither generate nor save; under torchrun a full copy does both.
    generator = distributed.full_copy(policy, lambda: Policy.load(
        checkpoint / "policy" if checkpoint else cfg.model.path, tokenizer=policy.tokenizer,
        dtype=getattr(torch, cfg.model.dtype), device=cfg.model.device if cfg.generation.backend == "transformers"
        else "cpu"))
    backend = build_backend(cfg.generation, generator)
    log = RunLog(run_dir if context.is_main else run_dir / f"rank{context.rank}", start)
    timings: list[dict] = []

    async with contextlib.AsyncExitStack() as stack:
        targets = list(cfg.env.servers) or [await stack.enter_async_context(
            local_env_server([cfg.env.name], cfg.env.server_args, log_file=run_dir / "env_server.log"))]
        pool = await stack.enter_async_context(EnvPool(targets, PoolConfig(
            transport=cfg.env.transport, allow_mixed_versions=cfg.env.allow_mixed_versions)))
        sampler = TaskSampler(await pool.list_tasks(cfg.env.name, cfg.env.train_split), cfg.seed,
                              state["sampler_position"] if state else 0)
        eval_tasks: dict[str, list[str]] = {}   # split -> its tasks; the first is env.eval_split
        for split in ((cfg.env.eval_split, *cfg.env.report_splits) if cfg.env.eval_split and cfg.eval_every else ()):
            tasks = sorted(await pool.list_tasks(cfg.env.name, split))
            eval_tasks[split] = tasks[:cfg.eval_episodes] if cfg.eval_episodes else tasks

        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[status]}"), console=console)
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

                if eval_tasks and context.is_main and (iteration + 1) % cfg.eval_every == 0:
                    for position, (split, tasks) in enumerate(eval_tasks.items()):
                        with timer("eval"):
                            result = await evaluate(pool, backend, policy.tokenizer, cfg.env.name, split, tasks,
                                                    dataclasses.replace(cfg.rollout, temperature=EVAL_TEMPERATURE),
                                                    cfg.prompt, seed=cfg.seed)
                        prefix = "eval" if position == 0 else f"eval/{split}"
                        metrics[f"{prefix}/success"] = result.success
                        metrics[f"{prefix}/score"] = result.score
                        metrics |= {f"{prefix}/success/{k}": c.success for k, c in result.by_category.items()}
                metrics |= {f"time/{k}": v for k, v in timer.seconds.items()}
                metrics["time/rollout"] = rollout_times.wall_s
                metrics["time/iteration"] = timer.iteration_s
                metrics["env_versions"] = json.dumps(pool.versions, sort_keys=True)
                log.write(iteration, metrics)
                timings.append(metrics)
                if cfg.save_every and ((iteration + 1) % cfg.save_every == 0 or iteration + 1 == cfg.iterations):
                    if context.world_size == 1:
                        save_checkpoint(run_dir, iteration, learner, sampler)
                    elif context.is_main:   # optimizer states stay sharded: the weights only
                        generator.save(run_dir / "checkpoints" / f"iter_{iteration:06d}" / "policy")
                if cfg.timing_every and len(timings) % cfg.timing_every == 0:
                    print_breakdown(progress.console, timings[-cfg.timing_every:],
                                    f"{cfg.algo}: runtime of iterations {iteration + 1 - cfg.timing_every}-{iteration}")
                progress.update(bar, advance=1, status=(
                    f"success {metrics['rollout/success']:.2f}  valid {metrics['rollout/valid_action_ratio']:.2f}  "
                    f"{metrics['time/iteration']:.1f}s/it"))
    if timings:
        print_breakdown(console, timings, f"{cfg.algo}: mean runtime per iteration over {len(timings)} iteration(s)")
    return run_dir


def bootstrap_values(learner: Learner, episodes: list[EpisodeRecord], needs: EstimatorNeeds,
                     micro_batch_tokens: int) -> torch.Tensor:
    """[B] V of the state after the last turn for truncated episodes (0 for the others), read by the
    model the estimator takes its values from: the policy's boundary readout or the separate critic."""
    values = torch.zeros(len(episodes))
    cut = [i for i, e in enumerate(episodes) if e.final_prompt_ids]
    if cut:
        eos = (learner.policy.tokenizer.eos_token_id,)  # V is read before the response: any one token will do
        probes = [TurnSample(episodes[i].final_prompt_ids, eos) for i in cut]
        if needs.values is ValueSource.BOUNDARY:
            values[cut] = policy_readout(learner.policy, probes, micro_batch_tokens).values
        else:
            values[cut] = critic_readout(learner.critic, probes, learner.pad, micro_batch_tokens)[:, 0]
    return values


def update_targets(batch, advantages: Advantages, old, ref, needs) -> UpdateTargets:
    """The estimator's [B, T, ...] outputs in the update's [N, ...] sample layout."""
    mask, width = batch.mask, old.log_probs.shape[1]
    boundary = needs.values is ValueSource.BOUNDARY
    return UpdateTargets(
        old_log_probs=old.log_probs,
        response_mask=old.response_mask,
        advantages=advantages.advantages[mask][:, :width],
        ref_log_probs=ref.log_probs if ref is not None else None,
        old_values=old.values if boundary else None,
        old_q_values=old.q_values if boundary else None,
        returns=advantages.returns[mask] if boundary else None,
        q_returns=advantages.q_returns[mask] if boundary and advantages.q_returns is not None else None,
    )


def train_critic(learner: Learner, samples, batch, advantages: Advantages, critic_values, needs,
                 cfg: TrainConfig) -> dict[str, float]:
    token_level = needs.values is ValueSource.CRITIC_TOKEN
    returns = advantages.returns[batch.mask]                       # [N, L] (token form) or [N] (turn form)
    if token_level:
        old, mask, select = critic_values, batch.token_mask[batch.mask], (lambda out: out)
    else:
        old, mask, select = critic_values[:, 0], torch.ones(len(samples), dtype=torch.bool), (lambda out: out[:, 0])
    return critic_update(learner.critic, learner.critic_optimizer, samples, old, returns, mask, cfg.loss,
                         epochs=cfg.optim.epochs, mini_batch_turns=cfg.optim.mini_batch_turns,
                         micro_batch_tokens=cfg.optim.micro_batch_tokens, grad_clip=cfg.optim.grad_clip,
                         pad_id=learner.pad, select=select)


def sampler_drift(episodes: list[EpisodeRecord], old) -> dict[str, float]:
    """Mean |log-prob the sampler drew each token with - the learner's old log-prob|: near 0 when generation
    and learning see the same weights at temperature 1 (a stale or mismatched sampler shows up here)."""
    sampled = torch.zeros_like(old.log_probs)
    for row, turn in enumerate(t for e in episodes for t in e.turns):
        sampled[row, :len(turn.sampled_log_probs)] = torch.tensor(turn.sampled_log_probs, dtype=sampled.dtype)
    return {"policy/sampler_drift": float(masked_mean((old.log_probs - sampled).abs(), old.response_mask))}


def value_metrics(batch, advantages: Advantages, needs) -> dict[str, float]:
    """How well the values explain their targets (before this iteration's update), and the batch std the
    advantages were divided by (before its floor)."""
    out = {} if advantages.raw_std is None else {"advantage/raw_std": float(advantages.raw_std)}
    if needs.values is ValueSource.NONE or advantages.returns is None:
        return out
    if needs.values is ValueSource.CRITIC_TOKEN:
        values, mask = batch.token_values, batch.token_mask
    else:
        values, mask = batch.values, batch.mask
    out |= {"values/explained_variance": float(explained_variance(values, advantages.returns, mask)),
            "values/mean": float(values[mask].mean())}
    if advantages.q_returns is not None:
        out["values/q_explained_variance"] = float(explained_variance(batch.q_values, advantages.q_returns, batch.mask))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = configuration.Parser(prog="limen-train", description="Train a policy with RL over limen env servers.")
    configuration.add_config_arguments(parser, TrainConfig, dry_run=True)
    parser.add_argument("--resume", action="store_true", help="continue from the run dir's latest checkpoint")
    args = parser.parse_intermixed_args(argv)
    cfg = configuration.config_from_args(TrainConfig, parser, args)
    if cli.check_train(cfg).settle(parser.prog, cfg, args.dry_run):
        return 0
    # A tiny-model:SIZE spec becomes the checkpoint it names (built once, cached) before the run loads it.
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=cli.resolve_tiny_model(
        cfg.model.path, cfg.env.name, cfg.env.train_split, cfg.env.servers, cfg.env.server_args, cfg.prompt, cfg.seed)))
    asyncio.run(train(cfg, resume=args.resume))
    return 0


if __name__ == "__main__":
    sys.exit(main())
