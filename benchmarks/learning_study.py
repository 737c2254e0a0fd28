"""The CPU-scale learning study: per seed, one SFT warm start shared by every algorithm, then RL with each
algorithm at equal episodes per iteration and equal iterations, then held-out evaluation per category.
RESULTS.md and the learning curves are generated from the runs' results files, never typed in.

    python benchmarks/learning_study.py --config configs/study.yaml [key=value ...] [--estimate | --report-only]

Resumable: a seed's SFT (`seed_S/sft.json`) and an algorithm's RL + evaluation (`seed_S/ARM/results.json`)
are skipped when their results file exists; an interrupted RL run resumes from its last checkpoint; an
out_dir that holds runs made with other settings is refused. `--estimate` times the first seed's SFT (kept
for the study) and a few RL iterations of every algorithm, and prints the study's projected time.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402  (after the thread settings)
import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402

from trainer_client import configuration  # noqa: E402
from trainer_client.env_pool import EnvPool  # noqa: E402
from trainer_client.evaluate import (  # noqa: E402
    EVAL_TEMPERATURE, evaluate, mean_std, plot_curves, read_run, results_table, subset,
)
from trainer_client.local_server import local_env_server  # noqa: E402
from trainer_client.policy import Policy, TransformersBackend, build_tiny_checkpoint  # noqa: E402
from trainer_client.sft import expert_episodes, expert_samples, expert_texts, sft  # noqa: E402
from trainer_client.timing import ITERATION_STAGES, mean_stage_seconds  # noqa: E402
from trainer_client.train import TrainConfig, group_size_of, latest_checkpoint, train  # noqa: E402

# Each study arm: an estimator and the settings that make it the baseline the issue names. Everything
# else (model, lr, episodes, iterations) comes from the study's one `rl` config, equal for all.
CORE_ARMS: dict[str, tuple[str, ...]] = {
    "boundary": ("algo=boundary",),                                         # ours: N tasks x 1 rollout
    "grpo": ("algo=grpo",),                                                 # N/8 tasks x 8 rollouts
    "ppo_critic_turn": ("algo=ppo_critic", "advantage.ppo_critic_form=turn"),  # our credit, a separate critic
    # verl-agent's PPO baseline: token-level GAE inside each turn, values clipped at 0.5 on its x10 reward scale.
    "ppo_critic_verl": ("algo=ppo_critic", "advantage.ppo_critic_form=verl", "loss.value_clip=0.05"),
}
EXTENDED_ARMS: dict[str, tuple[str, ...]] = {
    "rloo": ("algo=rloo",),
    "gigpo": ("algo=gigpo",),
    "empg": ("algo=empg",),
}
# Settings that may change between invocations on one out_dir without making its finished runs stale.
RESUMABLE_CHANGES = ("report_dir", "seeds", "extended", "estimate_iterations")
SFT_LABEL = "SFT (start)"
CURVES_PNG = "results_learning_curves.png"
INTERPRETATION_MD = "RESULTS_interpretation.md"


@dataclass(frozen=True)
class StudyConfig:
    out_dir: str = "runs/study"
    """Every run's checkpoints, metrics and results files."""
    report_dir: str = "docs"
    """Where RESULTS.md and its PNG are written (and the lead's RESULTS_interpretation.md is read)."""
    env: str = "alfworld"
    train_split: str = "gen_train"
    eval_splits: tuple[str, ...] = ("gen_test", "valid_seen")
    """Held-out splits, the first being the primary one; a split the server does not serve (valid_seen
    without ALFWORLD_DATA) is reported as not evaluated."""
    eval_episodes: dict[str, int] = field(default_factory=lambda: {"valid_seen": 40})
    """Tasks played per held-out split: a fixed random subset, the same for every run. A split not named
    here plays all its tasks; names of splits not in eval_splits are ignored."""
    server_args: tuple[str, ...] = ()
    """Flags for the one env server of the study, e.g. ["--env-option", "alfworld.size=small"]."""
    seeds: tuple[int, ...] = (0, 1, 2)
    extended: bool = False
    """Also run rloo, gigpo and empg."""
    arm_overrides: dict[str, list[str]] = field(default_factory=dict)
    """Extra key=value overrides of one arm's RL config, e.g. {ppo_critic_verl: [optim.critic_lr=1e-3]}."""
    model_size: str = "tiny"
    sft_episodes: int = 200
    sft_epochs: float = 1.0
    sft_lr: float = 2e-3
    sft_batch_turns: int = 32
    estimate_iterations: int = 2
    """RL iterations per algorithm that --estimate times."""
    rl: TrainConfig = field(default_factory=TrainConfig)
    """The RL run of every arm (model.path, env, seed and run_dir are filled in per run)."""

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        if not self.eval_splits:
            raise ValueError("give at least one held-out split in eval_splits")
        if not all(isinstance(n, int) and n >= 0 for n in self.eval_episodes.values()):
            raise ValueError(f"eval_episodes must map splits to task counts >= 0, got {self.eval_episodes}")
        unknown = sorted(set(self.arm_overrides) - set(self.arms))
        if unknown:
            raise ValueError(f"arm_overrides names unknown arms {unknown}; arms: {sorted(self.arms)}")
        if self.rl.save_every < 1:
            raise ValueError("rl.save_every must be >= 1: the evaluation reads the run's last checkpoint")
        for arm in self.arms:
            group_size_of(arm_config(self, arm))   # every arm plays the same episodes per iteration

    @property
    def arms(self) -> dict[str, tuple[str, ...]]:
        """Arm name -> its RL overrides, the lead's per-arm extras last."""
        chosen = CORE_ARMS | (EXTENDED_ARMS if self.extended else {})
        return {name: (*overrides, *self.arm_overrides.get(name, ())) for name, overrides in chosen.items()}


