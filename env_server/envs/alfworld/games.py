"""ALFWorld games on disk: every folder under <root>/json_2.1.1 is a split, every trial folder in it a task.

Task ids are trial folders relative to their split (`<task_type>-<Object>-<Recep>-<Parent>-<Scene>/<trial>`),
the official layout. A trial AlfredTWEnv would skip is still listed, with the reason it is skipped.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from env_server.envs.base import Split, Task

SPLIT_ROOT = "json_2.1.1"
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
# Written by generate.py beside the games it makes; describes the split.
MANIFEST_FILE = "generation.json"

# The six ALFWorld task types, by the short names verl-agent reports success under.
CATEGORY_OF_TASK_TYPE = {
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick2",
}
TASK_TYPE_OF_CATEGORY = {category: task_type for task_type, category in CATEGORY_OF_TASK_TYPE.items()}


@dataclass(frozen=True)
class GameSplit:
    split: Split
    game_files: Mapping[str, Path]  # task id -> game.tw-pddl, playable tasks only
    digest: str  # sha256 over every task id and game file; changes when any game does


def task_type_of(task_id: str) -> str:
    """`pick_two_obj_and_place-Pen-None-Desk-310/trial_...` -> `pick_two_obj_and_place`."""
    return task_id.split("-", 1)[0]


def read_splits(root: Path) -> dict[str, GameSplit]:
    """Every split under `root` (a folder holding json_2.1.1/), by name; {} when there is none."""
    split_root = root / SPLIT_ROOT
    if not split_root.is_dir():
        return {}
    return {path.name: read_split(path) for path in sorted(split_root.iterdir()) if path.is_dir()}


@functools.cache
def read_split(split_dir: Path) -> GameSplit:
    """The split's tasks in sorted id order. Cached per process: a worker reads each split once."""
    tasks, game_files = [], {}
    digest = hashlib.sha256()
    for trial in sorted(path for path in split_dir.glob("*/*") if path.is_dir()):
        task_id = trial.relative_to(split_dir).as_posix()
        task_type = task_type_of(task_id)
        game_file = trial / GAME_FILE
        game_bytes = game_file.read_bytes() if game_file.is_file() else b""
        reason = exclusion_reason(task_id, game_bytes, (trial / TRAJ_FILE).is_file())
        tasks.append(Task(task_id, CATEGORY_OF_TASK_TYPE.get(task_type, task_type), reason))
        digest.update(f"{task_id}\0{hashlib.sha256(game_bytes).hexdigest()}\n".encode())
        if not reason:
            game_files[task_id] = game_file
    manifest = split_dir / MANIFEST_FILE
    description = (json.loads(manifest.read_text())["description"] if manifest.is_file()
                   else f"ALFWorld games in {split_dir}")
    return GameSplit(Split(split_dir.name, tuple(tasks), description), game_files, digest.hexdigest())


def exclusion_reason(task_id: str, game_bytes: bytes, has_traj_data: bool) -> str:
    """Why AlfredTWEnv.collect_game_files would skip this trial ("" when it plays it), checked in its order."""
    if "movable" in task_id or "Sliced" in task_id:
        return "movable-receptacle and sliced trials are not played by the text engine"
    if not has_traj_data:
        return f"no {TRAJ_FILE}"
    if task_type_of(task_id) not in CATEGORY_OF_TASK_TYPE:
        return f"task type {task_type_of(task_id)!r} is not one of the six ALFWorld text tasks"
    if not game_bytes:
        return f"no {GAME_FILE}"
    try:
        game = json.loads(game_bytes)
    except json.JSONDecodeError as error:
        return f"{GAME_FILE} is not valid JSON ({error})"
    if "solvable" not in game:
        return f"{GAME_FILE} has no 'solvable' key"
    if not game["solvable"]:
        return f"{GAME_FILE} is marked unsolvable"
    return ""
