"""Procedural ALFWorld games in the official layout (game.tw-pddl + traj_data.json), all six task types.

Rooms come from the ALFRED floorplans in the alfworld wheel (gen/layouts: each scene's object classes,
its receptacles' ids and poses, its floor grid); what fits where and what can be heated, cooled, cleaned
or toggled from alfworld.gen.constants; goals and task sentences from alfworld.gen.goal_library. A game
is kept only if the handcoded expert wins it (expert seed 0) through the engine the env plays it with.

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
from importlib import metadata, resources
from pathlib import Path

import alfworld
import alfworld.gen.constants as constants
import alfworld.gen.goal_library as goal_library
import numpy as np

from env_server.envs.alfworld.engine import ENGINES, EXPERT_MAX_STEPS, Engine, Expert
from env_server.envs.alfworld.games import GAME_FILE, MANIFEST_FILE, SPLIT_ROOT, TRAJ_FILE

# Bump when a change to this file changes the games a seed gives: cached splits are keyed on it.
# v2: games are verified under a fixed hash seed (v1's depended on the generating process's).
GENERATOR_VERSION = 2
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# A game is kept when the expert wins it before giving up, as alfworld-generate decides solvability.
VERIFY_TURNS = EXPERT_MAX_STEPS
EXPERT_SEED = 0
# Attempts allowed per game asked for before giving up on a split (the expert passes >= 95%).
MAX_ATTEMPTS_PER_GAME = 3
# The handcoded expert searches receptacles in set order, which follows the hash seed, and a few games pass
# or fail its turn limit by that order: verification runs where hashing is not randomized.
VERIFY_HASH_SEED = "0"

# ---- facts from the alfworld wheel --------------------------------------------------------------------
RECEPTACLE_TYPES = frozenset(constants.RECEPTACLES) - frozenset(constants.MOVABLE_RECEPTACLES)
OBJECT_TYPES = frozenset(constants.OBJECTS_SET) - RECEPTACLE_TYPES
FITS_IN = {r: frozenset(objects) & OBJECT_TYPES for r, objects in constants.VAL_RECEPTACLE_OBJECTS.items()
           if r in RECEPTACLE_TYPES}
PICKUPABLE = frozenset().union(*FITS_IN.values())
OPENABLE = frozenset(constants.OPENABLE_CLASS_LIST) & RECEPTACLE_TYPES
PROPERTY_OF_ACTION_CLASS = {"Cleanable": "cleanable", "Heatable": "heatable", "Coolable": "coolable",
                            "Sliceable": "sliceable", "Toggleable": "toggleable"}
LAMP = "DeskLamp"
LAMP_HOLDERS = frozenset({"Desk", "Dresser", "Shelf", "SideTable"})  # where the official games put desk lamps
# What the target must be, and the appliance the task needs (never also the target's destination).
TARGET_ACTION_CLASS = {"pick_clean_then_place_in_recep": "Cleanable", "pick_heat_then_place_in_recep": "Heatable",
                       "pick_cool_then_place_in_recep": "Coolable"}
APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
             "pick_cool_then_place_in_recep": "Fridge"}
GRID_STEP_M = 0.25  # ALFRED's navigation grid; location names count grid steps
HORIZONS = (0, 15, 30, 45, 60)


@dataclass(frozen=True)
class GameSize:
    """How big a room is: the knob for curricula and for fast CPU runs."""

    receptacles: tuple[int, int]  # static receptacles in the room (at least the task's own)
    distractors: tuple[int, int]  # objects not of the target's class
    targets: tuple[int, int]  # objects of the target's class (pick_two: at least 2)

    def __post_init__(self) -> None:
        for name in ("receptacles", "distractors", "targets"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"GameSize.{name} must be (low, high) with 0 <= low <= high, got {(low, high)}")
        if self.targets[0] < 1:
            raise ValueError("GameSize.targets must start at >= 1")


SIZES = {
    # A handful of receptacles and objects: resets in tens of ms, episodes of ~5-15 expert steps.
    "small": GameSize(receptacles=(3, 5), distractors=(1, 4), targets=(1, 1)),
    "medium": GameSize(receptacles=(8, 14), distractors=(6, 14), targets=(1, 2)),
    # About the official games' median room (25 receptacles, 46 objects).
    "full": GameSize(receptacles=(18, 30), distractors=(20, 40), targets=(1, 3)),
}


@dataclass(frozen=True)
class SplitSpec:
    n: int
    seed: int
    size: str


# ---- scenes --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placed:
    """A receptacle or object instance: its PDDL id, its class and where it stands."""

    pddl_id: str
    cls: str
    location: str


@dataclass(frozen=True)
class Scene:
    floorplan: int
    classes: frozenset[str]  # object and receptacle classes present in the scene
    receptacles: tuple[tuple[str, str, tuple[float, float, int, int]], ...]  # (ALFRED id, class, pose)
    floor: tuple[tuple[float, float], ...]  # reachable (x, z) points


@functools.cache
def load_scene(floorplan: int) -> Scene:
    layouts = resources.files(alfworld) / "gen" / "layouts"
    classes = frozenset(json.loads((layouts / f"FloorPlan{floorplan}-objects.json").read_text()))
    poses = json.loads((layouts / f"FloorPlan{floorplan}-openable.json").read_text())
    receptacles = tuple(
        (alfred_id, receptacle_class(alfred_id), (x, z, int(rotation), int(horizon)))
        for alfred_id, (x, z, rotation, horizon) in sorted(poses.items())
        if receptacle_class(alfred_id) in RECEPTACLE_TYPES
    )
    with (layouts / f"FloorPlan{floorplan}-layout.npy").open("rb") as f:
        floor = tuple((float(x), float(z)) for x, z in np.load(f))
    return Scene(floorplan, classes, receptacles, floor)


def receptacle_class(alfred_id: str) -> str:
    """"Cabinet|+00.68|+00.50|-02.20" -> "Cabinet"; "Sink|-01.90|+00.97|-01.50|SinkBasin" -> "SinkBasin"."""
    parts = alfred_id.split("|")
    return parts[4] if len(parts) == 5 else parts[0]


def pddl_name(alfred_name: str) -> str:
    """ALFRED's id spelling in PDDL, as alfworld's Demangler undoes it: "Apple|-00.14" -> "Apple_bar__minus_00_dot_14"."""
    for text, word in (("|", "_bar_"), ("-", "_minus_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        alfred_name = alfred_name.replace(text, word)
    return alfred_name


def location_name(x: float, z: float, rotation: int, horizon: int) -> str:
    return pddl_name(f"loc|{round(x / GRID_STEP_M)}|{round(z / GRID_STEP_M)}|{rotation // 90}|{horizon}")


# ---- one game --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Game:
    trial_id: str
    task_type: str
    floorplan: int
    target: str  # object class
    parent: str  # receptacle class ("" for look_at_obj_in_light)
    toggle: str  # LAMP for look_at_obj_in_light, else ""
    sentence: str
    start: str  # the agent's start location (no receptacle there)
    receptacles: tuple[Placed, ...]
    objects: tuple[tuple[Placed, str], ...]  # (object, PDDL id of the receptacle it is in)

    @property
    def task_dir(self) -> str:
        return f"{self.task_type}-{self.target}-None-{self.parent or self.toggle}-{self.floorplan}"


class _Room:
    """Builds one room's instances: unique ids, one location per receptacle."""

    def __init__(self, rng: random.Random, scene: Scene) -> None:
        self.rng, self.scene = rng, scene
        self.receptacles: list[Placed] = []
        self.objects: list[tuple[Placed, str]] = []
        self._ids: set[str] = set()
        self._locations: set[str] = set()
        self._unused = list(scene.receptacles)

    def add_receptacle(self, cls: str) -> Placed:
        """An instance of `cls`: one of the scene's own when it has one left, else a new one on its floor."""
        own = [i for i, (_, unused_cls, _) in enumerate(self._unused) if unused_cls == cls]
        if own:
            alfred_id, _, (x, z, rotation, horizon) = self._unused.pop(self.rng.choice(own))
        else:
            x, z = self.rng.choice(self.scene.floor)
            rotation, horizon = 90 * self.rng.randrange(4), self.rng.choice(HORIZONS)
            alfred_id = self._new_id(cls, x, z)
        receptacle = Placed(pddl_name(alfred_id), cls, self._free_location(x, z, rotation, horizon))
        self._ids.add(receptacle.pddl_id)
        self.receptacles.append(receptacle)
        return receptacle

    def add_object(self, cls: str, receptacle: Placed) -> None:
        x, z = self.rng.choice(self.scene.floor)
        obj = Placed(pddl_name(self._new_id(cls, x, z)), cls, receptacle.location)
        self._ids.add(obj.pddl_id)
        self.objects.append((obj, receptacle.pddl_id))

    def receptacle_classes_left(self) -> list[str]:
        return sorted({cls for _, cls, _ in self._unused})

    def free_floor_location(self) -> str:
        x, z = self.rng.choice(self.scene.floor)
        return self._free_location(x, z, 90 * self.rng.randrange(4), self.rng.choice(HORIZONS))

    def _new_id(self, cls: str, x: float, z: float) -> str:
        while True:
            y = self.rng.uniform(0.0, 2.0)
            position = f"{x + self.rng.uniform(-0.4, 0.4):+06.2f}|{y:+06.2f}|{z + self.rng.uniform(-0.4, 0.4):+06.2f}"
            # ALFRED names a basin after its fixture ("Sink|...|SinkBasin"); the demangler relies on it.
            alfred_id = f"{cls.removesuffix('Basin')}|{position}|{cls}" if cls.endswith("Basin") else f"{cls}|{position}"
            if pddl_name(alfred_id) not in self._ids:
                return alfred_id

    def _free_location(self, x: float, z: float, rotation: int, horizon: int) -> str:
        # Location names are never shown; they only need to be distinct, one receptacle each.
        name = location_name(x, z, rotation, horizon)
        while name in self._locations:
            horizon += 5
            name = location_name(x, z, rotation, horizon)
        self._locations.add(name)
        return name


