"""The CPU-scale learning study: per seed, one SFT warm start shared by every algorithm, then RL with each
algorithm at equal episodes per iteration and equal iterations, then held-out evaluation of every checkpoint
on the same games with the same eval seeds, so that every comparison is paired game by game. RESULTS.md,
summary.json and the learning curves are generated from the runs' results files, never typed in.

    python benchmarks/learning_study.py --config configs/study.yaml [key=value ...] [--estimate | --report-only]
                                        [--commit]

Resumable: a seed's SFT (`seed_S/sft.json`) and an algorithm's RL + evaluation (`seed_S/ARM/results.json`)
are skipped when their results file exists; an interrupted RL run resumes from its last checkpoint; an
out_dir that holds runs made with other settings is refused. After each part (a seed's SFT, an arm) the
results files and the seed's SFT checkpoint are copied to `measurements_dir` beside summary.json, and
RESULTS.md is rewritten; with `--commit` those paths are then committed to git, one commit per part. A fresh
checkout resumes from what was committed: the finished parts are copied back into out_dir and skipped, so a
study of several days spans sessions. `--estimate` times the first seed's SFT (kept for the study) and a few RL
iterations of every algorithm, and prints the projected time.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterable, Mapping, Sequence  # noqa: E402
from contextlib import AbstractAsyncContextManager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402

from benchlib import commit, cpu_model, reference_step_seconds  # noqa: E402
from trainer_client import config  # noqa: E402
from trainer_client.checkpoints import latest_checkpoint  # noqa: E402
from trainer_client.env_pool import EnvPool  # noqa: E402
from trainer_client.evaluate import (  # noqa: E402
    evaluate, mean_std, plot_curves, read_run, results_table, subset,
)
from trainer_client.experts import expert_episodes, expert_samples, expert_texts  # noqa: E402
from trainer_client.local_server import local_env_server  # noqa: E402
from trainer_client.paired import compare as paired_compare  # noqa: E402
from trainer_client.paired import outcome_values  # noqa: E402
from trainer_client.policy import Policy, TransformersBackend, build_tiny_checkpoint  # noqa: E402
from trainer_client.sft import sft  # noqa: E402
from trainer_client.timing import ITERATION_STAGES, mean_stage_seconds  # noqa: E402
from trainer_client.train import train  # noqa: E402
from trainer_client.train_config import TrainConfig, group_size_of  # noqa: E402

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
# The two ablations the arms were chosen for: what the first minus the second measures.
ABLATIONS = {
    ("boundary", "ppo_critic_turn"): "the shared readout: the same turn-level GAE and batch normalization, V read "
                                     "from the policy's own two rows vs from a separate critic",
    ("ppo_critic_turn", "ppo_critic_verl"): "turn-level credit: the same separate critic, turn-level GAE vs "
                                            "verl's token-level GAE with gamma = lambda = 1 inside each turn",
}
# Settings that may change between invocations on one out_dir without making its finished runs stale.
RESUMABLE_CHANGES = ("out_dir", "report_dir", "measurements_dir", "seeds", "extended", "estimate_iterations")
# Dotted settings that change how runs execute, not what they learn from: lock-step rollout batches (batch_wait_s 0)
# repeat a run exactly; the 0.02 s the finished arms ran with formed batches by timing, the same episodes otherwise.
EXECUTION_ONLY = ("rl.rollout.batch_wait_s",)
SFT_LABEL = "SFT (start)"
CURVES_PNG = "results_learning_curves.png"
INTERPRETATION_MD = "RESULTS_interpretation.md"


@dataclass(frozen=True)
class StudyConfig:
    out_dir: str = "runs/study"
    """Every run's checkpoints, metrics and results files."""
    report_dir: str = "docs"
    """Where RESULTS.md and its PNG are written (and the lead's RESULTS_interpretation.md is read)."""
    measurements_dir: str = "docs/measurements/study"
    """Where summary.json, copies of the runs' results files and each seed's SFT checkpoint are kept, to commit."""
    env: str = "alfworld"
    train_split: str = "gen_train"
    eval_splits: tuple[str, ...] = ("gen_test", "valid_seen")
    """Held-out splits, the first being the primary one; a split the server does not serve (valid_seen
    without ALFWORLD_DATA) is reported as not evaluated."""
    eval_episodes: dict[str, int] = field(default_factory=lambda: {"valid_seen": 40})
    """Tasks played per held-out split: a fixed random subset, the same for every run. A split not named
    here plays all its tasks; names of splits not in eval_splits are ignored."""
    eval_seeds: tuple[int, ...] = (0, 1)
    """Every checkpoint plays every held-out game once per eval seed (env seed and sampling seeds)."""
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
    sft_lr_decay: bool = False
    """Decay the SFT learning rate linearly towards 0 (as DemoConfig)."""
    sft_prompt_loss_weight: float = 0.0
    """Also fit the prompt tokens at this weight (as DemoConfig; trainer_client.sft.sft)."""
    sft_mistake_rate: float = 0.0
    """Expert steps replaced by a recovered-from mistake (as DemoConfig; trainer_client.experts)."""
    estimate_iterations: int = 2
    """RL iterations per algorithm that --estimate times."""
    rl: TrainConfig = field(default_factory=TrainConfig)
    """The RL run of every arm (model.path, env, seed and run_dir are filled in per run)."""

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        if not self.eval_splits:
            raise ValueError("give at least one held-out split in eval_splits")
        if not self.eval_seeds or len(set(self.eval_seeds)) != len(self.eval_seeds):
            raise ValueError(f"eval_seeds must be distinct and at least one, got {self.eval_seeds}")
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
    merged = config.merge(config.to_dict(cfg.rl), config.parse_overrides(list(cfg.arms[arm])))
    rl = config.from_dict(TrainConfig, merged, f"arm {arm}")
    return dataclasses.replace(
        rl, seed=seed, run_dir=run_dir or rl.run_dir,
        model=dataclasses.replace(rl.model, path=model_path or rl.model.path),
        env=dataclasses.replace(rl.env, name=cfg.env, train_split=cfg.train_split,
                                servers=(server,) if server else rl.env.servers))