def arm_config(cfg: StudyConfig, arm: str, seed: int = 0, model_path: str = "", server: str = "",
               run_dir: str = "") -> TrainConfig:
    """The study's RL config with one arm's overrides, for one seed's run."""
    merged = configuration.merge(configuration.to_dict(cfg.rl), configuration.parse_overrides(list(cfg.arms[arm])))
    rl = configuration.from_dict(TrainConfig, merged, f"arm {arm}")
    return dataclasses.replace(
        rl, seed=seed, run_dir=run_dir or rl.run_dir,
        model=dataclasses.replace(rl.model, path=model_path or rl.model.path),
        env=dataclasses.replace(rl.env, name=cfg.env, train_split=cfg.train_split,
                                servers=(server,) if server else rl.env.servers))


# ---- running: SFT per seed, RL + evaluation per arm ----------------------------------------------------------


def seed_dir(cfg: StudyConfig, seed: int) -> Path:
    return Path(cfg.out_dir) / f"seed_{seed}"


def write_json(path: Path, data: Mapping) -> None:
    """Written whole, then renamed: a results file exists only once its step finished."""
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(json.dumps(data, indent=2))
    staged.replace(path)


@dataclass(frozen=True)
class HeldOut:
    task_ids: list[str]
    """The tasks every run plays."""
    split_tasks: int
    """Tasks in the whole split."""


async def held_out_tasks(pool: EnvPool, cfg: StudyConfig) -> dict[str, HeldOut]:
    """The eval splits the server serves, each with the subset of tasks every run plays."""
    served = (await pool.list_envs())[cfg.env].splits
    held_out = {}
    for split in (s for s in cfg.eval_splits if s in served):
        task_ids = await pool.list_tasks(cfg.env, split)
        held_out[split] = HeldOut(subset(task_ids, cfg.eval_episodes.get(split, 0)), len(task_ids))
    return held_out


