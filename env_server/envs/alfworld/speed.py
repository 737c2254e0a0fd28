"""Process-wide caches that make TextWorld's PDDL engine fast without changing a byte of its output.

Upstream re-does pure work on every reset and step: it translates the game's PDDL to SAS four times per
reset (twice in `load`, twice in `reset`), re-parses the shared grammar for every game, re-parses every
grammar rule with tatsu on every step (docs/DESIGN.md#alfworld-step-cost), and deep-copies the derivation context
for every symbol it derives. Each patch below drops a repetition of pure work; `install()` applies them
once per process. They reach into textworld internals, hence the version pins. Memory is bounded too:
every cache here has a size, and `forget_interned_facts` bounds textworld's own intern table.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import sys

import fast_downward
import mementos.core
import textworld
from textworld.envs.pddl import textgen
from textworld.envs.pddl.logic import GameLogic
from textworld.logic import Rule

PINNED_TEXTWORLD = "1.7.0"
# Games whose SAS translation a process keeps (~1.5 MiB each): the games its live sessions replay or
# repeat, bounded so that a worker cycling through thousands of games keeps a flat memory.
TRANSLATIONS_KEPT = 16
# Grammar rules and queries are a finite set per grammar, plus one task sentence per game.
PARSES_KEPT = 8192
# Facts textworld keeps interned (~1,800 new ones per official game, ~0.5 KiB each) before it forgets them.
INTERNED_FACTS_KEPT = 50_000

_upstream_pddl2sas = fast_downward.pddl2sas
_upstream_parse_symbols = textgen._parse_and_convert
_upstream_parse_query = Rule.parse_conjunctive_query
_installed = False


def install() -> None:
    """Apply the patches (idempotent). Call before building any engine."""
    global _installed
    if _installed:
        return
    if textworld.__version__ != PINNED_TEXTWORLD:
        raise RuntimeError(
            f"env_server.envs.alfworld.speed patches textworld {PINNED_TEXTWORLD} internals, "
            f"but textworld {textworld.__version__} is installed"
        )
    fast_downward.pddl2sas = _pddl2sas_for_play
    textgen._parse_and_convert = _parse_symbols
    textgen.copy_context = _copy_context
    Rule.parse_conjunctive_query = classmethod(lambda cls, expr: _parse_query(expr))
    _installed = True


def forget_interned_facts() -> None:
    """Call between games. textworld interns every Proposition and Signature it builds in one global dict
    (mementos) and never lets go: a process loading game after game grows ~1.5 MiB per new game. They
    compare and hash by value, interned or not, so emptying the dict changes no output."""
    if len(mementos.core._memento_cache) > INTERNED_FACTS_KEPT:
        mementos.core._memento_cache.clear()


# ---- SAS translation --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=TRANSLATIONS_KEPT)
def _translate(domain: str, problem: str) -> tuple[object, str]:
    argv = sys.argv
    try:
        return _upstream_pddl2sas(domain, problem)
    finally:
        sys.argv = argv  # fast_downward overwrites sys.argv for its option parser


def _pddl2sas_for_play(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
    # PddlState translates twice: for play, and optimized for Fast Downward's replanner. Only the
    # planner expert and the walkthrough extra replan, and limen uses neither, so the replanner is
    # handed the play translation (a valid task for it too) and each game is translated once.
    # The returned task object is shared; PddlState only reads it.
    return _translate(domain, problem)


# ---- grammar parsing ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=PARSES_KEPT)
def _parsed_symbols(text: str, rule_name: str):
    return _upstream_parse_symbols(text, rule_name=rule_name)


def _parse_symbols(text: str, rule_name: str, trace: bool = False, **options):
    if trace or options:
        return _upstream_parse_symbols(text, rule_name=rule_name, trace=trace, **options)
    # Derivation assigns a context to every symbol it gets, so each caller needs its own copy.
    return copy.deepcopy(_parsed_symbols(text, rule_name))


_parse_query = functools.lru_cache(maxsize=PARSES_KEPT)(_upstream_parse_query)


def _copy_context(context: dict) -> dict:
    # Upstream deep-copies `variables` (entities) and `mapping` for every symbol derived, over half of a
    # step's time. Derivation only adds keys to these two dicts and never changes the entities or
    # variables in them, so fresh dicts over the same objects derive the same text.
    return {**context, "variables": dict(context["variables"]), "mapping": dict(context["mapping"])}


# ---- the game logic (PDDL actions + grammar) ----------------------------------------------------------

# A game's grammar is its family's grammar (alfred.twl2 as shipped with the data) with one rule, "task",
# set to the game's goal sentence. Parsing the family once and swapping that rule avoids a ~0.15 s
# tatsu parse per game.
_GOAL_PLACEHOLDER = "UNKNOWN GOAL"  # what alfworld's own alfred.twl2 says before a game fills it in
_TASK_RULE = re.compile(r'"task"\s*:\s*\[\s*\{\s*"rhs"\s*:\s*"((?:[^"\\]|\\.)*)"')


def game_logic(domain: str, grammar: str) -> GameLogic:
    """The parsed logic of a game: equal to GameLogic(domain, grammar), built mostly from cache."""
    match = _TASK_RULE.search(grammar)
    if match is None:
        return _family_logic(domain, grammar)
    family = _family_logic(domain, grammar[: match.start(1)] + _GOAL_PLACEHOLDER + grammar[match.end(1):])
    task_rule = textgen.ContextSensitiveGrammar.parse(json.dumps({"task": [{"rhs": json.loads(f'"{match.group(1)}"')}]}))
    logic = copy.copy(family)
    logic.grammar = textgen.ContextSensitiveGrammar()
    logic.grammar.update(family.grammar)
    logic.grammar._rules["task"] = task_rule._rules["task"]
    return logic


@functools.lru_cache(maxsize=8)
def _family_logic(domain: str, grammar: str) -> GameLogic:
    return GameLogic(domain=domain, grammar=grammar)