# ---- running: SFT per seed, RL + evaluation per arm ----------------------------------------------------------


def seed_dir(cfg: StudyConfig, seed: int) -> Path:
    return Path(cfg.out_dir) / f"seed_{seed}"


def this_machine() -> dict:
    """Where an arm ran: its times compare across machines once divided by reference_step_s."""
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "reference_step_s": reference_step_seconds(repeats=5)}


def reference_step(run: Mapping) -> float | None:
    """The machine's reference step an arm recorded (None for arms run before it was recorded)."""
    return (run.get("machine") or {}).get("reference_step_s")


def time_ratio(run: Mapping, base: Mapping) -> float | None:
    """Seconds per iteration of `run` over those of `base` (one seed), each divided by its machine's reference
    step where both recorded one; None where either has no timing."""
    times = [r.get("time_per_iteration", {}) or {} for r in (run, base)]
    if not all(t.get("iteration") for t in times):
        return None
    refs = [reference_step(r) for r in (run, base)]
    scale = refs[1] / refs[0] if all(refs) else 1.0
    return times[0]["iteration"] / times[1]["iteration"] * scale


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


async def evaluate_policy(pool: EnvPool, policy: Policy, cfg: StudyConfig,
                          tasks: Mapping[str, HeldOut]) -> dict[str, dict]:
    """Held-out success per split at the eval temperature, once per eval seed, with every episode's outcome.
    The eval seeds are the study's, not the training seed's: every checkpoint of every seed plays the same
    (game, eval seed) episodes, which is what makes the comparisons paired. Each episode samples from its own
    seeded generator (trainer_client.evaluate), so a result does not depend on batching."""
    rollout = dataclasses.replace(cfg.rl.rollout, temperature=cfg.rl.eval_temperature, batch_wait_s=0.0)
    backend = TransformersBackend.from_policy(policy)
    results = {}
    for split, held_out in tasks.items():
        started, runs = time.perf_counter(), []
        for eval_seed in cfg.eval_seeds:
            result = await evaluate(pool, backend, policy.tokenizer, cfg.env, split, held_out.task_ids, rollout,
                                    cfg.rl.prompt, seed=eval_seed)
            runs.append({"seed": eval_seed, **result.as_dict()})
        # The shape of a `limen-eval` results file: `runs` pools in evaluate.results_table as they are.
        results[split] = {"env": cfg.env, "split": split, "tasks_played": len(held_out.task_ids),
                          "split_tasks": held_out.split_tasks, "temperature": cfg.rl.eval_temperature,
                          "seeds": list(cfg.eval_seeds), "seconds": time.perf_counter() - started, "runs": runs}
    return results


async def with_missing_evaluations(pool: EnvPool, cfg: StudyConfig, tasks: Mapping[str, HeldOut],
                                   result_file: Path, policy_dir: Callable[[], Path]) -> dict:
    """A finished step's results, plus the held-out splits it was not evaluated on because the server did not
    serve them then (e.g. valid_seen before ALFWORLD_DATA was set): evaluated now and written back. The
    checkpoint is looked up only then: a step restored from measurements_dir has its results, not its weights."""
    result = json.loads(result_file.read_text())
    missing = {split: held_out for split, held_out in tasks.items() if split not in result["evaluations"]}
    if missing:
        policy = Policy.load(policy_dir())
        result["evaluations"] |= await evaluate_policy(pool, policy, cfg, missing)
        write_json(result_file, result)
    return result


