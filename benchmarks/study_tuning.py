"""Tuning the study's core arms with one budget: every arm runs the same number of grid points (seed
`tuning.seed`, the study's iterations) from that seed's SFT start, and each is judged on the validation split
alone (gen_val: games that share no room with gen_train or gen_test, checked here). tuning.json records the
grid, every run's validation success and the chosen setting per arm; the final study then runs with those
settings (arm_overrides), and its seed-`tuning.seed` run of each arm is the chosen tuning run itself.

    python benchmarks/learning_study.py --config configs/study.yaml --tune [--commit]
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path

from rich.console import Console
from study_config import CORE_ARMS, StudyConfig, tuning_run_dir
from study_run import held_out_tasks, run_arm, study_env_server, warm_start, write_json

from trainer_client.env_pool import EnvPool

TUNING_JSON = "tuning.json"
RUN_FILES = ("results.json", "metrics.jsonl", "config.yaml")


def tuning_cfg(cfg: StudyConfig) -> StudyConfig:
    """The study as tuning runs it: its server also serves the validation split."""
    return dataclasses.replace(cfg, server_args=(*cfg.server_args, *cfg.tuning.server_args))


def point_cfg(cfg: StudyConfig, arm: str, point: tuple[str, ...]) -> StudyConfig:
    """The study with one grid point added to the arm's own overrides."""
    return dataclasses.replace(cfg, arm_overrides={**cfg.arm_overrides,
                                                   arm: [*cfg.arm_overrides.get(arm, ()), *point]})


def shared_rooms(cfg: StudyConfig) -> dict:
    """Whether the validation split shares a room with the training split or the primary held-out split, told by
    ALFWorld's room fingerprints (generate.room_fingerprint); other envs say it is not checked."""
    splits = (cfg.tuning.split, cfg.train_split, cfg.eval_splits[0])
    if cfg.env != "alfworld":
        return {"checked": False, "shared": None, "said": f"Rooms are not compared for env {cfg.env}."}
    from env_server.__main__ import build_parser, config_from_args
    from env_server.envs.alfworld import generate
    from env_server.envs.alfworld.env import AlfWorldConfig

    server = config_from_args(build_parser().parse_args(["--envs", cfg.env, *cfg.server_args]))
    options = AlfWorldConfig(**server.env_options.get("alfworld", {}))
    generated = options.generated_splits()
    if not set(splits) <= set(generated):
        return {"checked": False, "shared": None, "said": f"Rooms are compared on generated splits only, not {splits}."}
    root = generate.generated_root(options.cache_root(), generated)
    rooms = {split: set(generate.split_fingerprints(root, split)) for split in splits}
    shared = {other: len(rooms[cfg.tuning.split] & rooms[other]) for other in splits[1:]}
    said = (f"Its {len(rooms[splits[0]])} games share " + " and ".join(
        f"{n} rooms with `{other}` ({len(rooms[other])} games)" for other, n in shared.items()) + ".")
    return {"checked": True, "shared": shared, "games": {s: len(r) for s, r in rooms.items()}, "said": said}


def chosen_points(runs: Mapping[str, list[dict]]) -> dict[str, list[str]]:
    """Per arm the grid point with the highest validation success (the first in grid order on a tie)."""
    return {arm: max(arm_runs, key=lambda run: run["success"])["overrides"] for arm, arm_runs in runs.items() if arm_runs}


def read_tuning(cfg: StudyConfig) -> dict | None:
    for root in (Path(cfg.out_dir), Path(cfg.measurements_dir)):
        if (root / TUNING_JSON).is_file():
            return json.loads((root / TUNING_JSON).read_text())
    return None