def scene_receptacle_classes(scene: Scene) -> frozenset[str]:
    return frozenset(cls for _, cls, _ in scene.receptacles) | (scene.classes & RECEPTACLE_TYPES)


def task_choices(task_type: str, scene: Scene) -> list[tuple[str, str]]:
    """Every (target class, parent class) the scene allows for the task; parent "" for look_at_obj_in_light."""
    targets = scene.classes & PICKUPABLE
    if task_type in TARGET_ACTION_CLASS:
        targets &= frozenset(constants.VAL_ACTION_OBJECTS[TARGET_ACTION_CLASS[task_type]])
    receptacles = scene_receptacle_classes(scene)
    if task_type == "look_at_obj_in_light":
        has_lamp = LAMP in scene.classes and receptacles & LAMP_HOLDERS
        return [(target, "") for target in sorted(targets)] if has_lamp else []
    appliance = APPLIANCE.get(task_type, "")
    if appliance and appliance not in receptacles:
        return []
    return [(target, parent) for target in sorted(targets) for parent in sorted(receptacles - {appliance})
            # the target must fit its destination, and somewhere else to start from
            if target in FITS_IN[parent] and any(target in FITS_IN[r] for r in receptacles - {parent})]


def sample_game(task_type: str, rng: random.Random, size: GameSize, trial_id: str) -> Game:
    """A random room for the task, from a random scene that allows it."""
    rooms = sorted(constants.GOALS_VALID[task_type])
    while True:
        scene = load_scene(rng.choice(list(constants.SCENE_TYPE[rng.choice(rooms)])))
        choices = task_choices(task_type, scene)
        if choices:
            break
    target, parent = rng.choice(choices)
    room = _Room(rng, scene)
    toggle = LAMP if task_type == "look_at_obj_in_light" else ""
    receptacle_classes = scene_receptacle_classes(scene)

    # The task's own receptacles first: destination, appliance, somewhere for the lamp and the target.
    if parent:
        room.add_receptacle(parent)
    if task_type in APPLIANCE:
        room.add_receptacle(APPLIANCE[task_type])
    if toggle:
        room.add_object(LAMP, room.add_receptacle(rng.choice(sorted(LAMP_HOLDERS & receptacle_classes))))
    source_classes = sorted(cls for cls in receptacle_classes if cls != parent and target in FITS_IN[cls])
    if task_type == "pick_two_obj_and_place":
        # alfworld 0.4.2's expert misses its own first `move` (it listens for "put") and then searches
        # only where it took the first object, so it wins pick-two only when the second lies there too
        # (research/alfworld.md: 24/41 official pick-two games). Games it loses are discarded, so both
        # targets start together, on an open receptacle, where it can find them.
        source_classes = [cls for cls in source_classes if cls not in OPENABLE] or source_classes
    source = room.add_receptacle(rng.choice(source_classes))
    for _ in range(rng.randint(*size.receptacles) - len(room.receptacles)):
        room.add_receptacle(rng.choice(room.receptacle_classes_left() or sorted(receptacle_classes)))

    n_targets = rng.randint(*size.targets)
    if task_type == "pick_two_obj_and_place":
        for _ in range(max(n_targets, 2)):
            room.add_object(target, source)
    else:
        starts = [r for r in room.receptacles if r.cls != parent and target in FITS_IN[r.cls]]
        for _ in range(n_targets):
            room.add_object(target, rng.choice(starts))
    distractor_classes = sorted(cls for cls in scene.classes & PICKUPABLE - {target}
                                if any(cls in FITS_IN[r.cls] for r in room.receptacles))
    for _ in range(rng.randint(*size.distractors) if distractor_classes else 0):
        cls = rng.choice(distractor_classes)
        room.add_object(cls, rng.choice([r for r in room.receptacles if cls in FITS_IN[r.cls]]))

    template = rng.choice(goal_library.gdict[task_type]["templates"])
    sentence = template.format(obj=target.lower(), recep=parent.lower(), toggle=toggle.lower(), mrecep="")
    return Game(trial_id, task_type, scene.floorplan, target, parent, toggle, sentence,
                room.free_floor_location(), tuple(room.receptacles), tuple(room.objects))


