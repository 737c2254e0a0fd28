"""Expert-verified splits of procedural ALFWorld games (rooms.py), written in the official layout
(game.tw-pddl + traj_data.json) and cached by their parameters. A game is kept only if the handcoded expert
wins it (expert seed 0) through the engine the env plays it with.

    python -m env_server.envs.alfworld.generate --out DIR --n N --seed S [--size small|medium|full] [--workers W]

DIR becomes one split: serve it by placing it at $ALFWORLD_DATA/json_2.1.1/<split name>.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
from collections import Counter, deque
from collections.abc import Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from env_server.envs.alfworld.engine import ENGINES, EXPERT_MAX_STEPS, Engine, Expert
from env_server.envs.alfworld.games import GAME_FILE, MANIFEST_FILE, SPLIT_ROOT, TRAJ_FILE
from env_server.envs.alfworld.rooms import (
    GENERATOR_VERSION, SIZES, TASK_TYPES, Game, game_file_data, sample_game, traj_data,
)

# A game is kept when the expert wins it before giving up, as alfworld-generate decides solvability.
VERIFY_TURNS = EXPERT_MAX_STEPS
EXPERT_SEED = 0
# Attempts allowed per game asked for before giving up on a split (the expert passes >= 95%).
MAX_ATTEMPTS_PER_GAME = 3
# The handcoded expert searches receptacles in set order, which follows the hash seed, and a few games pass
# or fail its turn limit by that order: verification runs where hashing is not randomized.
VERIFY_HASH_SEED = "0"


@dataclass(frozen=True)
class SplitSpec:
    """One generated split's parameters: what its cache folder is keyed on."""

    n: int
    seed: int
    size: str


# ---- verification and splits ------------------------------------------------------------------------

def expert_walkthrough(engine: Engine, game_file: Path, max_turns: int = VERIFY_TURNS) -> list[str] | None:
    """The expert's actions when it wins the game within `max_turns` (expert seed EXPERT_SEED), else None."""
    expert = Expert(game_file, EXPERT_SEED)
    state = engine.start(game_file)
    action = expert.next_action(state, "")
    actions: list[str] = []
    while action is not None and len(actions) < max_turns:
        state = engine.step(action)
        actions.append(action)
        if state["won"]:
            return actions
        action = expert.next_action(state, action)
    return None


@dataclass
class GenerationReport:
    attempts: Counter
    kept: Counter

    def pass_rate(self, task_type: str | None = None) -> float:
        if task_type is None:
            return sum(self.kept.values()) / max(1, sum(self.attempts.values()))
        return self.kept[task_type] / max(1, self.attempts[task_type])