async def warm_start(pool: EnvPool, cfg: StudyConfig, seed: int, tasks: Mapping[str, HeldOut],
                     console: Console) -> dict:
    """The seed's tokenizer, tiny model and SFT checkpoint (`seed_S/sft`), and its held-out success: the
    level RL starts from. Every arm of the seed starts from this one checkpoint."""
    out = seed_dir(cfg, seed)
    done = out / "sft.json"
    if done.is_file():
        return await with_missing_evaluations(pool, cfg, tasks, done, lambda: out / "sft")
    out.mkdir(parents=True, exist_ok=True)
    trained = out / "sft_train.json"   # the SFT itself, kept so that an interrupted evaluation does not redo it
    if trained.is_file() and (out / "sft").is_dir():
        result = json.loads(trained.read_text())
        policy = Policy.load(out / "sft")
    else:
        started = time.perf_counter()
        train_ids = sorted(await pool.list_tasks(cfg.env, cfg.train_split))
        sft_ids = random.Random(seed).sample(train_ids, min(cfg.sft_episodes, len(train_ids)))
        experts = await expert_episodes(pool, cfg.env, cfg.train_split, sft_ids, seed,
                                        mistake_rate=cfg.sft_mistake_rate)
        expert_s = time.perf_counter() - started
        texts = [text for pair in expert_texts(experts, cfg.rl.prompt) for text in pair]
        policy = Policy.load(build_tiny_checkpoint(texts, out / "base", size=cfg.model_size, seed=seed))
        samples = expert_samples(policy.tokenizer, experts, cfg.rl.prompt)
        model_s = time.perf_counter() - started - expert_s
        losses = sft(policy, samples, epochs=cfg.sft_epochs, lr=cfg.sft_lr, batch_turns=cfg.sft_batch_turns,
                     lr_decay=cfg.sft_lr_decay, prompt_loss_weight=cfg.sft_prompt_loss_weight, seed=seed,
                     console=console)
        policy.save(out / "sft")
        result = {
            "seed": seed, "expert_episodes": len(experts), "expert_won": sum(e.won for e in experts),
            "turn_samples": len(samples), "loss_first": losses[0], "loss_last": losses[-1],
            "parameters": sum(p.numel() for p in policy.model.parameters()), "vocabulary": len(policy.tokenizer),
            "seconds": {"expert_play": expert_s, "tokenizer_and_model": model_s,
                        "sft": time.perf_counter() - started - expert_s - model_s},
        }
        write_json(trained, result)
    started = time.perf_counter()
    result = result | {"evaluations": await evaluate_policy(pool, policy, cfg, tasks)}
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
        return await with_missing_evaluations(pool, cfg, tasks, done, lambda: latest_checkpoint(run_dir) / "policy")
    rl = arm_config(cfg, arm, seed, str(seed_dir(cfg, seed) / "sft"), server, str(run_dir))
    rl = dataclasses.replace(rl, iterations=iterations or rl.iterations)
    machine = this_machine()
    started = time.perf_counter()
    await train(rl, resume=True, console=console)   # resume: a no-op for a new run dir
    train_s = time.perf_counter() - started
    policy = Policy.load(latest_checkpoint(run_dir) / "policy")
    evaluations = await evaluate_policy(pool, policy, cfg, tasks)
    _, rows = read_run(str(run_dir))
    timed = [row for row in rows if "time/iteration" in row]
    result = {
        "arm": arm, "seed": seed, "algo": rl.algo, "overrides": list(cfg.arms[arm]),
        "iterations": rl.iterations, "episodes_per_iteration": rl.episodes_per_iteration,
        "group_size": group_size_of(rl), "evaluations": evaluations,
        "time_per_iteration": mean_stage_seconds(timed) if timed else None,
        "last_rollout_success": rows[-1].get("rollout/success") if rows else None,
        "seconds": {"train": train_s, "eval": time.perf_counter() - started - train_s},
        "machine": machine,
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


def stale_settings(saved: Path, cfg: StudyConfig) -> list[str]:
    """Settings of the study saved in `saved` (a study.yaml) that differ from `cfg` and make its runs stale.
    A setting added to StudyConfig after the save reads as its default there: the default is what those runs did."""
    old = config.to_dict(config.from_dict(StudyConfig, yaml.safe_load(saved.read_text())))
    return [key for key in changed_settings(old, config.to_dict(cfg))
            if key.split(".")[0] not in RESUMABLE_CHANGES and key not in EXECUTION_ONLY]


def prepare_out_dir(cfg: StudyConfig) -> Path:
    """out_dir with this config in study.yaml; refused when it holds runs made with other settings, which a
    resumed study would otherwise mix in (more seeds, the extended arms or another report_dir are fine)."""
    out = Path(cfg.out_dir)
    saved = out / "study.yaml"
    if saved.is_file():
        changed = stale_settings(saved, cfg)
        if changed:
            raise ValueError(f"{out} holds runs made with other settings ({', '.join(changed)}): use another out_dir, "
                             f"or remove it to start over")
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(yaml.safe_dump(config.to_dict(cfg), sort_keys=False))
    return out


def study_env_server(cfg: StudyConfig) -> AbstractAsyncContextManager[str]:
    """The study's one env server. ALFWorld's handcoded expert searches in set order, which follows the hash
    seed: fixed (as in the demo), so that the expert play behind each SFT start is the same on a rerun."""
    return local_env_server([cfg.env], cfg.server_args, log_file=Path(cfg.out_dir) / "env_server.log",
                            extra_env={"PYTHONHASHSEED": "0"})


async def run_study(cfg: StudyConfig, console: Console,
                    part_done: Callable[[int, str], None] | None = None) -> None:
    """Every seed in turn: its SFT start, then every arm; `part_done(seed, part)` after each ("sft" or the arm)."""
    async with study_env_server(cfg) as address, EnvPool([address]) as pool:
        tasks = await held_out_tasks(pool, cfg)
        for seed in cfg.seeds:
            await warm_start(pool, cfg, seed, tasks, console)
            if part_done:
                part_done(seed, "sft")
            for arm in cfg.arms:
                console.rule(f"seed {seed}: {arm}")
                await run_arm(pool, address, cfg, seed, arm, tasks, console)
                if part_done:
                    part_done(seed, arm)


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
    async with study_env_server(cfg) as address, EnvPool([address]) as pool:
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


# ---- the summary and the report (pure, from results files) ----------------------------------------------------


@dataclass(frozen=True)
class StudyResults:
    """Everything RESULTS.md and summary.json say, as read from the results files."""

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


def finished_seeds(results: StudyResults) -> list[int]:
    """Seeds whose SFT start and every core arm have finished. The extended arms, added to a finished study
    later, do not take a seed back out; each arm's summary lists the seeds it has."""
    return [seed for seed in results.cfg.seeds
            if seed in results.sft and all(seed in results.runs.get(arm, {}) for arm in CORE_ARMS)]


def seed_success(evaluation: Mapping) -> float:
    """One checkpoint's held-out success on a split: the mean over its eval seeds (each over the same games)."""
    return statistics.fmean(run["success"] for run in evaluation["runs"])


def game_outcomes(by_seed: Mapping[int, Mapping], split: str, category: str | None = None) -> dict[tuple, float]:
    """{(task id, (training seed, eval seed)): 1.0 won, 0.0 lost}: every episode one label played on `split`
    (of one task category, or all). Dropped episodes are absent, so a pairing leaves them out on both sides.
    The training seed joins the eval seed in the key's second place, so trainer_client.paired averages a
    game over both."""
    outcomes = {}
    for seed, result in by_seed.items():
        if split not in result["evaluations"]:
            continue
        runs = [{"outcomes": [o for o in run["outcomes"] if category is None or o["category"] == category]}
                for run in result["evaluations"][split]["runs"]]
        outcomes |= {(task_id, (seed, eval_seed)): won for (task_id, eval_seed), won in outcome_values(runs).items()}
    return outcomes


def paired(a: Mapping[int, Mapping], b: Mapping[int, Mapping], split: str, category: str | None = None) -> dict | None:
    """Success of `a` minus `b` on the episodes both played (same training seed, eval seed and game), with a
    95 % interval; None when they share no episode.

    Pooling: a game's gain is its mean over every (training seed, eval seed) pair both played; the interval
    is a bootstrap over games (trainer_client.paired.paired_gain), the unit that was sampled. The training
    seeds are held fixed, so the interval covers game and sampling noise given these seeds' SFT starts; the
    seed-to-seed spread is reported beside it (held_out_std)."""
    seeds = a.keys() & b.keys()
    a_games = game_outcomes({s: a[s] for s in seeds}, split, category)
    b_games = game_outcomes({s: b[s] for s in seeds}, split, category)
    if not a_games.keys() & b_games.keys():
        return None
    gain = paired_compare(before=b_games, after=a_games)
    return {"gain": gain.gain, "ci95": [gain.lo, gain.hi], "games": gain.games, "episodes": gain.episodes,
            "seeds": sorted(seeds)}


def mean_or_none(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def arm_summary(runs: Mapping[int, Mapping], sft: Mapping[int, Mapping], split: str) -> dict | None:
    """One arm on one split, over the training seeds where both it and its SFT start were evaluated there."""
    seeds = sorted(s for s in runs.keys() & sft.keys()
                   if split in runs[s]["evaluations"] and split in sft[s]["evaluations"])
    if not seeds:
        return None
    held_out = [seed_success(runs[s]["evaluations"][split]) for s in seeds]
    mean, std = mean_std(held_out)
    timed = [runs[s]["time_per_iteration"] for s in seeds if runs[s].get("time_per_iteration")]
    gain = paired({s: runs[s] for s in seeds}, {s: sft[s] for s in seeds}, split)
    return {"seeds": seeds, "held_out_mean": mean, "held_out_std": std, "held_out_by_seed": held_out,
            "sft_mean": statistics.fmean(seed_success(sft[s]["evaluations"][split]) for s in seeds),
            "gain": gain["gain"] if gain else None, "gain_ci95": gain["ci95"] if gain else None,
            "episode_pairs": gain["episodes"] if gain else 0,
            "seconds_per_iteration": mean_or_none([t["iteration"] for t in timed]),
            "seconds_per_stage": {stage: statistics.fmean(t[stage] for t in timed) for stage in timed[0]} if timed else {},
            "wall_seconds": {part: statistics.fmean(runs[s]["seconds"][part] for s in seeds) for part in runs[seeds[0]]["seconds"]}}


def comparisons_of(arms: Iterable[str]) -> list[tuple[str, str, str]]:
    """(a, b, what a - b measures): boundary against each baseline, then the ablations not among those."""
    arms = list(arms)
    pairs = [("boundary", rival) for rival in arms if rival != "boundary"]
    pairs += [pair for pair in ABLATIONS if pair not in pairs]
    return [(a, b, ABLATIONS.get((a, b), "the method against a baseline")) for a, b in pairs if a in arms and b in arms]


def split_summary(results: StudyResults, split: str) -> dict:
    """summary.json's numbers for one held-out split."""
    sft = {s: r for s, r in results.sft.items() if split in r["evaluations"]}
    arms = {arm: summary for arm, by_seed in results.runs.items()
            if (summary := arm_summary(by_seed, sft, split)) is not None}
    starts = [seed_success(r["evaluations"][split]) for r in sft.values()]
    games = {r["evaluations"][split]["tasks_played"] for r in sft.values()}
    comparisons, categories = {}, sorted(categories_of(results, split))
    for a, b, why in comparisons_of(arms):
        gain = paired(results.runs[a], results.runs[b], split)
        if gain:
            by_category = {category: paired(results.runs[a], results.runs[b], split, category)
                           for category in categories}
            comparisons[f"{a} vs {b}"] = gain | {"a": a, "b": b, "measures": why, "by_category": by_category}
    for arm in arms:
        if arm != "boundary" and "boundary" in arms:
            arms[arm]["time_vs_boundary"] = time_vs(results.runs[arm], results.runs["boundary"])
    return {"split": split, "games": max(games) if games else 0, "sft": {
        "seeds": sorted(sft), "held_out_mean": mean_or_none(starts),
        "held_out_std": mean_std(starts)[1] if starts else None, "held_out_by_seed": starts,
        "wall_seconds": {part: statistics.fmean(r["seconds"].get(part, 0.0) for r in sft.values())
                         for part in (next(iter(sft.values()))["seconds"] if sft else {})}},
        "arms": arms, "comparisons": comparisons}


def time_vs(runs: Mapping[int, Mapping], base: Mapping[int, Mapping]) -> dict | None:
    """An arm's time per iteration relative to `base`'s, seed by seed, then averaged: each seed's ratio is on one
    scale even where the two arms ran on different machines, once both recorded a reference step."""
    ratios = {seed: r for seed in sorted(runs.keys() & base.keys()) if (r := time_ratio(runs[seed], base[seed]))}
    if not ratios:
        return None
    normalized = [seed for seed in ratios if reference_step(runs[seed]) and reference_step(base[seed])]
    return {"ratio": statistics.fmean(ratios.values()), "by_seed": ratios, "normalized_seeds": normalized}


def categories_of(results: StudyResults, split: str) -> set[str]:
    return {o["category"] for by_seed in [results.sft, *results.runs.values()] for r in by_seed.values()
            if split in r["evaluations"] for run in r["evaluations"][split]["runs"] for o in run["outcomes"]}


def pooling_text() -> str:
    """How `paired` pools seeds, from its docstring (one text for summary.json and RESULTS.md)."""
    return paired.__doc__.split("\n\n", 1)[1].split("\n\n")[0].replace("\n    ", " ").strip().removeprefix("Pooling: ")


def study_summary(results: StudyResults, command: str) -> dict:
    """summary.json: the primary split's numbers at the top (per arm: held_out_mean and _std over training
    seeds, sft_mean, gain_ci95 [lo, hi] of the paired gain over the seed's SFT start, seconds_per_iteration),
    the paired comparisons between arms, and the other held-out splits under `other_splits`. Success is a
    fraction in [0, 1]; gains are differences of fractions."""
    cfg = results.cfg
    primary, *others = cfg.eval_splits
    return {"generated_by": command, "env": cfg.env, "eval_seeds": list(cfg.eval_seeds),
            "seeds": finished_seeds(results), "seeds_planned": list(cfg.seeds), "iterations": cfg.rl.iterations,
            "episodes_per_iteration": cfg.rl.episodes_per_iteration,
            "pooling": pooling_text(),
            **split_summary(results, primary),
            "other_splits": {split: split_summary(results, split) for split in others}}


# ---- RESULTS.md --------------------------------------------------------------------------------------------------


def points(fraction: float | None, sign: bool = False) -> str:
    if fraction is None:
        return "–"
    return f"{100 * fraction:+.1f}" if sign else f"{100 * fraction:.1f}"


def interval_text(gain: Mapping | None) -> str:
    """A paired gain ({"gain", "ci95"}) as '+3.2 [-0.4, +6.8]', in points."""
    if not gain or gain.get("ci95") is None:
        return "–"
    low, high = gain["ci95"]
    return f"{points(gain['gain'], True)} [{points(low, True)}, {points(high, True)}]"


def verdict(a: str, b: str, gain: Mapping | None) -> str:
    """Which side the paired 95 % interval puts ahead, if any."""
    if not gain:
        return f"{a} vs {b}: not measured"
    low, high = gain["ci95"]
    if low > 0:
        head = f"**{a} beats {b}**"
    elif high < 0:
        head = f"**{b} beats {a}**"
    else:
        head = f"**no difference resolved** between {a} and {b} (the interval holds 0)"
    return f"{head}: {interval_text(gain)} points, paired on {gain['episodes']} episodes ({gain['games']} games)"


def answer_lines(summary: Mapping) -> list[str]:
    """The plain answers, computed from summary.json: boundary against each baseline, which ablation carries a
    difference, the time it costs, and where boundary is not ahead."""
    comparisons, arms = summary["comparisons"], summary["arms"]
    if "boundary" not in arms:
        return ["No boundary run has finished yet."]
    lines = []
    for key, gain in comparisons.items():
        if gain["a"] == "boundary":
            lines.append(f"Boundary against {gain['b']}: " + verdict("boundary", gain["b"], gain) + ".")
    for (a, b), why in ABLATIONS.items():
        gain = comparisons.get(f"{a} vs {b}")
        if gain:
            lines.append(f"{why[0].upper()}{why[1:]} ({a} vs {b}): " + verdict(a, b, gain) + ".")
    readout, credit = comparisons.get("boundary vs ppo_critic_turn"), comparisons.get("ppo_critic_turn vs ppo_critic_verl")
    if readout and credit:
        resolved = [name for name, gain in (("the shared readout", readout), ("turn-level credit", credit))
                    if gain["ci95"][0] > 0 or gain["ci95"][1] < 0]
        lines.append("What carries the difference: " + (" and ".join(resolved) if resolved else
                     "neither ablation resolves a difference at this size") + ".")
    base = arms["boundary"].get("seconds_per_iteration")
    ratios = {arm: arms[arm]["time_vs_boundary"] for arm in arms if (arms[arm].get("time_vs_boundary") or {}).get("ratio")}
    costs = [f"{arm} {r['ratio']:.2f}x" for arm, r in ratios.items()]
    if costs and base:
        unscaled = sorted({seed for r in ratios.values() for seed in r["by_seed"] if seed not in r["normalized_seeds"]})
        scale = (" Seed by seed, each on its machine's reference step (benchlib.reference_step_seconds)." if not unscaled
                 else f" Seed by seed; seed{'s' * (len(unscaled) > 1)} {', '.join(map(str, unscaled))} recorded no machine "
                      "reference for some arm, so those ratios are raw and mix machines where an arm ran in another session.")
        lines.append(f"Cost in time: boundary's iteration took {base:.1f} s; each baseline's, relative to it: "
                     + ", ".join(costs) + "." + scale)
    behind = []
    for key, gain in comparisons.items():
        if gain["a"] != "boundary":
            continue
        where = [category for category, by in gain["by_category"].items() if by and by["ci95"][0] <= 0]
        if where:
            behind.append(f"against {gain['b']} in {', '.join(where)}")
    if behind:
        lines.append("Where boundary is not resolved ahead (per task category, paired interval holds 0 or lies "
                     "below): " + "; ".join(behind) + ".")
    return lines


def gains_table(split_summary_: Mapping) -> str:
    """Per arm: held-out success, its SFT start, the paired gain with its interval, time."""
    lines = ["| Method | seeds | held-out % (mean ± std over seeds) | SFT start % | paired gain over SFT, points [95 % CI] "
             "| s / iteration | RL min / run | eval min / run |", "|---|---|---|---|---|---|---|---|"]
    for arm, s in split_summary_["arms"].items():
        held = points(s["held_out_mean"]) + (f" ± {points(s['held_out_std'])}" if s["held_out_std"] is not None else "")
        per_iteration = f"{s['seconds_per_iteration']:.2f}" if s["seconds_per_iteration"] else "–"
        wall = s["wall_seconds"]
        lines.append(f"| {arm} | {len(s['seeds'])} | {held} | {points(s['sft_mean'])} | "
                     f"{interval_text({'gain': s['gain'], 'ci95': s['gain_ci95']})} | "
                     f"{per_iteration} | {wall.get('train', 0) / 60:.1f} | {wall.get('eval', 0) / 60:.1f} |")
    return "\n".join(lines)


def comparisons_table(split_summary_: Mapping) -> str:
    """Each paired comparison, overall and per task category."""
    comparisons = split_summary_["comparisons"]
    categories = sorted({c for gain in comparisons.values() for c in gain["by_category"]})
    lines = ["| a vs b | all games | " + " | ".join(categories) + " |", "|---|---|" + "---|" * len(categories)]
    for key, gain in comparisons.items():
        lines.append(f"| {key} | {interval_text(gain)} | "
                     + " | ".join(interval_text(gain["by_category"].get(c)) for c in categories) + " |")
    return "\n".join(lines)


def iteration_seconds(results: StudyResults, stage: str = "iteration") -> dict[str, list[float]]:
    return {arm: [r["time_per_iteration"][stage] for r in by_seed.values() if r["time_per_iteration"]]
            for arm, by_seed in results.runs.items()}


def mean_std_text(values: Sequence[float], digits: int = 1) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def time_table(results: StudyResults) -> str:
    stages = (*ITERATION_STAGES, "iteration")
    lines = ["| Method | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for arm in results.runs:
        cells = [mean_std_text(iteration_seconds(results, stage)[arm], 3) for stage in stages]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def stage_table(results: StudyResults) -> str:
    """Wall time of every stage of the study, minutes, mean ± std over seeds."""
    lines = ["| Stage | minutes per seed | seeds |", "|---|---|---|"]
    sft_parts = list(dict.fromkeys(part for s in results.sft.values() for part in s["seconds"]))   # in stage order
    for part in sft_parts:
        values = [s["seconds"][part] / 60 for s in results.sft.values() if part in s["seconds"]]
        lines.append(f"| SFT start: {part} | {mean_std_text(values)} | {len(values)} |")
    for arm, by_seed in results.runs.items():
        for part in ("train", "eval"):
            values = [r["seconds"][part] / 60 for r in by_seed.values()]
            lines.append(f"| {arm}: {'RL' if part == 'train' else 'evaluation'} | {mean_std_text(values)} | {len(values)} |")
    return "\n".join(lines)


def table_files(results: StudyResults, split: str) -> list[dict]:
    """The held-out results in the shape `evaluate.results_table` pools (one file per label; a file's runs are
    every (training seed, eval seed) evaluation of that label)."""
    def file(label: str, evaluations: list[dict]) -> dict:
        first = evaluations[0] if evaluations else {}
        return {"label": label, "env": first.get("env"), "split": split, "temperature": results.cfg.rl.eval_temperature,
                "runs": [run for e in evaluations for run in e["runs"]], "tasks_played": first.get("tasks_played"),
                "split_tasks": first.get("split_tasks")}

    files = [file(SFT_LABEL, [s["evaluations"][split] for s in results.sft.values() if split in s["evaluations"]])]
    files += [file(arm, [r["evaluations"][split] for r in by_seed.values() if split in r["evaluations"]])
              for arm, by_seed in results.runs.items()]
    return [f for f in files if f["runs"]]


def runs_table(results: StudyResults, splits: Sequence[str]) -> str:
    """Every run's own numbers, one row per (label, seed): what the tables above are computed from."""
    lines = ["| Method | seed | " + " | ".join(f"{s} success % (per eval seed)" for s in splits)
             + " | s / iteration | results file |", "|---|---|" + "---|" * (len(splits) + 2)]

    def cells(evaluations: Mapping) -> str:
        return " | ".join(" / ".join(points(run["success"]) for run in evaluations[s]["runs"])
                          if s in evaluations else "–" for s in splits)

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
             + ", ".join(f"`{split}` ({cfg.eval_episodes.get(split) or 'all'} games)" for split in cfg.eval_splits)
             + f", the same games for every checkpoint, each played once per eval seed ({', '.join(map(str, cfg.eval_seeds))}) "
             f"at T = {rl.eval_temperature}.",
             f"- Seeds: {', '.join(map(str, cfg.seeds))}. Each seed builds its own tokenizer and tiny model "
             f"(`{cfg.model_size}`) and one SFT checkpoint that every algorithm of the seed starts from."]
    if results.sft:
        first = next(iter(results.sft.values()))
        lines.append(f"- Model: {first['parameters'] / 1e6:.2f}M parameters, vocabulary {first['vocabulary']}. SFT: "
                     f"{cfg.sft_episodes} expert episodes, {cfg.sft_epochs:g} epoch(s) at lr {cfg.sft_lr:g}"
                     f"{' decaying' if cfg.sft_lr_decay else ''} in batches of {cfg.sft_batch_turns} turns, prompt-loss "
                     f"weight {cfg.sft_prompt_loss_weight:g} (final loss "
                     + ", ".join(f"{s['loss_last']:.3f}" for s in results.sft.values()) + " per seed).")
    lines.append(f"- RL, equal for every algorithm: {rl.iterations} iterations x {rl.episodes_per_iteration} episodes "
                 f"(boundary and PPO: N tasks x 1; group methods: N/8 tasks x 8), actor lr {rl.optim.lr:g}, value-row "
                 f"lr {rl.optim.value_lr:g}, critic lr {rl.optim.critic_lr:g}, KL coef {rl.loss.kl_coef:g}, at most "
                 f"{rl.rollout.max_turns or 'the env default'} turns and {rl.rollout.max_new_tokens} new tokens per turn, "
                 f"T = {rl.rollout.temperature:g}.")
    lines.append("- Arms: " + "; ".join(f"**{arm}** `{' '.join(overrides)}`" for arm, overrides in cfg.arms.items()) + ".")
    return lines


def render_results(results: StudyResults, summary: Mapping, command: str, interpretation: str | None) -> str:
    cfg = results.cfg
    primary = cfg.eval_splits[0]
    expected = {(arm, seed) for arm in cfg.arms for seed in cfg.seeds}
    missing = sorted(expected - {(arm, seed) for arm, by_seed in results.runs.items() for seed in by_seed})
    seconds = sum(sum(s["seconds"].values()) for s in results.sft.values()) + \
        sum(sum(r["seconds"].values()) for by_seed in results.runs.values() for r in by_seed.values())
    out = ["# Learning study: results", "",
           f"Generated by `{command}` from the results files under `{cfg.out_dir}` (copies and `summary.json` in "
           f"`{cfg.measurements_dir}`); do not edit by hand. Measured on this CPU (see BENCHMARKS.md for the "
           f"machine). Wall time of the runs reported here: {seconds / 3600:.2f} h.", ""]
    if len(cfg.seeds) < 3:
        out += [f"> **Preliminary**: {len(cfg.seeds)} seed(s); the study calls for at least 3.", ""]
    if missing:
        out += ["> **Incomplete**: not finished yet: " + ", ".join(f"{arm} seed {seed}" for arm, seed in missing), ""]
    out += ["## Setting", "", *setting_lines(results), "",
            f"## The answer, on `{primary}`", "",
            "Every comparison is paired: the same games, eval seeds and training seeds (each arm starts from its "
            "seed's SFT checkpoint). Intervals are 95 % bootstrap intervals over games; " + summary["pooling"], ""]
    out += [f"- {line}" for line in answer_lines(summary)]
    for split_summary_ in [summary, *summary["other_splits"].values()]:
        split = split_summary_["split"]
        out += ["", f"## Gain over the SFT start and between arms, `{split}` ({split_summary_['games']} games)", ""]
        if not split_summary_["arms"]:
            out += ["Not evaluated (the env server does not serve this split), or no run has finished."]
            continue
        out += [gains_table(split_summary_), "", "Paired differences in points, a minus b [95 % CI], on all games "
                "and per task category:", "", comparisons_table(split_summary_)]
    for split in cfg.eval_splits:
        files = table_files(results, split)
        out += ["", f"## Held-out success per category on `{split}`", ""]
        out += [results_table(files)] if files else ["Not evaluated: the env server does not serve this split."]
    out += ["", "## Learning curves", "", f"![learning curves]({CURVES_PNG})", "",
            "Training-rollout success per iteration (T = 1.0), mean ± std over seeds; held-out success where the "
            "runs evaluated during training.", "",
            "## Time per iteration and its parts", "",
            "Seconds, mean ± std over seeds of each run's mean iteration (stage names as in verl's timing_raw).", "",
            time_table(results), "",
            "## Wall time per stage", "", stage_table(results), "",
            "## Interpretation (the lead's)", ""]
    out += [interpretation.strip()] if interpretation else [
        f"> _Not written yet: put it in `{cfg.report_dir}/{INTERPRETATION_MD}`; the next report includes it here._"]
    out += ["", "## Every run", "", runs_table(results, cfg.eval_splits), ""]
    return "\n".join(out)


def study_files(cfg: StudyConfig, root: Path) -> list[Path]:
    """The files of `root` (out_dir or measurements_dir) that make the study resumable anywhere, relative to it:
    study.yaml; per seed the SFT results and the SFT checkpoint every arm starts from (a tiny model, ~2.5 MB);
    per arm its results, metrics and config. No RL checkpoints: a finished arm needs only its results."""
    wanted = [Path("study.yaml")]
    for seed in cfg.seeds:
        seed_rel = seed_dir(cfg, seed).relative_to(cfg.out_dir)
        wanted += [seed_rel / "sft.json", seed_rel / "sft_train.json"]
        if (root / seed_rel / "sft.json").is_file():   # the checkpoint with its results, not a half-written one
            wanted += sorted(p.relative_to(root) for p in (root / seed_rel / "sft").glob("*") if p.is_file())
        for arm in cfg.arms:
            if (root / seed_rel / arm / "results.json").is_file():
                wanted += [seed_rel / arm / name for name in ("results.json", "metrics.jsonl", "config.yaml")]
    return [path for path in wanted if (root / path).is_file()]


def export_measurements(cfg: StudyConfig) -> Path:
    """Copy the study's files (study_files) into measurements_dir, replacing the seed folders there, so that
    what is committed is exactly the study in out_dir."""
    out, target = Path(cfg.out_dir), Path(cfg.measurements_dir)
    target.mkdir(parents=True, exist_ok=True)
    if out.resolve() == target.resolve():
        return target
    for old in target.glob("seed_*"):
        shutil.rmtree(old)
    for path in study_files(cfg, out):
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / path, target / path)
    return target


def restore_from_measurements(cfg: StudyConfig) -> list[Path]:
    """A study committed part by part resumes in a fresh checkout: the committed files missing from out_dir are
    copied back (finished SFT starts and arms are then skipped). Only when the committed study was made with
    these settings; an older study's files are left for the first publish to replace."""
    out, source = Path(cfg.out_dir), Path(cfg.measurements_dir)
    saved = source / "study.yaml"
    if out.resolve() == source.resolve() or not saved.is_file():
        return []
    if stale_settings(saved, cfg):
        return []
    restored = [path for path in study_files(cfg, source) if not (out / path).exists()]
    for path in restored:
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / path, out / path)
    return restored


