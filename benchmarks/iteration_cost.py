"""Iteration cost of the boundary readout vs PPO with a separate critic: same models, batch and episodes,
alternating iteration by iteration in one process (the seed claims 451.2 s -> 301.4 s, a ratio of 0.668).

Both algorithms run the training loop's own learner step (`learner.learn`). Modes:
  synthetic  fixed-length random-token episodes, and generation of fixed-length responses: the learner's
             cost, with no env in it;
  rollout    real episodes of the toy env over a local env server, as in training.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/iteration_cost.py [--mode synthetic|rollout] [--json out.json]

For an accelerator, `time_learners(model_dir, device="cuda", dtype="bfloat16", shape=SyntheticShape(...))`
returns {algo: {stage: mean seconds}}; `--qwen25 1.5b` times a random-init Qwen2.5-1.5B-shaped model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the OpenMP setting)

from trainer_client import config  # noqa: E402
from trainer_client.algorithms import ValueSource, get_estimator  # noqa: E402
from trainer_client.env_pool import EnvPool  # noqa: E402
from trainer_client.learner import Learner, learn, load_learner  # noqa: E402
from trainer_client.local_server import local_env_server  # noqa: E402
from trainer_client.policy import SamplingConfig, TransformersBackend, build_tiny_checkpoint  # noqa: E402
from trainer_client.policy.qwen import build_random_qwen25_checkpoint  # noqa: E402
from trainer_client.rollout import EpisodeRecord, TaskRef, Turn, collect  # noqa: E402
from trainer_client.timing import ITERATION_STAGES, Timer, breakdown_table, device_synchronizer  # noqa: E402
from trainer_client.train import TaskSampler, kept_episodes, plan_episodes  # noqa: E402
from trainer_client.train_config import TrainConfig, group_size_of  # noqa: E402

CLAIMED_RATIO = 301.4 / 451.2
ALGOS = ("boundary", "ppo_critic")
LEARNER_STAGES = tuple(s for s in ITERATION_STAGES if s not in ("generation", "env_wait"))


@dataclass(frozen=True)
class SyntheticShape:
    """One iteration's episodes, every one alike: `turns` turn samples of fixed prompt and response length."""

    episodes: int = 16
    turns: int = 4
    prompt_tokens: int = 192
    response_tokens: int = 32
    success_rate: float = 0.25
    """Share of episodes that end with reward 1 (the rest 0), so advantages and value targets are not constant."""

    def __post_init__(self) -> None:
        for name in ("episodes", "turns", "prompt_tokens", "response_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.success_rate <= 1.0:
            raise ValueError(f"success_rate must be in [0, 1], got {self.success_rate}")


def synthetic_episodes(shape: SyntheticShape, n_tokens: int, group_size: int, seed: int = 0) -> list[EpisodeRecord]:
    """Episodes of random token ids below `n_tokens`; members of a group share a task, and observations
    repeat across turns so GiGPO finds anchor states."""
    generator = torch.Generator().manual_seed(seed)
    winners = round(shape.success_rate * shape.episodes)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(0, n_tokens, (n,), generator=generator).tolist())

    episodes = []
    for index in range(shape.episodes):
        won = index < winners
        turns = [Turn(ids(shape.prompt_tokens), ids(shape.response_tokens), (0.0,) * shape.response_tokens,
                      observation=f"state {turn % 2}", action="act", valid=True, penalty=0.0,
                      reward=float(won and turn == shape.turns - 1), truncated_reply=False)
                 for turn in range(shape.turns)]
        task = TaskRef("synthetic", "train", str(index // group_size), group_id=index // group_size)
        episodes.append(EpisodeRecord(task, turns=turns, terminated=True, won=won, score=float(won)))
    return episodes


def bench_configs(base: TrainConfig, algos: Sequence[str], model: str | Path, device: str, dtype: str,
                  bf16_autocast: bool) -> dict[str, TrainConfig]:
    """`base` per algorithm, on the given model; ppo_critic clips its values as verl-agent does (0.05 here)."""
    configs = {}
    for algo in algos:
        loss = dataclasses.replace(base.loss, value_clip=0.05) if algo == "ppo_critic" else base.loss
        configs[algo] = dataclasses.replace(
            base, algo=algo, loss=loss, model=dataclasses.replace(
                base.model, path=str(model), device=device, dtype=dtype, bf16_autocast=bf16_autocast))
    return configs


def shared_learners(configs: dict[str, TrainConfig]) -> dict[str, Learner]:
    """One policy, optimizer and reference for every algorithm, and one critic for those that read one: the
    same weights for all, so the only difference is each algorithm's own work (and half the memory)."""
    needs = {algo: get_estimator(cfg.algo).needs(cfg.advantage) for algo, cfg in configs.items()}
    reads_critic = {algo: n.values in (ValueSource.CRITIC_TURN, ValueSource.CRITIC_TOKEN) for algo, n in needs.items()}
    loader = next((algo for algo, critic in reads_critic.items() if critic), next(iter(configs)))
    full = load_learner(configs[loader], needs[loader])
    return {algo: full if critic else dataclasses.replace(full, critic=None, critic_optimizer=None)
            for algo, critic in reads_critic.items()}


def alternating(algos: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, algo), the order flipped every round so neither algorithm always runs on a warmer cache."""
    for round_index in range(rounds):
        for algo in (algos if round_index % 2 == 0 else tuple(reversed(algos))):
            yield round_index, algo


def mean_rows(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}


def timed_row(timer: Timer) -> dict[str, float]:
    return {**{stage: timer.seconds[stage] for stage in ITERATION_STAGES}, "iteration": timer.iteration_s}


def time_learners(model: str | Path, algos: Sequence[str] = ALGOS, *, shape: SyntheticShape = SyntheticShape(),
                  device: str = "cpu", dtype: str = "float32", bf16_autocast: bool = False, iterations: int = 3,
                  warmup: int = 1, generation: bool = True, base: TrainConfig = TrainConfig(),
                  seed: int = 0) -> dict[str, dict[str, float]]:
    """Mean seconds per stage of one synthetic iteration of each algorithm: {algo: {stage: s, "iteration": s}}.

    Generation (when on) samples `shape.response_tokens` new tokens for every episode, turn after turn, with
    no stop token, so its cost is fixed; env_wait is 0. The first `warmup` rounds are not counted.
    """
    configs = bench_configs(base, algos, model, device, dtype, bf16_autocast)
    learners = shared_learners(configs)
    policy = next(iter(learners.values())).policy
    episodes = {algo: synthetic_episodes(shape, policy.n_policy_tokens, group_size_of(cfg), seed)
                for algo, cfg in configs.items()}
    never_stops = TransformersBackend(policy.model, policy.n_policy_tokens, stop_ids=(), pad_id=learners[algos[0]].pad)
    sampling = SamplingConfig(max_new_tokens=shape.response_tokens, temperature=1.0)
    rows: dict[str, list[dict[str, float]]] = {algo: [] for algo in algos}
    for round_index, algo in alternating(algos, warmup + iterations):
        torch.manual_seed(seed + round_index)
        timer = Timer(synchronize=device_synchronizer(device))
        if generation:
            with timer("generation"):
                for turn in range(shape.turns):
                    never_stops.generate([e.turns[turn].prompt_ids for e in episodes[algo]], sampling)
        learn(learners[algo], episodes[algo], configs[algo], timer)
        if round_index >= warmup:
            rows[algo].append(timed_row(timer))
    return {algo: mean_rows(algo_rows) for algo, algo_rows in rows.items()}


async def time_rollout_iterations(model: str | Path, algos: Sequence[str] = ALGOS, *, env: str = "toy",
                                  split: str = "train", device: str = "cpu", dtype: str = "float32",
                                  bf16_autocast: bool = False, iterations: int = 3, warmup: int = 1,
                                  base: TrainConfig = TrainConfig(),
                                  server_args: Sequence[str] = ("--workers", "1")) -> dict[str, dict[str, float]]:
    """As time_learners, on real episodes: each round, every algorithm plays the same tasks over a local
    env server with the shared policy, then learns from them."""
    configs = bench_configs(base, algos, model, device, dtype, bf16_autocast)
    configs = {algo: dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name=env, train_split=split))
               for algo, cfg in configs.items()}
    learners = shared_learners(configs)
    policy = next(iter(learners.values())).policy
    backend = TransformersBackend.from_policy(policy)
    rows: dict[str, list[dict[str, float]]] = {algo: [] for algo in algos}
    async with local_env_server([env], server_args) as address, EnvPool([address]) as pool:
        task_ids = await pool.list_tasks(env, split)
        samplers = {algo: TaskSampler(task_ids, base.seed) for algo in algos}
        for round_index, algo in alternating(algos, warmup + iterations):
            cfg = configs[algo]
            torch.manual_seed(base.seed + round_index)
            timer = Timer(synchronize=device_synchronizer(device))
            tasks = plan_episodes(samplers[algo], cfg, group_size_of(cfg), round_index)
            records, times = await collect(pool, backend, policy.tokenizer, tasks, cfg.rollout, cfg.prompt)
            timer.add("generation", times.generation_s)
            timer.add("env_wait", times.env_wait_s)
            episodes = kept_episodes(records, group_size_of(cfg))
            if not episodes:
                raise RuntimeError(f"every episode of {algo} was dropped in round {round_index}")
            learn(learners[algo], episodes, cfg, timer)
            with timer("update_actor"):
                backend.update_weights(policy)
            if round_index >= warmup:
                rows[algo].append(timed_row(timer))
    return {algo: mean_rows(algo_rows) for algo, algo_rows in rows.items()}


def ratios(result: dict[str, dict[str, float]], numerator: str, denominator: str) -> dict[str, float]:
    """Per-stage ratio numerator / denominator (NaN where the denominator spent no time), plus the learner's."""
    top, bottom = result[numerator], result[denominator]
    out = {k: top[k] / bottom[k] if bottom[k] > 0 else float("nan") for k in bottom}
    learner = [sum(r[s] for s in LEARNER_STAGES) for r in (top, bottom)]
    out["learner"] = learner[0] / learner[1] if learner[1] > 0 else float("nan")
    return out


def tiny_toy_checkpoint(out_dir: Path, size: str) -> Path:
    """A tiny random model whose tokenizer is trained on the toy env's text (no download)."""
    from env_server.envs.toy import ToyEnv
    from trainer_client.prompts import build_prompt, expert_reply

    env, texts = ToyEnv(), []
    for task in env.splits()["train"].tasks[:40]:
        step = env.reset("train", task.task_id)
        while not step.done:
            texts.append(build_prompt("toy", step.instruction, step.observation, step.admissible_actions, [], 0))
            texts.append(expert_reply(step.info["expert_action"]))
            step = env.step(step.info["expert_action"])
    return build_tiny_checkpoint(texts, out_dir, size=size)


def main(argv: list[str] | None = None) -> int:
    parser = config.Parser(prog="iteration_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("synthetic", "rollout"), default="synthetic")
    parser.add_argument("--model", help="checkpoint dir (default: a tiny random model, see --tiny-size)")
    parser.add_argument("--tiny-size", default="tiny", help="size of the default model: micro, tiny, small")
    parser.add_argument("--qwen25", choices=("1.5b", "7b"), help="a random-init Qwen2.5-shaped model instead")
    parser.add_argument("--qwen25-layers", type=int, default=0, help="override its depth (0: the real one)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--bf16-autocast", action="store_true")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per iteration (both algorithms)")
    parser.add_argument("--turns", type=int, default=4, help="turns per episode (rollout: the turn limit)")
    parser.add_argument("--prompt-tokens", type=int, default=192, help="synthetic: prompt length")
    parser.add_argument("--response-tokens", type=int, default=32,
                        help="response length (rollout: max new tokens)")
    parser.add_argument("--no-generation", action="store_true", help="synthetic: time the learner only")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per algorithm")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", help="write the result here")
    # The TrainConfig the two learners share: preset, aliases and key=value overrides through the one loader;
    # the flags above come first, so an override such as rollout.max_turns=4 wins.
    config.add_config_arguments(parser, TrainConfig, dry_run=True)
    args = parser.parse_intermixed_args(argv)
    args.overrides = [f"episodes_per_iteration={args.episodes}", f"rollout.max_turns={args.turns}",
                      f"rollout.max_new_tokens={args.response_tokens}", *args.overrides]
    base = config.config_from_args(TrainConfig, parser, args)
    if args.dry_run:
        config.print_config(base)
        return 0
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="iteration_cost_") as scratch:
        if args.model:
            model = Path(args.model)
        elif args.qwen25:
            depth = {"num_hidden_layers": args.qwen25_layers} if args.qwen25_layers else {}
            model = build_random_qwen25_checkpoint(Path(scratch) / "qwen25", args.qwen25, **depth)
        else:
            model = tiny_toy_checkpoint(Path(scratch) / "tiny", args.tiny_size)
        if args.mode == "synthetic":
            shape = SyntheticShape(args.episodes, args.turns, args.prompt_tokens, args.response_tokens)
            result = time_learners(model, shape=shape, device=args.device, dtype=args.dtype,
                                   bf16_autocast=args.bf16_autocast, iterations=args.iterations, warmup=args.warmup,
                                   generation=not args.no_generation, base=base)
            setting = dataclasses.asdict(shape)
        else:
            result = asyncio.run(time_rollout_iterations(
                model, device=args.device, dtype=args.dtype, bf16_autocast=args.bf16_autocast,
                iterations=args.iterations, warmup=args.warmup, base=base))
            setting = {"episodes": args.episodes, "env": "toy", "rollout": dataclasses.asdict(base.rollout)}

    ratio = ratios(result, *ALGOS)
    print(breakdown_table({**result, "ratio": ratio},
                          f"{args.mode}: mean seconds per iteration over {args.iterations} alternating iterations"))
    print(f"iteration-time ratio boundary/ppo_critic = {ratio['iteration']:.3f} "
          f"(learner stages only: {ratio['learner']:.3f}; the seed's claim: {CLAIMED_RATIO:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "mode": args.mode, "model": args.qwen25 or args.model or f"tiny:{args.tiny_size}", "device": args.device,
            "dtype": args.dtype, "bf16_autocast": args.bf16_autocast, "threads": args.threads,
            "iterations": args.iterations, "setting": setting, "seconds": result, "ratio": ratio,
            "claimed_ratio": CLAIMED_RATIO, "overrides": args.overrides}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
