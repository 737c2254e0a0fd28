"""A tiny deterministic text world for tests, the conformance suite and fast learning checks.

Rooms sit on a line; the agent walks between neighbours, takes and drops objects. Three task
categories need 1-10 turns each, the only reward is 1.0 at success, and a step costs microseconds.
Every task's rooms keep the order of ROOMS (a task leaves some out) and a fetch task names the room its object
starts in, so the expert's choices depend only on what the agent can know, and a learner can match them.
`info["expert_action"]` gives a shortest-path next action, as the ALFWorld env does.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache

from env_server.envs.base import Split, StepResult, Task, TextEnv
from env_server.envs.datasets import OfflineSplits

ROOMS = ("hall", "kitchen", "garden", "cellar", "attic", "study", "porch")
OBJECTS = ("key", "apple", "coin", "lamp", "book", "cup")
CATEGORIES = ("goto", "fetch", "switch")
SPLIT_SIZES = {"train": 120, "test": 40, "valid": 40}   # valid: for tuning, so that test is looked at last
# What a trainer's dry run checks its splits against (registry.ENV_SPLITS): generated, so always these.
OFFLINE_SPLITS = OfflineSplits(frozenset(SPLIT_SIZES))


@dataclass(frozen=True)
class ToyTask:
    rooms: tuple[str, ...]                  # the line of rooms, in order
    objects: tuple[tuple[str, str], ...]    # (object, room it starts in)
    category: str
    target_object: str                      # "" for goto
    target_room: str


def _instruction(t: ToyTask) -> str:
    if t.category == "goto":
        return f"go to the {t.target_room}"
    if t.category == "fetch":
        # Where the object starts is named: otherwise the expert would walk straight to a room the agent
        # cannot know, and imitating it would be guessing.
        return f"put the {t.target_object} from the {dict(t.objects)[t.target_object]} in the {t.target_room}"
    return f"turn on the lamp in the {t.target_room}"


def _make_task(rng: random.Random, category: str) -> ToyTask:
    # In ROOMS order: with rooms shuffled per task the expert's direction would be a coin flip to the agent.
    present = set(rng.sample(ROOMS, rng.randint(3, 5)))
    rooms = tuple(room for room in ROOMS if room in present)
    n_objects = rng.randint(1, 3)
    objects = [(o, rng.choice(rooms)) for o in rng.sample([o for o in OBJECTS if o != "lamp"], n_objects)]
    target_object = ""
    if category == "fetch":
        target_object = objects[0][0]
        target_room = rng.choice([r for r in rooms if r != objects[0][1]])
    else:
        target_room = rng.choice(rooms)
        if category == "switch":
            objects.append(("lamp", target_room))
    return ToyTask(rooms, tuple(objects), category, target_object, target_room)


@lru_cache(maxsize=None)
def _split_tasks(split: str) -> dict[str, ToyTask]:
    # Seeded by the split name only, so task ids mean the same world on every machine.
    rng = random.Random(int.from_bytes(hashlib.sha256(split.encode()).digest()[:8], "big"))
    tasks = {}
    for i in range(SPLIT_SIZES[split]):
        category = CATEGORIES[i % len(CATEGORIES)]
        tasks[f"{category}-{i:03d}"] = _make_task(rng, category)
    return tasks


class ToyEnv(TextEnv):
    name = "toy"
    code_version = "toy-4"
    default_max_turns = 15

    def __init__(self) -> None:
        super().__init__()
        self._task: ToyTask | None = None
        self._meta: Task | None = None

    def splits(self) -> dict[str, Split]:
        return {
            name: Split(name, tuple(Task(tid, t.category) for tid, t in _split_tasks(name).items()),
                        description=f"{len(_split_tasks(name))} generated toy tasks")
            for name in SPLIT_SIZES
        }

    def data_hash(self) -> str:
        return hashlib.sha256(repr(sorted(SPLIT_SIZES.items())).encode() + self.code_version.encode()).hexdigest()

    # ---- episode ----------------------------------------------------------------------------------
    def _reset(self, split: str, task: Task, seed: int, options: dict[str, str]) -> StepResult:
        self._task = t = _split_tasks(split)[task.task_id]
        self._meta = task
        self._rng = random.Random(seed)
        # A goto task never starts in its target room: that episode would be won by any reply, junk included,
        # and RL would learn to reward junk.
        starts = [r for r in t.rooms if not (t.category == "goto" and r == t.target_room)]
        self._room = self._rng.choice(starts)
        self._where = dict(t.objects)          # object -> room, or "agent" when carried
        self._lamp_on = False
        return self._result(f"You are in the {self._room}. Your task is to: {_instruction(t)}.")

    def _step(self, action: str) -> StepResult:
        t, act = self._task, action.strip().lower()
        if act.startswith("go to ") and act[6:] in self._exits():
            self._room = act[6:]
            feedback = f"You arrive at the {self._room}."
        elif act.startswith("take ") and self._where.get(act[5:]) == self._room and act[5:] != "lamp":
            self._where[act[5:]] = "agent"
            feedback = f"You take the {act[5:]}."
        elif act.startswith("drop ") and self._where.get(act[5:]) == "agent":
            self._where[act[5:]] = self._room
            feedback = f"You drop the {act[5:]}."
        elif act == "turn on lamp" and self._where.get("lamp") == self._room:
            self._lamp_on = True
            feedback = "The lamp is now on."
        elif act == "look":
            feedback = f"You are in the {self._room}."
        elif act == "inventory":
            carried = [o for o, w in self._where.items() if w == "agent"]
            feedback = f"You carry: {', '.join(carried)}." if carried else "You carry nothing."
        else:
            feedback = "Nothing happens."
        won = (
            (t.category == "goto" and self._room == t.target_room)
            or (t.category == "fetch" and self._where.get(t.target_object) == t.target_room)
            or (t.category == "switch" and self._lamp_on)
        )
        return self._result(feedback, won)

    # ---- helpers ----------------------------------------------------------------------------------
    def _exits(self) -> list[str]:
        i = self._task.rooms.index(self._room)
        return [self._task.rooms[j] for j in (i - 1, i + 1) if 0 <= j < len(self._task.rooms)]

    def _admissible(self) -> list[str]:
        here = sorted(o for o, w in self._where.items() if w == self._room)
        carried = sorted(o for o, w in self._where.items() if w == "agent")
        actions = [f"go to {r}" for r in self._exits()]
        actions += [f"take {o}" for o in here if o != "lamp"] + [f"drop {o}" for o in carried]
        actions += ["turn on lamp"] * ("lamp" in here) + ["look", "inventory"]
        self._rng.shuffle(actions)
        return actions

    def _expert(self) -> str:
        t = self._task

        def walk(to: str) -> str:
            i, j = t.rooms.index(self._room), t.rooms.index(to)
            return f"go to {t.rooms[i + (1 if j > i else -1)]}"

        if t.category == "goto":
            return walk(t.target_room)
        if t.category == "switch":
            return "turn on lamp" if self._room == t.target_room else walk(t.target_room)
        where = self._where[t.target_object]
        if where == "agent":
            return f"drop {t.target_object}" if self._room == t.target_room else walk(t.target_room)
        return f"take {t.target_object}" if self._room == where else walk(where)

    def _result(self, feedback: str, won: bool = False) -> StepResult:
        here = [o for o, w in self._where.items() if w == self._room]
        seen = f" You see: {', '.join(sorted(here))}." if here else ""
        exits = f" Exits: {', '.join(self._exits())}."
        info = {} if won else {"expert_action": self._expert()}
        return StepResult(
            observation=feedback + seen + exits,
            admissible_actions=self._admissible(),
            instruction=_instruction(self._task),
            task_id=self._meta.task_id,
            task_category=self._task.category,
            reward=1.0 if won else 0.0,
            terminated=won,
            won=won,
            score=1.0 if won else 0.0,
            info=info,
        )