async def evaluate_policy(pool: EnvPool, policy: Policy, cfg: StudyConfig, tasks: Mapping[str, HeldOut],
                          seed: int) -> dict[str, dict]:
    """Held-out success per split and category at the eval temperature, in lock-step batches so that a
    seed replays exactly."""
    rollout = dataclasses.replace(cfg.rl.rollout, temperature=EVAL_TEMPERATURE, batch_wait_s=0.0)
    backend = TransformersBackend.from_policy(policy)
    results = {}
    for split, held_out in tasks.items():
        torch.manual_seed(seed)
        result = await evaluate(pool, backend, policy.tokenizer, cfg.env, split, held_out.task_ids, rollout,
                                cfg.rl.prompt, seed=seed)
        results[split] = result.as_dict() | {"tasks_played": len(held_out.task_ids), "split_tasks": held_out.split_tasks}
    return results


async def with_missing_evaluations(pool: EnvPool, cfg: StudyConfig, tasks: Mapping[str, HeldOut], seed: int,
                                   result_file: Path, policy_dir: Path) -> dict:
    """A finished step's results, plus the held-out splits it was not evaluated on because the server did not
    serve them then (e.g. valid_seen before ALFWORLD_DATA was set): evaluated now and written back."""
    result = json.loads(result_file.read_text())
    missing = {split: held_out for split, held_out in tasks.items() if split not in result["evaluations"]}
    if missing:
        policy = Policy.load(policy_dir)
        result["evaluations"] |= await evaluate_policy(pool, policy, cfg, missing, seed)
        write_json(result_file, result)
    return result


async def warm_start(pool: EnvPool, cfg: StudyConfig, seed: int, tasks: Mapping[str, HeldOut],
                     console: Console) -> dict:
    """The seed's tokenizer, tiny model and SFT checkpoint (`seed_S/sft`), and its held-out success: the
    level RL starts from. Every arm of the seed starts from this one checkpoint."""
    out = seed_dir(cfg, seed)
    done = out / "sft.json"
    if done.is_file():
        return await with_missing_evaluations(pool, cfg, tasks, seed, done, out / "sft")
    out.mkdir(parents=True, exist_ok=True)
    trained = out / "sft_train.json"   # the SFT itself, kept so that an interrupted evaluation does not redo it
    if trained.is_file() and (out / "sft").is_dir():
        result = json.loads(trained.read_text())
        policy = Policy.load(out / "sft")
    else:
        started = time.perf_counter()
        train_ids = sorted(await pool.list_tasks(cfg.env, cfg.train_split))
        sft_ids = random.Random(seed).sample(train_ids, min(cfg.sft_episodes, len(train_ids)))
        experts = await expert_episodes(pool, cfg.env, cfg.train_split, sft_ids, seed)
        texts = [text for pair in expert_texts(experts, cfg.rl.prompt) for text in pair]
        policy = Policy.load(build_tiny_checkpoint(texts, out / "base", size=cfg.model_size, seed=seed))
        samples = expert_samples(policy.tokenizer, experts, cfg.rl.prompt)
        expert_s = time.perf_counter() - started
        losses = sft(policy, samples, epochs=cfg.sft_epochs, lr=cfg.sft_lr, batch_turns=cfg.sft_batch_turns,
                     seed=seed, console=console)
        policy.save(out / "sft")
        result = {
            "seed": seed, "expert_episodes": len(experts), "expert_won": sum(e.won for e in experts),
            "turn_samples": len(samples), "loss_first": losses[0], "loss_last": losses[-1],
            "parameters": sum(p.numel() for p in policy.model.parameters()), "vocabulary": len(policy.tokenizer),
            "seconds": {"expert_and_model": expert_s, "sft": time.perf_counter() - started - expert_s},
        }
        write_json(trained, result)
    started = time.perf_counter()
    result = result | {"evaluations": await evaluate_policy(pool, policy, cfg, tasks, seed)}
    result["seconds"] = result["seconds"] | {"eval": time.perf_counter() - started}
    write_json(done, result)
    return result