# ---- files -----------------------------------------------------------------------------------------

def pddl_problem(game: Game) -> str:
    """The game as a PDDL problem of alfworld's `alfred` domain, in the shape of the official files."""
    locations = sorted({game.start} | {r.location for r in game.receptacles})
    declarations = (
        ["agent1 - agent"]
        + [f"{cls}Type - otype" for cls in sorted(OBJECT_TYPES)]  # all of them: the domain names some
        + [f"{cls}Type - rtype" for cls in sorted(RECEPTACLE_TYPES)]
        + [f"{obj.pddl_id} - object" for obj, _ in game.objects]
        + [f"{r.pddl_id} - receptacle" for r in game.receptacles]
        + [f"{location} - location" for location in locations]
    )
    facts = [f"(atLocation agent1 {game.start})"]
    for r in game.receptacles:
        facts += [f"(receptacleType {r.pddl_id} {r.cls}Type)", f"(receptacleAtLocation {r.pddl_id} {r.location})"]
        facts += [f"(openable {r.pddl_id})"] * (r.cls in OPENABLE)
    for rtype in sorted({r.cls for r in game.receptacles}):
        facts += [f"(canContain {rtype}Type {otype}Type)" for otype in sorted(FITS_IN[rtype])]
    for obj, receptacle_id in game.objects:
        facts += [f"(objectType {obj.pddl_id} {obj.cls}Type)", f"(inReceptacle {obj.pddl_id} {receptacle_id})",
                  f"(objectAtLocation {obj.pddl_id} {obj.location})"]
        facts += [f"(pickupable {obj.pddl_id})"] * (obj.cls in PICKUPABLE)
        facts += [f"(isReceptacleObject {obj.pddl_id})"] * (obj.cls in constants.MOVABLE_RECEPTACLES_SET)
        facts += [f"({prop} {obj.pddl_id})" for action_class, prop in PROPERTY_OF_ACTION_CLASS.items()
                  if obj.cls in constants.VAL_ACTION_OBJECTS[action_class]]
    goal = goal_library.gdict[game.task_type]["pddl"].format(
        obj=game.target, recep=game.parent, toggle=game.toggle, mrecep="").replace("#", "-")
    lines = "\n        ".join
    # The goal template closes the `define`.
    return (f"\n(define (problem plan_{game.trial_id})\n(:domain alfred)\n(:objects\n        {lines(declarations)}\n        )\n"
            f"    (:init\n        {lines(facts)}\n        )\n{goal}")


def traj_data(game: Game, seed: int) -> dict:
    """The traj_data.json fields upstream reads (task_type, pddl_params, turk_annotations), plus provenance."""
    return {
        "task_id": game.trial_id,
        "task_type": game.task_type,
        "pddl_params": {"object_target": game.target, "parent_target": game.parent, "toggle_target": game.toggle,
                        "mrecep_target": "", "object_sliced": False},
        "turk_annotations": {"anns": [{"task_desc": game.sentence[0].upper() + game.sentence[1:] + "."}]},
        "scene": {"floor_plan": f"FloorPlan{game.floorplan}", "scene_num": game.floorplan, "random_seed": seed},
        "generator": {"name": "limen", "version": GENERATOR_VERSION},
    }


@functools.cache
def _wheel_file(name: str) -> str:
    return (resources.files(alfworld) / "data" / name).read_text()


def game_file_data(game: Game, walkthrough: list[str] | None) -> dict:
    return {
        "pddl_domain": _wheel_file("alfred.pddl"),
        "grammar": _wheel_file("alfred.twl2").replace("UNKNOWN GOAL", game.sentence),
        "pddl_problem": pddl_problem(game),
        "solvable": walkthrough is not None,
        "walkthrough": walkthrough,
    }


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
