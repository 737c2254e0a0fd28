"""AlfWorldEnv: the real ALFWorld text game as a limen TextEnv, on official or generated games.

Games come from ALFWORLD_DATA (official layout, json_2.1.1/<split>/...); with none there, from splits
that generate.py makes once and caches (gen_train, gen_test), so the env works on a bare machine.
Observations, rewards and ends are upstream AlfredTWEnv's; `info["expert_action"]` is the handcoded
expert's next action in every state of a running episode.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from env_server.envs.alfworld import generate
from env_server.envs.alfworld.engine import ENGINES, Engine, Expert
from env_server.envs.alfworld.games import SPLIT_ROOT, GameSplit, read_splits
from env_server.envs.base import Split, StepResult, Task, TextEnv

# Listed by the game but not a move: it prints the command list. verl-agent drops it from prompts too.
HIDDEN_COMMANDS = frozenset({"help"})
_TASK_PREFIX = "Your task is to: "


@dataclass(frozen=True)
class AlfWorldConfig:
    data_dir: str | None = None
    """Folder holding json_2.1.1/<split>/ (the official layout); None reads ALFWORLD_DATA."""
    generated: bool | None = None
    """Serve the generated splits (gen_train, gen_test and gen_val when asked for); None serves them only when there
    is no data."""
    size: str = "small"
    """Generated game size: one of generate.SIZES (small, medium, full)."""
    gen_train_games: int = 240
    gen_test_games: int = 60
    gen_val_games: int = 0
    """Games of gen_val, the split tuning looks at (gen_test stays for the final runs); 0 serves no gen_val, which
    keeps the cache folder of configs made before it existed."""
    gen_seed: int = 0
    """Seed of gen_train; gen_test uses gen_seed + 1 and gen_val gen_seed + 2."""
    cache_dir: str | None = None
    """Where generated splits live; None: $LIMEN_CACHE/alfworld, else ~/.cache/limen/alfworld."""

    def __post_init__(self) -> None:
        if self.size not in generate.SIZES:
            raise ValueError(f"size must be one of {sorted(generate.SIZES)}, got {self.size!r}")
        if self.gen_train_games < 1 or self.gen_test_games < 1:
            raise ValueError("gen_train_games and gen_test_games must be >= 1")
        if self.gen_val_games < 0:
            raise ValueError(f"gen_val_games must be >= 0, got {self.gen_val_games}")

    def official_root(self) -> Path | None:
        data_dir = self.data_dir if self.data_dir is not None else os.environ.get("ALFWORLD_DATA", "")
        return Path(data_dir) if data_dir and (Path(data_dir) / SPLIT_ROOT).is_dir() else None

    def serves_generated(self) -> bool:
        return self.generated if self.generated is not None else self.official_root() is None

    def generated_splits(self) -> dict[str, generate.SplitSpec]:
        splits = {
            "gen_train": generate.SplitSpec(self.gen_train_games, self.gen_seed, self.size),
            "gen_test": generate.SplitSpec(self.gen_test_games, self.gen_seed + 1, self.size),
        }
        if self.gen_val_games:
            splits["gen_val"] = generate.SplitSpec(self.gen_val_games, self.gen_seed + 2, self.size)
        return splits

    def split_names(self) -> set[str]:
        """The splits an env with this config serves, told from folder names alone (no game read or generated)."""
        root = self.official_root()
        official = {p.name for p in (root / SPLIT_ROOT).iterdir() if p.is_dir()} if root else set()
        return official | (set(self.generated_splits()) if self.serves_generated() else set())

    def cache_root(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir)
        limen_cache = os.environ.get("LIMEN_CACHE")
        return Path(limen_cache) / "alfworld" if limen_cache else Path.home() / ".cache" / "limen" / "alfworld"


class AlfWorldEnv(TextEnv):
    name = "alfworld"
    code_version = "alfworld-0.4.2+limen-1"
    default_max_turns = 50

    def __init__(self, **config) -> None:
        super().__init__()
        self.config = AlfWorldConfig(**config)
        self._official_root = self.config.official_root()
        serve_generated = self.config.serves_generated()
        if not serve_generated and self._official_root is None:
            raise ValueError("alfworld: no games to serve: no official data (data_dir / ALFWORLD_DATA) and generated=False")
        self._generated = self.config.generated_splits() if serve_generated else {}
        self._engine: Engine | None = None
        self._expert: Expert | None = None
        self._task: Task | None = None
        self._instruction = ""

    # ---- the games ---------------------------------------------------------------------------------
    def _game_splits(self) -> dict[str, GameSplit]:
        roots = [self._official_root] if self._official_root else []
        if self._generated:
            roots.append(generate.generated_root(self.config.cache_root(), self._generated))
        return _splits_of(tuple(roots))

    def splits(self) -> dict[str, Split]:
        return {name: game_split.split for name, game_split in self._game_splits().items()}

    def data_hash(self) -> str:
        return _digest_of(tuple(sorted((name, s.digest) for name, s in self._game_splits().items())))

    def game_file(self, split: str, task_id: str) -> Path:
        """The game.tw-pddl a playable task plays (raises UnknownSplit / UnknownTask / TaskExcluded)."""
        self.task(split, task_id)  # the lookup and its errors
        return self._game_splits()[split].game_files[task_id]

    # ---- episode -----------------------------------------------------------------------------------
    def _reset(self, split: str, task: Task, seed: int, options: dict[str, str]) -> StepResult:
        game_file = self._game_splits()[split].game_files[task.task_id]
        if self._engine is None:
            self._engine = ENGINES.acquire()
        state = self._engine.start(game_file)
        self._task = task
        self._expert = Expert(game_file, seed)
        self._instruction = instruction_of(state["feedback"])
        return self._result(state, last_command="")

    def _step(self, action: str) -> StepResult:
        return self._result(self._engine.step(action), last_command=action)

    def close(self) -> None:
        if self._engine is not None:
            ENGINES.release(self._engine)
        self._engine = None
        self._expert = None

    def _result(self, state, last_command: str) -> StepResult:
        won = bool(state["won"])
        reward = float(state.get("score", 0))
        expert_action = None if won else self._expert.next_action(state, last_command)
        return StepResult(
            observation=state["feedback"],
            admissible_actions=[c for c in state["admissible_commands"] if c not in HIDDEN_COMMANDS],
            instruction=self._instruction,
            task_id=self._task.task_id,
            task_category=self._task.category,
            reward=reward,
            terminated=won,  # upstream's `lost` is always False: a game ends only when won
            won=won,
            score=reward,
            info={} if expert_action is None else {"expert_action": expert_action},
        )


def instruction_of(intro: str) -> str:
    """"... Your task is to: put a clean mug in coffeemachine." -> "put a clean mug in coffeemachine"."""
    _, found, task = intro.rpartition(_TASK_PREFIX)
    if not found:
        raise ValueError(f"the game's first observation states no task: {intro[-200:]!r}")
    return task.strip().removesuffix(".")


@functools.cache
def _splits_of(roots: tuple[Path, ...]) -> dict[str, GameSplit]:
    splits: dict[str, GameSplit] = {}
    for root in roots:
        for name, game_split in read_splits(root).items():
            if name in splits:
                raise ValueError(f"alfworld: split {name!r} is in more than one data folder: {roots}")
            splits[name] = game_split
    return splits


@functools.cache
def _digest_of(split_digests: tuple[tuple[str, str], ...]) -> str:
    return hashlib.sha256(repr(split_digests).encode()).hexdigest()