async def run_arm(pool: EnvPool, server: str, cfg: StudyConfig, seed: int, arm: str,
                  tasks: Mapping[str, HeldOut], console: Console, iterations: int = 0,
                  run_dir: Path | None = None) -> dict:
    """RL of one arm from the seed's SFT checkpoint, then held-out evaluation of its last checkpoint."""
    run_dir = run_dir or seed_dir(cfg, seed) / arm
    done = run_dir / "results.json"
    if done.is_file():
        return await with_missing_evaluations(pool, cfg, tasks, seed, done, latest_checkpoint(run_dir) / "policy")
    rl = arm_config(cfg, arm, seed, str(seed_dir(cfg, seed) / "sft"), server, str(run_dir))
    rl = dataclasses.replace(rl, iterations=iterations or rl.iterations)
    started = time.perf_counter()
    await train(rl, resume=True, console=console)   # resume: a no-op for a new run dir
    train_s = time.perf_counter() - started
    policy = Policy.load(latest_checkpoint(run_dir) / "policy")
    evaluations = await evaluate_policy(pool, policy, cfg, tasks, seed)
    _, rows = read_run(str(run_dir))
    timed = [row for row in rows if "time/iteration" in row]
    result = {
        "arm": arm, "seed": seed, "algo": rl.algo, "overrides": list(cfg.arms[arm]),
        "iterations": rl.iterations, "episodes_per_iteration": rl.episodes_per_iteration,
        "group_size": group_size_of(rl), "evaluations": evaluations,
        "time_per_iteration": mean_stage_seconds(timed) if timed else None,
        "last_rollout_success": rows[-1].get("rollout/success") if rows else None,
        "seconds": {"train": train_s, "eval": time.perf_counter() - started - train_s},
    }
    write_json(done, result)
    return result