def write_report(cfg: StudyConfig, command: str) -> list[Path]:
    """RESULTS.md, its PNG, summary.json and the measurement copies; returns the paths written."""
    results = read_results(cfg)
    report_dir = Path(cfg.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if results.curves:
        written.append(plot_curves(results.curves, report_dir / CURVES_PNG))
    measurements = export_measurements(cfg) if (Path(cfg.out_dir) / "study.yaml").is_file() else Path(cfg.measurements_dir)
    measurements.mkdir(parents=True, exist_ok=True)
    summary = study_summary(results, command)
    (measurements / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    notes = report_dir / INTERPRETATION_MD
    path = report_dir / "RESULTS.md"
    path.write_text(render_results(results, summary, command, notes.read_text() if notes.is_file() else None))
    return [path, *written, measurements]


# ---- CLI ------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = config.Parser(prog="learning_study.py", description=__doc__.split("\n\n")[0])
    config.add_config_arguments(parser, StudyConfig, dry_run=True)  # configs/study.yaml, study_smoke.yaml
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--estimate", action="store_true", help="time SFT and a few iterations per arm, project the total")
    mode.add_argument("--report-only", action="store_true", help="rewrite RESULTS.md from the results files")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--commit", action="store_true",
                        help="after each finished part (a seed's SFT, an arm), git-commit summary.json, "
                             "the study's files and RESULTS.md")
    args = parser.parse_intermixed_args(argv)
    cfg = config.config_from_args(StudyConfig, parser, args)
    if args.dry_run:
        config.print_config(cfg)
        return 0
    if args.commit and args.estimate:
        parser.error("--commit publishes finished seeds; --estimate finishes none")
    if not args.report_only:
        try:
            restored = restore_from_measurements(cfg)
            if restored:
                print(f"restored {len(restored)} files of finished parts from {cfg.measurements_dir}", flush=True)
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

    def publish(seed: int | None = None, part: str = "") -> None:
        """Regenerate the report from every finished run; with --commit, commit it (nothing new: no commit)."""
        paths = write_report(cfg, command)
        print(f"report: {paths[0]}, summary: {Path(cfg.measurements_dir) / 'summary.json'}", flush=True)
        if args.commit:
            done = finished_seeds(read_results(cfg))
            what = f"seed {seed} {part} finished" if seed is not None else "report regenerated"
            message = (f"Learning study ({Path(args.config or 'defaults').name}): {what}; seeds done "
                       f"{done or 'none'} of {list(cfg.seeds)}, summary.json and RESULTS.md from their results files")
            try:
                if commit(paths, message):
                    print(f"committed: {message}", flush=True)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
                # Hours of runs must not stop on git: the files are written, the next part's commit takes them.
                print(f"not committed ({error}); the next publish retries", file=sys.stderr, flush=True)

    if not args.report_only:
        asyncio.run(run_study(cfg, console, part_done=publish))
    publish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