def tuning_record(cfg: StudyConfig, rooms: Mapping, sft: Mapping, games: int) -> dict:
    """tuning.json from the finished tuning runs in out_dir."""
    runs: dict[str, list[dict]] = {}
    for arm in cfg.tuning.grid:
        for point in cfg.tuning.points(arm):
            done = tuning_run_dir(cfg, arm, point) / "results.json"
            if not done.is_file():
                continue
            result = json.loads(done.read_text())
            evaluation = result["evaluations"][cfg.tuning.split]
            runs.setdefault(arm, []).append({
                "overrides": list(point), "success": statistics.fmean(r["success"] for r in evaluation["runs"]),
                "by_eval_seed": {r["seed"]: r["success"] for r in evaluation["runs"]},
                "run": str(done.parent.relative_to(cfg.out_dir)), "seconds": result["seconds"],
                "seconds_per_iteration": (result["time_per_iteration"] or {}).get("iteration")})
    planned = {arm: len(cfg.tuning.points(arm)) for arm in cfg.tuning.grid}
    sft_runs = sft["evaluations"].get(cfg.tuning.split, {}).get("runs", [])
    return {"split": cfg.tuning.split, "seed": cfg.tuning.seed, "games": games, "eval_seeds": list(cfg.eval_seeds),
            "iterations": cfg.rl.iterations, "runs_per_arm": max(planned.values(), default=0), "grid": cfg.tuning.grid,
            "rooms": dict(rooms), "sft_success": statistics.fmean(r["success"] for r in sft_runs) if sft_runs else None,
            "complete": all(len(runs.get(arm, [])) == n for arm, n in planned.items()),
            "runs": runs, "chosen": chosen_points(runs) if all(len(runs.get(a, [])) == n for a, n in planned.items()) else {}}


def export_tuning(cfg: StudyConfig) -> list[Path]:
    """tuning.json and every finished tuning run's results, metrics and config, copied to measurements_dir."""
    out, target = Path(cfg.out_dir), Path(cfg.measurements_dir)
    if out.resolve() == target.resolve():
        return [target / TUNING_JSON]
    copied = []
    for path in [*([Path(TUNING_JSON)] if (out / TUNING_JSON).is_file() else []), *(p.relative_to(out) for p in sorted((out / "tuning").glob("*/*/*"))
                                      if p.name in RUN_FILES and (p.parent / "results.json").is_file())]:
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / path, target / path)
        copied.append(target / path)
    return copied


def restore_tuning(cfg: StudyConfig) -> int:
    """Finished tuning runs committed from another checkout: their results come back, so they are not rerun."""
    out, source = Path(cfg.out_dir), Path(cfg.measurements_dir) / "tuning"
    restored = 0
    for path in sorted(source.glob("*/*/results.json")) if source.resolve() != (out / "tuning").resolve() else []:
        run_dir = out / "tuning" / path.parent.relative_to(source)
        if not (run_dir / "results.json").exists():
            run_dir.mkdir(parents=True, exist_ok=True)
            for name in RUN_FILES:
                if (path.parent / name).is_file():
                    shutil.copy2(path.parent / name, run_dir / name)
            restored += 1
    return restored


async def run_tuning(cfg: StudyConfig, console: Console, part_done: Callable[[str], None] | None = None) -> dict:
    """Every core arm's grid on the validation split; tuning.json rewritten after each run, `part_done(what)`."""
    if not cfg.tuning.grid:
        raise ValueError("tuning.grid is empty: give each core arm its grid in the study's config")
    missing = sorted(set(CORE_ARMS) - set(cfg.tuning.grid))
    if missing:
        raise ValueError(f"tuning.grid leaves out core arms {missing}: every arm gets the same budget")
    served = tuning_cfg(cfg)
    async with study_env_server(served) as address, EnvPool([address]) as pool:
        rooms = shared_rooms(served)
        if rooms["checked"] and any(rooms["shared"].values()):
            raise ValueError(f"the validation split is not disjoint: {rooms['said']}")
        tasks = await held_out_tasks(pool, served, {cfg.tuning.split: cfg.tuning.episodes})
        if cfg.tuning.split not in tasks:
            raise ValueError(f"the env server does not serve {cfg.tuning.split!r}: add it with tuning.server_args")
        games = len(tasks[cfg.tuning.split].task_ids)
        sft = await warm_start(pool, served, cfg.tuning.seed, tasks, console)
        record = tuning_record(cfg, rooms, sft, games)
        write_json(Path(cfg.out_dir) / TUNING_JSON, record)
        for arm in cfg.tuning.grid:
            for point in cfg.tuning.points(arm):
                run_dir = tuning_run_dir(cfg, arm, point)
                if (run_dir / "results.json").is_file():
                    continue
                console.rule(f"tuning {arm}: {' '.join(point)}")
                await run_arm(pool, address, point_cfg(served, arm, point), cfg.tuning.seed, arm, tasks, console,
                              run_dir=run_dir)
                record = tuning_record(cfg, rooms, sft, games)
                write_json(Path(cfg.out_dir) / TUNING_JSON, record)
                if part_done:
                    part_done(f"tuning {arm} {' '.join(point)}")
    return record