def changed_settings(old: Mapping, new: Mapping, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config trees."""
    changed = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changed += changed_settings(a, b, f"{prefix}{key}.")
        elif a != b:
            changed.append(prefix + key)
    return changed


def prepare_out_dir(cfg: StudyConfig) -> Path:
    """out_dir with this config in study.yaml; refused when it holds runs made with other settings, which a
    resumed study would otherwise mix in (more seeds, the extended arms or another report_dir are fine)."""
    out = Path(cfg.out_dir)
    saved, current = out / "study.yaml", configuration.to_dict(cfg)
    if saved.is_file():
        changed = [key for key in changed_settings(yaml.safe_load(saved.read_text()), current)
                   if key.split(".")[0] not in RESUMABLE_CHANGES]
        if changed:
            raise ValueError(f"{out} holds runs made with other settings ({', '.join(changed)}): use another out_dir, "
                             f"or remove it to start over")
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(yaml.safe_dump(current, sort_keys=False))
    return out


async def run_study(cfg: StudyConfig, console: Console) -> None:
    out = Path(cfg.out_dir)
    async with local_env_server([cfg.env], cfg.server_args, log_file=out / "env_server.log") as address, \
            EnvPool([address]) as pool:
        tasks = await held_out_tasks(pool, cfg)
        for seed in cfg.seeds:
            await warm_start(pool, cfg, seed, tasks, console)
            for arm in cfg.arms:
                console.rule(f"seed {seed}: {arm}")
                await run_arm(pool, address, cfg, seed, arm, tasks, console)


# ---- the dry estimate ------------------------------------------------------------------------------------


def projected_seconds(cfg: StudyConfig, sft: Mapping, probes: Mapping[str, Mapping], probe_iterations: int) -> dict[str, float]:
    """The whole study's time from one seed's SFT and a short probe run per arm: the probe's fixed cost
    (model loads, checkpoints: its train time beyond its timed iterations), its mean iteration times the
    study's iterations, and its evaluation."""
    per_seed_sft = sum(sft["seconds"].values())
    per_arm = {}
    for arm, probe in probes.items():
        iteration_s = probe["time_per_iteration"]["iteration"]
        fixed_s = max(0.0, probe["seconds"]["train"] - probe_iterations * iteration_s)
        per_arm[arm] = fixed_s + cfg.rl.iterations * iteration_s + probe["seconds"]["eval"]
    return {"sft_per_seed": per_seed_sft, **{f"arm/{arm}": s for arm, s in per_arm.items()},
            "total": len(cfg.seeds) * (per_seed_sft + sum(per_arm.values()))}


async def estimate(cfg: StudyConfig, console: Console) -> dict:
    """Time the first seed's SFT (kept: the study reuses it) and `estimate_iterations` of every arm (in
    out_dir/_estimate, removed after), then project the study's total."""
    out = Path(cfg.out_dir)
    scratch = out / "_estimate"
    async with local_env_server([cfg.env], cfg.server_args, log_file=out / "env_server.log") as address, \
            EnvPool([address]) as pool:
        tasks = await held_out_tasks(pool, cfg)
        seed = cfg.seeds[0]
        sft_result = await warm_start(pool, cfg, seed, tasks, console)
        probes = {}
        for arm in cfg.arms:
            shutil.rmtree(scratch / arm, ignore_errors=True)
            probes[arm] = await run_arm(pool, address, cfg, seed, arm, tasks, console,
                                        iterations=cfg.estimate_iterations, run_dir=scratch / arm)
    shutil.rmtree(scratch, ignore_errors=True)
    projection = projected_seconds(cfg, sft_result, probes, cfg.estimate_iterations)
    report = {"seeds": len(cfg.seeds), "iterations": cfg.rl.iterations, "arms": list(cfg.arms),
              "probe_iterations": cfg.estimate_iterations,
              "measured_seconds_per_iteration": {arm: p["time_per_iteration"]["iteration"] for arm, p in probes.items()},
              "projected_seconds": projection}
    write_json(out / "estimate.json", report)
    return report


# ---- the report (pure, from results files) --------------------------------------------------------------------


@dataclass(frozen=True)
class StudyResults:
    """Everything RESULTS.md says, as read from the results files."""

    cfg: StudyConfig
    sft: dict[int, dict]                     # seed -> sft.json
    runs: dict[str, dict[int, dict]]         # arm -> seed -> results.json
    curves: dict[str, list[list[dict]]]      # arm -> one metrics.jsonl per seed


def read_results(cfg: StudyConfig) -> StudyResults:
    sft, runs, curves = {}, {}, {}
    for seed in cfg.seeds:
        path = seed_dir(cfg, seed) / "sft.json"
        if path.is_file():
            sft[seed] = json.loads(path.read_text())
        for arm in cfg.arms:
            run_dir = seed_dir(cfg, seed) / arm
            if (run_dir / "results.json").is_file():
                runs.setdefault(arm, {})[seed] = json.loads((run_dir / "results.json").read_text())
                curves.setdefault(arm, []).append(read_run(str(run_dir))[1])
    return StudyResults(cfg, sft, runs, curves)


def success_points(evaluation: Mapping) -> float:
    return 100.0 * evaluation["success"]


def success_by_label(results: StudyResults, split: str) -> dict[str, list[float]]:
    """{row label: held-out success in % per seed} on one split, the SFT start first."""
    rows = {SFT_LABEL: [success_points(s["evaluations"][split]) for s in results.sft.values() if split in s["evaluations"]]}
    for arm, by_seed in results.runs.items():
        rows[arm] = [success_points(r["evaluations"][split]) for r in by_seed.values() if split in r["evaluations"]]
    return {label: values for label, values in rows.items() if values}


def table_files(results: StudyResults, split: str) -> list[dict]:
    """The held-out results in the shape `evaluate.results_table` pools (one file per label)."""
    def file(label: str, evaluations: list[dict]) -> dict:
        first = evaluations[0]
        return {"label": label, "env": first["env"], "split": split, "runs": evaluations,
                "temperature": EVAL_TEMPERATURE, "tasks_played": first["tasks_played"],
                "split_tasks": first["split_tasks"]}

    files = [file(SFT_LABEL, [s["evaluations"][split] for s in results.sft.values() if split in s["evaluations"]])]
    files += [file(arm, [r["evaluations"][split] for r in by_seed.values()]) for arm, by_seed in results.runs.items()]
    return [f for f in files if f["runs"]]


def mean_std_text(values: Sequence[float], digits: int = 1) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def compare(a: Sequence[float], b: Sequence[float]) -> tuple[float, bool]:
    """(mean(a) - mean(b), whether that gap exceeds the seed-to-seed std of both; never with one seed)."""
    (mean_a, std_a), (mean_b, std_b) = mean_std(a), mean_std(b)
    gap = mean_a - mean_b
    return gap, std_a is not None and std_b is not None and abs(gap) > max(std_a, std_b)


def gap_sentence(name_a: str, a: Sequence[float], name_b: str, b: Sequence[float]) -> str:
    gap, clear = compare(a, b)
    if len(a) < 2 or len(b) < 2:
        verdict = "one seed only: no std to judge it by"
    else:
        verdict = "larger than the seed-to-seed std of both" if clear else "within the seed-to-seed std"
    return f"{name_a} {mean_std_text(a)} vs {name_b} {mean_std_text(b)}: {gap:+.1f} points ({verdict})"


def what_happened(results: StudyResults, split: str) -> list[str]:
    """Bullet sentences computed from the numbers: the ranking, the gain over SFT, the claim, the ablation."""
    by_label = success_by_label(results, split)
    arms = {label: values for label, values in by_label.items() if label != SFT_LABEL}
    if not arms:
        return ["No RL run has finished yet."]
    ranked = sorted(arms, key=lambda label: mean_std(arms[label])[0], reverse=True)
    lines = [f"Mean held-out success on {split}, best first (%): "
             + ", ".join(f"{label} {mean_std(arms[label])[0]:.1f}" for label in ranked) + "."]
    if len(ranked) > 1:
        lines.append("Best against runner-up: " + gap_sentence(ranked[0], arms[ranked[0]], ranked[1], arms[ranked[1]]) + ".")
    if SFT_LABEL in by_label:
        start = mean_std(by_label[SFT_LABEL])[0]
        gains = ", ".join(f"{label} {mean_std(arms[label])[0] - start:+.1f}" for label in ranked)
        lines.append(f"Change from the SFT start ({start:.1f}), in points: {gains}.")
    if "boundary" in arms:
        rivals = [label for label in ("ppo_critic_verl", "ppo_critic_turn", "grpo") if label in arms]
        beaten = [label for label in rivals if compare(arms["boundary"], arms[label])[1] and
                  compare(arms["boundary"], arms[label])[0] > 0]
        lines.append("The claim (boundary beats PPO with a separate critic and GRPO): "
                     + (f"boundary is clearly ahead of {', '.join(beaten)}" if beaten else "boundary is clearly ahead of none")
                     + (f"; not clearly ahead of {', '.join(r for r in rivals if r not in beaten)}" if len(beaten) < len(rivals) else "")
                     + ".")
    if {"boundary", "ppo_critic_turn"} <= arms.keys():
        lines.append("Shared readout (boundary vs ppo_critic_turn: the same turn-level GAE and batch normalization; "
                     "V from the policy's own two rows vs from a separate critic): "
                     + gap_sentence("boundary", arms["boundary"], "ppo_critic_turn", arms["ppo_critic_turn"]) + ".")
    if {"ppo_critic_turn", "ppo_critic_verl"} <= arms.keys():
        lines.append("Turn-level credit (ppo_critic_turn vs ppo_critic_verl: the same separate critic; turn-level "
                     "GAE vs verl's token-level GAE with gamma = lambda = 1 inside each turn): "
                     + gap_sentence("ppo_critic_turn", arms["ppo_critic_turn"], "ppo_critic_verl",
                                    arms["ppo_critic_verl"]) + ".")
    times = iteration_seconds(results)
    if {"boundary", "ppo_critic_turn"} <= times.keys():
        ratio = mean_std(times["boundary"])[0] / mean_std(times["ppo_critic_turn"])[0]
        lines.append(f"Time per iteration, boundary / ppo_critic_turn: {ratio:.3f}.")
    return lines


def iteration_seconds(results: StudyResults, stage: str = "iteration") -> dict[str, list[float]]:
    return {arm: [r["time_per_iteration"][stage] for r in by_seed.values() if r["time_per_iteration"]]
            for arm, by_seed in results.runs.items()}


def time_table(results: StudyResults) -> str:
    stages = (*ITERATION_STAGES, "iteration")
    lines = ["| Method | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for arm in results.runs:
        cells = [mean_std_text(iteration_seconds(results, stage)[arm], 3) for stage in stages]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def runs_table(results: StudyResults, splits: Sequence[str]) -> str:
    """Every run's own numbers, one row per (label, seed): what the tables above are computed from."""
    lines = ["| Method | seed | " + " | ".join(f"{s} success %" for s in splits) + " | s / iteration | results file |",
             "|---|---|" + "---|" * (len(splits) + 2)]

    def cells(evaluations: Mapping) -> str:
        return " | ".join(f"{success_points(evaluations[s]):.1f}" if s in evaluations else "–" for s in splits)

    for seed, s in sorted(results.sft.items()):
        lines.append(f"| {SFT_LABEL} | {seed} | {cells(s['evaluations'])} | – | seed_{seed}/sft.json |")
    for arm, by_seed in results.runs.items():
        for seed, r in sorted(by_seed.items()):
            per_iteration = f"{r['time_per_iteration']['iteration']:.3f}" if r["time_per_iteration"] else "–"
            lines.append(f"| {arm} | {seed} | {cells(r['evaluations'])} | {per_iteration} | seed_{seed}/{arm}/results.json |")
    return "\n".join(lines)


def setting_lines(results: StudyResults) -> list[str]:
    cfg, rl = results.cfg, results.cfg.rl
    lines = [f"- Env: **{cfg.env}**, server flags `{shlex.join(cfg.server_args) or '(none)'}`; training split "
             f"`{cfg.train_split}`; held-out: "
             + ", ".join(f"`{split}` ({cfg.eval_episodes.get(split) or 'all'} tasks)" for split in cfg.eval_splits)
             + f", the same tasks for every run, T = {EVAL_TEMPERATURE}.",
             f"- Seeds: {', '.join(map(str, cfg.seeds))}. Each seed builds its own tokenizer and tiny model "
             f"(`{cfg.model_size}`) and one SFT checkpoint that every algorithm of the seed starts from."]
    if results.sft:
        first = next(iter(results.sft.values()))
        lines.append(f"- Model: {first['parameters'] / 1e6:.2f}M parameters, vocabulary {first['vocabulary']}. SFT: "
                     f"{cfg.sft_episodes} expert episodes, {cfg.sft_epochs:g} epoch(s) at lr {cfg.sft_lr:g} in batches of {cfg.sft_batch_turns} turns (final loss "
                     + ", ".join(f"{s['loss_last']:.3f}" for s in results.sft.values()) + " per seed).")
    lines.append(f"- RL, equal for every algorithm: {rl.iterations} iterations x {rl.episodes_per_iteration} episodes "
                 f"(boundary and PPO: N tasks x 1; group methods: N/8 tasks x 8), actor lr {rl.optim.lr:g}, value-row "
                 f"lr {rl.optim.value_lr:g}, critic lr {rl.optim.critic_lr:g}, KL coef {rl.loss.kl_coef:g}, at most "
                 f"{rl.rollout.max_turns or 'the env default'} turns and {rl.rollout.max_new_tokens} new tokens per turn, "
                 f"T = {rl.rollout.temperature:g}.")
    lines.append("- Arms: " + "; ".join(f"**{arm}** `{' '.join(overrides)}`" for arm, overrides in cfg.arms.items()) + ".")
    return lines


def render_results(results: StudyResults, command: str, interpretation: str | None) -> str:
    cfg = results.cfg
    primary = cfg.eval_splits[0]
    expected = {(arm, seed) for arm in cfg.arms for seed in cfg.seeds}
    missing = sorted(expected - {(arm, seed) for arm, by_seed in results.runs.items() for seed in by_seed})
    seconds = sum(sum(s["seconds"].values()) for s in results.sft.values()) + \
        sum(sum(r["seconds"].values()) for by_seed in results.runs.values() for r in by_seed.values())
    out = ["# Learning study: results", "",
           f"Generated by `{command}` from the results files under `{cfg.out_dir}`; do not edit by hand. "
           f"Measured on this CPU (see BENCHMARKS.md for the machine). Wall time of the runs reported here: "
           f"{seconds / 60:.1f} min.", ""]
    if len(cfg.seeds) < 3:
        out += [f"> **Preliminary**: {len(cfg.seeds)} seed(s); the study calls for at least 3.", ""]
    if missing:
        out += ["> **Incomplete**: not finished yet: " + ", ".join(f"{arm} seed {seed}" for arm, seed in missing), ""]
    out += ["## Setting", "", *setting_lines(results), ""]
    for split in cfg.eval_splits:
        files = table_files(results, split)
        out += [f"## Held-out success on `{split}`", ""]
        out += [results_table(files), ""] if files else ["Not evaluated: the env server does not serve this split.", ""]
    out += ["## Learning curves", "", f"![learning curves]({CURVES_PNG})", "",
            "Training-rollout success per iteration (T = 1.0), mean ± std over seeds; held-out success where the "
            "runs evaluated during training.", "",
            "## Time per iteration and its parts", "",
            "Seconds, mean ± std over seeds of each run's mean iteration (stage names as in verl's timing_raw).", "",
            time_table(results), "",
            "## What happened", "",
            "Computed from the numbers above (a gap counts as clear when it is larger than the seed-to-seed std "
            "of both sides).", ""]
    out += [f"- {line}" for line in what_happened(results, primary)]
    out += ["", "## Interpretation (the lead's)", ""]
    out += [interpretation.strip()] if interpretation else [
        f"> _Not written yet: put it in `{cfg.report_dir}/{INTERPRETATION_MD}`; the next report includes it here._"]
    out += ["", "## Every run", "", runs_table(results, cfg.eval_splits), ""]
    return "\n".join(out)


def write_report(cfg: StudyConfig, command: str) -> Path:
    results = read_results(cfg)
    report_dir = Path(cfg.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    if results.curves:
        plot_curves(results.curves, report_dir / CURVES_PNG)
    notes = report_dir / INTERPRETATION_MD
    path = report_dir / "RESULTS.md"
    path.write_text(render_results(results, command, notes.read_text() if notes.is_file() else None))
    return path


# ---- CLI ------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="learning_study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="YAML (configs/study.yaml, configs/study_smoke.yaml)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--estimate", action="store_true", help="time SFT and a few iterations per arm, project the total")
    mode.add_argument("--report-only", action="store_true", help="rewrite RESULTS.md from the results files")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. seeds=[0] rl.iterations=4")
    args = parser.parse_args(argv)
    try:
        cfg = configuration.load(StudyConfig, args.config, args.overrides)
    except (configuration.ConfigError, ValueError) as error:
        parser.error(str(error))
    if not args.report_only:
        try:
            prepare_out_dir(cfg)
        except ValueError as error:
            parser.error(str(error))
    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    command = shlex.join(["python", "benchmarks/learning_study.py", *(["--config", args.config] if args.config else []),
                          *args.overrides])
    if args.estimate:
        report = asyncio.run(estimate(cfg, console))
        projected = report["projected_seconds"]
        for key, seconds in projected.items():
            print(f"{key:28s} {seconds / 60:8.1f} min")
        print(f"estimated study time: {projected['total'] / 3600:.2f} h ({len(cfg.seeds)} seeds x {len(cfg.arms)} arms)")
        return 0
    if not args.report_only:
        asyncio.run(run_study(cfg, console))
    print(f"report: {write_report(cfg, command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
