"""Per-env prompts and action parsing: what the policy reads each turn and how its reply becomes an action.

The structure follows the anchor protocol (verl-agent), so results compare: the task, the number of steps
taken, the last k (observation, action) pairs, the current observation, the admissible actions, then a
request to reason in <think> and answer in <action>. The wording is our own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"
_ACTION_RE = re.compile(re.escape(ACTION_OPEN) + r"(.*?)" + re.escape(ACTION_CLOSE), re.DOTALL)
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
# An invalid reply still reaches the env (which answers "Nothing happens."), cut to this many characters.
INVALID_ACTION_CHARS = 40


@dataclass(frozen=True)
class PromptConfig:
    history_turns: int = 2
    """How many past (observation, action) pairs the prompt repeats (anchor: 2)."""
    history_obs_max_words: int = 0
    """Cut each past observation to this many words (0 = keep whole); small CPU models need short prompts."""
    list_admissible: bool = True
    """Show the admissible actions (the anchor does)."""
    require_think: bool = True
    """A reply without <think>...</think> counts as format-invalid (verl-agent's rule)."""
    format_penalty: float = 0.01
    """Subtracted from a turn's reward when its reply is format-invalid (verl-agent's 0.1 on its x10 scale)."""
    unlisted_penalty: float = 0.0
    """Subtracted from a turn's reward when its action is not on the admissible list the prompt showed: a turn
    the game wastes ("Nothing happens."). A dense signal the sparse reward lacks; 0 = off, as in verl-agent.
    A listed template such as WebShop's `search[<your query>]` lists every non-empty `search[...]` (`is_listed`)."""
    example: str = ""
    """A worked example shown before the task (the ReAct-style baseline, trainer_client/prompting_baselines.py)."""
    compact: bool = False
    """Only what changes from turn to turn: the task, the past turns as `observation => action` lines, the
    current observation and the admissible actions, without the role, step counts and reply instructions.
    For a model trained from scratch, which learns nothing from fixed wording: the demo's prompts shrink by
    about a third, and every forward with them."""

    def __post_init__(self) -> None:
        if self.compact and self.example:
            raise ValueError("a compact prompt has no place for a worked example; set one of compact, example")


@dataclass(frozen=True)
class PastTurn:
    observation: str
    action: str


@dataclass(frozen=True)
class ParsedAction:
    action: str
    valid: bool


_INTROS = {
    "alfworld": "You are an expert agent acting in ALFWorld, a text-based household simulator.",
    "webshop": "You are an expert agent shopping online in the WebShop store.",
    "toy": "You are an agent moving through a small text world of rooms and objects.",
}
_GENERIC_INTRO = "You are an expert agent acting in a text environment."
_CLOSING = (
    "Think step by step about what to do next inside <think> </think>. Then choose one admissible action "
    "and write it inside <action> </action>."
)
_WEBSHOP_CLOSING = (
    "Think step by step inside <think> </think> about which admissible action brings you closest to buying "
    "what the task asks for. Then write that action inside <action> </action>."
)


def shorten(text: str, max_words: int) -> str:
    words = text.split()
    return text if max_words <= 0 or len(words) <= max_words else " ".join(words[:max_words]) + " ..."


def webshop_view(observation: str, instruction: str, compact: bool = False) -> str:
    """The page without the repeated instruction, each text part quoted (verl-agent's layout); `compact`: the
    parts lowercased and joined by " | ", so a product id reads as the action that clicks it (`click[s0001]`)
    and a title's words as the instruction's."""
    parts = observation.split(" [SEP] ")
    if instruction in parts:
        parts = parts[parts.index(instruction) + 1:]
    elif not compact:  # e.g. the done page, which does not repeat the instruction
        return observation
    return " | ".join(parts).lower() if compact else " [SEP] ".join(f"'{p}'" for p in parts)


ADMISSIBLE_HEADING = "Admissible actions: "
# The list ends its line, or its message where it is the prompt's last line (a decoded chat: `]<|im_end|>`).
_LISTED = re.compile(re.escape(ADMISSIBLE_HEADING) + r"\[(.*?)\](?:$|<\|)", re.MULTILINE | re.DOTALL)


def _format_actions(env: str, actions: Sequence[str], compact: bool) -> str:
    if env == "webshop" and not compact:
        return "[\n" + "\n".join(f"'{a}'," for a in actions) + "\n]"
    return "[" + ", ".join(f"'{a}'" for a in actions) + "]"


def listed_actions(prompt_text: str) -> list[str]:
    """The admissible actions a (decoded) prompt listed for its current turn (the last list, as `build_prompt`
    renders it); [] where it listed none."""
    lists = _LISTED.findall(prompt_text)
    return re.findall(r"'([^']*)'", lists[-1]) if lists else []


def build_prompt(
    env: str,
    instruction: str,
    observation: str,
    admissible_actions: Sequence[str],
    history: Sequence[PastTurn],
    step: int,
    cfg: PromptConfig = PromptConfig(),
) -> str:
    """The user message of turn `step` (0-based). `history` holds every past turn; the last k are shown."""
    view = (lambda o: webshop_view(o, instruction, cfg.compact)) if env == "webshop" else (lambda o: o)
    shown = list(history)[-cfg.history_turns:] if cfg.history_turns > 0 else []
    past = [(step - len(shown) + 1 + i, shorten(view(t.observation), cfg.history_obs_max_words), t.action)
            for i, t in enumerate(shown)]
    if cfg.compact:
        lines = [f"Task: {instruction}.", *(f"[{k}] {seen} => {action}" for k, seen, action in past),
                 f"Now: {view(observation)}"]
    else:
        intro, task = _INTROS.get(env, _GENERIC_INTRO), f"Your task is to: {instruction}."
        lines = [intro, cfg.example, f"Now your own task. {task}"] if cfg.example else [f"{intro} {task}"]
        if past:
            lines.append(f"You have taken {step} step(s) so far. Your last {len(past)} observation(s) and action(s):\n"
                         + "\n".join(f"[Step {k}] observation: {seen} | action: {action}" for k, seen, action in past))
        lines.append(f"You are now at step {step + 1}. Current observation: {view(observation)}")
    if cfg.list_admissible:
        lines.append(ADMISSIBLE_HEADING + _format_actions(env, admissible_actions, cfg.compact))
    if not cfg.compact:
        lines.append(_WEBSHOP_CLOSING if env == "webshop" else _CLOSING)
    return "\n".join(lines)


def parse_action(reply: str, cfg: PromptConfig = PromptConfig()) -> ParsedAction:
    """The action inside the first <action>...</action>, lowercased; format-valid as verl-agent judges it."""
    text = reply.lower()
    match = _ACTION_RE.search(text)
    has_think = THINK_OPEN in text and THINK_CLOSE in text
    valid = match is not None and (has_think or not cfg.require_think) and not _CJK_RE.search(text)
    if match is not None and match.group(1).strip():
        return ParsedAction(match.group(1).strip(), valid)
    return ParsedAction(text.strip()[-INVALID_ACTION_CHARS:], False)


def format_penalty(parsed: ParsedAction, cfg: PromptConfig = PromptConfig()) -> float:
    return 0.0 if parsed.valid else cfg.format_penalty


_TEMPLATE = re.compile(r"^(\w+)\[<[^>]*>\]$")


def is_listed(action: str, admissible_actions: Sequence[str]) -> bool:
    """Is `action` one the list offered? Case aside, an entry matches itself, and a template entry
    `verb[<placeholder>]` (WebShop's `search[<your query>]`) matches `verb[...]` with anything non-empty inside."""
    action = action.lower()
    for entry in admissible_actions:
        entry = entry.lower()
        template = _TEMPLATE.match(entry)
        if action == entry or (template and re.fullmatch(re.escape(template[1]) + r"\[.*\S.*\]", action, re.DOTALL)):
            return True
    return False


def turn_penalty(parsed: ParsedAction, admissible_actions: Sequence[str], cfg: PromptConfig = PromptConfig()) -> float:
    """What a turn's reply costs besides the env's reward: the format penalty, plus the unlisted-action penalty."""
    unlisted = cfg.unlisted_penalty > 0 and not is_listed(parsed.action, admissible_actions)
    return format_penalty(parsed, cfg) + (cfg.unlisted_penalty if unlisted else 0.0)


def expert_reply(action: str, thought: str = "", think: bool = True) -> str:
    """The reply an SFT target uses for an expert action; without `think`, the action alone (for a prompt
    config that does not require the <think> part: fewer tokens to generate every turn)."""
    reasoning = f"{THINK_OPEN}{thought}{THINK_CLOSE}" if think or thought else ""
    return f"{reasoning}{ACTION_OPEN}{action}{ACTION_CLOSE}"
