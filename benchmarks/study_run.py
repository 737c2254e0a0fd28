"""Running the learning study: per seed one SFT start, then RL + held-out evaluation of every arm from it, each
step skipped once its results file exists; and the dry estimate of the whole study's time."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from benchlib import cpu_model, reference_step_seconds
from rich.console import Console
from study_config import StudyConfig, arm_config, same_learning, seed_dir, stale_settings, tuning_run_dir
from study_curves import held_out_curve

from trainer_client import config
from trainer_client.checkpoints import latest_checkpoint
from trainer_client.env_pool import EnvPool
from trainer_client.eval_report import read_run
from trainer_client.evaluate import evaluate, subset
from trainer_client.experts import expert_episodes, expert_samples, expert_texts
from trainer_client.local_server import local_env_server
from trainer_client.policy import Policy, TransformersBackend, build_tiny_checkpoint
from trainer_client.policy.tokenizer import words_matching
from trainer_client.sft import fit
from trainer_client.sft_config import expert_tasks
from trainer_client.timing import mean_stage_seconds
from trainer_client.train import train
from trainer_client.train_config import TrainConfig, group_size_of


def this_machine() -> dict:
    """Where an arm ran: its times compare across machines once divided by reference_step_s."""
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "reference_step_s": reference_step_seconds(repeats=5)}



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


async def held_out_tasks(pool: EnvPool, cfg: StudyConfig,
                         episodes: Mapping[str, int] | None = None) -> dict[str, HeldOut]:
    """The held-out splits the server serves (the eval splits, or those `episodes` names), each with the subset of
    tasks every run plays."""
    episodes = {split: cfg.eval_episodes.get(split, 0) for split in cfg.eval_splits} if episodes is None else episodes
    served = (await pool.list_envs())[cfg.env].splits
    held_out = {}
    for split in (s for s in episodes if s in served):
        task_ids = await pool.list_tasks(cfg.env, split)
        held_out[split] = HeldOut(subset(task_ids, episodes[split]), len(task_ids))
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
        # The shape of a `limen-eval` results file: `runs` pools in eval_report.results_table as they are.
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
        sft_ids = expert_tasks(train_ids, cfg.sft.episodes, seed)
        experts = await expert_episodes(pool, cfg.env, cfg.train_split, sft_ids, seed,
                                        mistake_rate=cfg.sft.mistake_rate)
        expert_s = time.perf_counter() - started
        texts = [text for pair in expert_texts(experts, cfg.rl.prompt) for text in pair]
        policy = Policy.load(build_tiny_checkpoint(texts, out / "base", size=cfg.model_size, seed=seed,
                                                   whole_words=words_matching(texts, cfg.whole_word_pattern)))
        samples = expert_samples(policy.tokenizer, experts, cfg.rl.prompt)
        model_s = time.perf_counter() - started - expert_s
        losses = fit(policy, samples, cfg.sft, seed=seed, console=console)
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
    """RL of one arm from the seed's SFT checkpoint, then held-out evaluation of its last checkpoint and, when the
    primary split is among `tasks`, the held-out curve of its saved checkpoints.

    A finished run is kept only when it learned with today's settings for the arm (its config.yaml) and has its
    curve; otherwise it is set aside (`ARM.replaced_N`) and run again. A tuning run of this seed with the same
    settings is that run already: it is copied in, not repeated."""
    run_dir = run_dir or seed_dir(cfg, seed) / arm
    rl = arm_config(cfg, arm, seed, str(seed_dir(cfg, seed) / "sft"), server, str(run_dir))
    rl = dataclasses.replace(rl, iterations=iterations or rl.iterations)
    wants_curve = bool(cfg.curve_episodes) and cfg.eval_splits[0] in tasks
    done = run_dir / "results.json"
    if done.is_file() and not stale_run(run_dir, rl, wants_curve):
        return await with_missing_evaluations(pool, cfg, tasks, done, lambda: latest_checkpoint(run_dir) / "policy")
    if run_dir.exists() and (done.is_file() or not same_learning(run_dir / "config.yaml", rl)):
        set_aside(run_dir)
    reused = reusable_tuning_run(cfg, seed, arm, rl) if not run_dir.exists() else None
    if reused is not None:
        console.print(f"seed {seed} {arm}: the tuning run {reused} learned with these settings; reusing it")
        shutil.copytree(reused, run_dir, ignore=shutil.ignore_patterns("results.json"))
    machine = this_machine()
    started = time.perf_counter()
    await train(rl, resume=True, console=console)   # resume: a no-op for a new run dir, and for a finished one
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
    if reused is not None:   # trained in the tuning run: its time and machine, not the no-op resume's
        tuned = json.loads((reused / "results.json").read_text())
        result |= {"reused_from": str(reused), "machine": tuned["machine"],
                   "seconds": {"train": tuned["seconds"]["train"], "eval": result["seconds"]["eval"]}}
    if wants_curve:
        started = time.perf_counter()
        sft = json.loads((seed_dir(cfg, seed) / "sft.json").read_text())
        result["curve"] = await held_out_curve(pool, cfg, run_dir, tasks[cfg.eval_splits[0]].task_ids, sft, evaluations)
        result["seconds"]["curve"] = time.perf_counter() - started
    write_json(done, result)
    return result


def set_aside(run_dir: Path) -> Path:
    """Move a run made with other settings out of the way, kept beside it (never deleted)."""
    n = 1
    while (aside := run_dir.with_name(f"{run_dir.name}.replaced_{n}")).exists():
        n += 1
    run_dir.rename(aside)
    return aside


def stale_run(run_dir: Path, rl: TrainConfig, wants_curve: bool) -> bool:
    result = json.loads((run_dir / "results.json").read_text())
    return (wants_curve and "curve" not in result) or not same_learning(run_dir / "config.yaml", rl)


def reusable_tuning_run(cfg: StudyConfig, seed: int, arm: str, rl: TrainConfig) -> Path | None:
    """The finished tuning run (with its checkpoints) of this seed that learned with exactly `rl`'s settings."""
    if seed != cfg.tuning.seed:
        return None
    for point in cfg.tuning.points(arm):
        run_dir = tuning_run_dir(cfg, arm, point)
        if ((run_dir / "results.json").is_file() and latest_checkpoint(run_dir) is not None
                and same_learning(run_dir / "config.yaml", rl)):
            return run_dir
    return None


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