def generate_split(out: Path, n: int, seed: int, size: str = "small", workers: int = 1) -> GenerationReport:
    """Write `n` expert-verified games into `out` (a split folder); attempt i plays task type i mod 6.

    The kept games are the first n attempts (in attempt order) whose game the expert wins. Nothing else
    decides them: not `workers` (more processes play attempts ahead and the surplus is discarded), nor this
    process's hash seed (where it is not VERIFY_HASH_SEED, a child process with it generates the split).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not hashing_is_fixed():
        return _generate_in_child(out, n, seed, size, workers)
    report = GenerationReport(Counter(), Counter())
    attempts = _attempts_in_order(out, seed, size, n * MAX_ATTEMPTS_PER_GAME, workers)
    try:
        for task_type, kept, _ in attempts:
            report.attempts[task_type] += 1
            report.kept[task_type] += kept
            if sum(report.kept.values()) == n:
                break
    finally:
        attempts.close()   # waits for attempts played ahead and removes what they wrote
    if sum(report.kept.values()) < n:
        raise RuntimeError(f"only {sum(report.kept.values())} of {n} games passed the expert in {n * MAX_ATTEMPTS_PER_GAME} attempts")
    description = f"{n} generated ALFWorld games (size={size}, seed={seed}, limen generator v{GENERATOR_VERSION})"
    manifest = {"description": description, "n": n, "seed": seed, "size": size, "size_limits": asdict(SIZES[size]),
                "verify_turns": VERIFY_TURNS, "expert_seed": EXPERT_SEED,
                "attempts": dict(report.attempts), "kept": dict(report.kept)}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return report


def hashing_is_fixed() -> bool:
    """Whether this process and the processes it spawns hash with VERIFY_HASH_SEED."""
    return sys.flags.hash_randomization == 0 and os.environ.get("PYTHONHASHSEED") == VERIFY_HASH_SEED


def _generate_in_child(out: Path, n: int, seed: int, size: str, workers: int) -> GenerationReport:
    """generate_split in a child process that hashes with VERIFY_HASH_SEED; its report is read from the manifest."""
    command = [sys.executable, "-m", __spec__.name, "--out", str(out), "--n", str(n), "--seed", str(seed),
               "--size", size, "--workers", str(workers)]
    child = subprocess.run(command, env=os.environ | {"PYTHONHASHSEED": VERIFY_HASH_SEED},
                           capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"generating {n} games (seed {seed}) failed in {' '.join(command)}:\n{child.stderr[-2000:]}")
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    return GenerationReport(Counter(manifest["attempts"]), Counter(manifest["kept"]))


def play_attempt(out: Path, seed: int, size: str, attempt: int) -> tuple[str, bool, Path]:
    """Attempt `attempt` of a split: sample its game and keep it on disk if the expert wins it.
    Returns (task type, kept, the trial folder)."""
    task_type = TASK_TYPES[attempt % len(TASK_TYPES)]
    rng = random.Random(f"limen-alfworld:{seed}:{attempt}")
    game = sample_game(task_type, rng, SIZES[size], trial_id=f"trial_gen_s{seed}_{attempt:06d}")
    trial_dir = out / game.task_dir / game.trial_id
    engine = ENGINES.acquire()
    try:
        return task_type, _write_if_solvable(engine, trial_dir, game, seed), trial_dir
    finally:
        ENGINES.release(engine)


def _attempts_in_order(out: Path, seed: int, size: str, total: int,
                       workers: int) -> Generator[tuple[str, bool, Path], None, None]:
    """`play_attempt` for attempts 0, 1, ... in order; with workers > 1, up to 2 x workers are played ahead
    in spawned processes (the engine is not fork-safe inside a threaded server). Closing the generator
    discards the attempts played ahead."""
    if workers <= 1:
        for attempt in range(total):
            yield play_attempt(out, seed, size, attempt)
        return
    ahead: deque[Future] = deque()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            for attempt in range(total):
                ahead.append(pool.submit(play_attempt, out, seed, size, attempt))
                if len(ahead) >= 2 * workers:
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()
        finally:
            for future in ahead:
                _, kept, trial_dir = future.result()
                if kept:
                    _remove_trial(trial_dir)


def _remove_trial(trial_dir: Path) -> None:
    shutil.rmtree(trial_dir)
    try:
        trial_dir.parent.rmdir()   # the goal folder, once no trial of it is left
    except OSError:
        pass                       # another trial of the same goal lives there (or is being written)


def _write_if_solvable(engine: Engine, trial_dir: Path, game: Game, seed: int) -> bool:
    for _ in range(3):   # a parallel attempt may remove the shared goal folder between its mkdir and ours
        try:
            trial_dir.mkdir(parents=True, exist_ok=True)
            break
        except FileNotFoundError:
            continue
    (trial_dir / TRAJ_FILE).write_text(json.dumps(traj_data(game, seed), indent=1))
    game_file = trial_dir / GAME_FILE
    game_file.write_text(json.dumps(game_file_data(game, None)))
    walkthrough = expert_walkthrough(engine, game_file)
    if walkthrough is None:
        _remove_trial(trial_dir)
        return False
    game_file.write_text(json.dumps(game_file_data(game, walkthrough)))
    return True


def generated_root(cache_root: Path, splits: Mapping[str, SplitSpec]) -> Path:
    """A data folder (json_2.1.1/<split>/...) holding these generated splits, made once and reused.

    The folder is named by a digest of everything that decides its games, so changed parameters get a
    new folder. Processes starting together generate under a file lock; the others wait and reuse.
    """
    return _generated_root(cache_root, tuple(sorted(splits.items())))


@functools.cache
def _generated_root(cache_root: Path, splits: tuple[tuple[str, SplitSpec], ...]) -> Path:
    params = [GENERATOR_VERSION, metadata.version("alfworld"), [(name, asdict(spec), asdict(SIZES[spec.size])) for name, spec in splits]]
    root = cache_root / hashlib.sha256(json.dumps(params).encode()).hexdigest()[:16]
    for name, spec in splits:
        split_dir = root / SPLIT_ROOT / name
        if (split_dir / MANIFEST_FILE).is_file():
            continue
        with _locked(root / ".lock"):
            if (split_dir / MANIFEST_FILE).is_file():
                continue
            partial = split_dir.with_name(f".{name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            print(f"alfworld: generating {spec.n} {spec.size} games for split {name} in {root}", file=sys.stderr)
            generate_split(partial, spec.n, spec.seed, spec.size, workers=generation_workers())
            partial.rename(split_dir)
    return root


def room_fingerprint(game_file: Path) -> str:
    """A digest of what a game is (its room, objects, start and goal) without its trial name: two splits made with
    different seeds could still draw one room twice, and this is what tells."""
    problem = json.loads(game_file.read_text())["pddl_problem"]
    body = problem.split("\n", 2)[2] if problem.startswith("\n(define (problem ") else problem
    return hashlib.sha256(body.encode()).hexdigest()


def split_fingerprints(root: Path, split: str) -> dict[str, str]:
    """{fingerprint: trial id} of every game of a split under a data root."""
    return {room_fingerprint(game): game.parent.name for game in sorted((root / SPLIT_ROOT / split).glob(f"*/*/{GAME_FILE}"))}


def generation_workers() -> int:
    """Processes that generate a split: the CPUs this process may use, at most 8."""
    return min(8, len(os.sched_getaffinity(0)))


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="split folder to write the games into")
    parser.add_argument("--n", type=int, required=True, help="games to keep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--workers", type=int, default=1, help="processes (the games do not depend on it)")
    args = parser.parse_args(argv)
    report = generate_split(args.out, args.n, args.seed, args.size, args.workers)
    for task_type in TASK_TYPES:
        print(f"{task_type:32s} kept {report.kept[task_type]:4d} of {report.attempts[task_type]:4d} attempts "
              f"({100 * report.pass_rate(task_type):.1f}%)")
    print(f"{'all':32s} kept {sum(report.kept.values()):4d} of {sum(report.attempts.values()):4d} attempts "
          f"({100 * report.pass_rate():.1f}%) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
