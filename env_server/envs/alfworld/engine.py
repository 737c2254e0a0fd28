"""The ALFWorld game engine limen plays: TextWorld's PddlEnv and ALFWorld's handcoded expert, reused.

Output is upstream's, byte for byte: the same PddlEnv, demangler and expert code run; only pure work is
cached (speed.py). Two things differ on purpose. Engines are pooled per process, because every new
PddlEnv maps a private 34 MB copy of libdownward that is never unloaded (docs/DESIGN.md#alfworld-libdownward-per-pddlenv). And
the expert runs in every mode with a random stream of its own per episode, so sessions interleaved in one
process stay deterministic.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import textworld
from alfworld.agents.expert import HandCodedTWAgent
from alfworld.agents.expert.handcoded_expert import HandCodedAgentTimeout
from alfworld.agents.utils.misc import Demangler
from textworld.envs.pddl import logic as pddl_logic
from textworld.envs.pddl.pddl import PddlEnv

from env_server.envs.alfworld import speed

# Upstream's AlfredExpert builds HandCodedTWAgent(max_steps=200): past that many steps it gives up.
EXPERT_MAX_STEPS = 200
# Before its first step the expert has only seen the room; upstream's first expert plan is "look".
EXPERT_FIRST_ACTION = "look"


class _CachedPddlEnv(PddlEnv):
    """PddlEnv whose `load` takes the parsed logic from speed.game_logic and names entities as ALFWorld does."""

    def load(self, game_file: str) -> None:
        data = json.loads(Path(game_file).read_text())
        self._game_file = game_file
        self._game_data = data
        self.walkthrough = data.get("walkthrough")
        self._logic = speed.game_logic(data["pddl_domain"], data["grammar"])
        self._pddl_state = pddl_logic.PddlState(self.downward_lib, data["pddl_problem"], self._logic)
        self._entity_infos = self._get_entity_infos()
        # What alfworld's AlfredDemangler wrapper does on load (without shuffling, as in its eval modes).
        demangler = Demangler(game_infos=self._entity_infos, shuffle=False)
        for info in self._entity_infos.values():
            info.name = demangler.demangle_alfred_name(info.id)


class Engine:
    """One PddlEnv (one libdownward copy) that plays game after game. Borrow it from `ENGINES`."""

    def __init__(self) -> None:
        speed.install()
        # "facts" feeds the handcoded expert, as upstream's AlfredExpert requests it.
        self._env = _CachedPddlEnv(textworld.EnvInfos(won=True, admissible_commands=True, facts=True))
        self._loaded: Path | None = None

    def start(self, game_file: Path) -> textworld.GameState:
        """The initial state of `game_file` (loaded only when it is not the game already loaded)."""
        if game_file != self._loaded:
            self._loaded = None  # a failed load leaves nothing half-loaded behind
            speed.forget_interned_facts()
            self._env.load(str(game_file))
            self._loaded = game_file
        return self._env.reset()

    def step(self, command: str) -> textworld.GameState:
        state, _score, _done = self._env.step(command)
        return state


class EnginePool:
    """Engines kept by a process: as many as its sessions ever played at once, then no more."""

    def __init__(self) -> None:
        self._idle: list[Engine] = []
        self._lock = threading.Lock()
        self.created = 0

    def acquire(self) -> Engine:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.created += 1
        return Engine()

    def release(self, engine: Engine) -> None:
        with self._lock:
            self._idle.append(engine)


ENGINES = EnginePool()


class Expert:
    """ALFWorld's handcoded expert, fed each state as upstream's AlfredExpert wrapper feeds it.

    It suggests an action in every state (upstream only does in train + dagger mode). It draws from
    Python's global `random`; here that stream belongs to the episode: seeded by the episode seed,
    swapped in around each call, so interleaved sessions do not disturb each other.
    """

    def __init__(self, game_file: Path, seed: int) -> None:
        self._agent = HandCodedTWAgent(max_steps=EXPERT_MAX_STEPS)
        self._agent.reset(str(game_file))  # reads traj_data.json beside the game
        self._random_state = random.Random(seed).getstate()
        self._gave_up = False

    def next_action(self, state: textworld.GameState, last_command: str) -> str | None:
        """The expert's action in `state`, reached by `last_command` ("" at the start); None once it gave up."""
        if self._gave_up:
            return None
        if not last_command:
            self._agent.observe(state["feedback"])
            return EXPERT_FIRST_ACTION
        with self._own_random():
            try:
                action = self._agent.act(state, 0, state["won"], last_command)
            except HandCodedAgentTimeout:
                # Upstream raises here and the game dies; limen keeps the game and drops the advice.
                self._gave_up = True
                return None
        # Upstream's fallback when the expert names a command the game would not accept.
        return action if action in state["admissible_commands"] else EXPERT_FIRST_ACTION

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outer)
