"""Prompting baselines run by `limen-eval --prompting`: zero-shot and ReAct-style, on any causal LM.

Zero-shot is the training prompt as it is (the anchor's "Qwen2.5 (prompt)" row). ReAct-style puts one short
worked example of thought + action per env before the task, in the anchor's structure and our own wording.
Both parse replies exactly as training does (prompts.parse_action), so format-invalid replies count the same.
"""

from __future__ import annotations

import dataclasses

from trainer_client.prompts import PromptConfig, expert_reply

PROMPTING_STYLES = ("zero-shot", "react")

# (observation, thought, action) steps of one solved task per env. The commands are each env's real ones
# (ALFWorld 0.4.2 says "move O to R", not the ReAct paper's "put O in/on R").
_WORKED_EXAMPLES: dict[str, tuple[str, tuple[tuple[str, str, str], ...]]] = {
    "alfworld": ("put a clean plate in shelf", (
        ("You are in the middle of a room. Looking quickly around you, you see a countertop 1, a drawer 1, "
         "a shelf 1, and a sinkbasin 1.",
         "Plates are usually kept on a countertop, so I will check countertop 1 first.", "go to countertop 1"),
        ("You arrive at countertop 1. On the countertop 1, you see a bread 1, and a plate 2.",
         "Plate 2 is here. I pick it up.", "take plate 2 from countertop 1"),
        ("You pick up the plate 2 from the countertop 1.",
         "The task wants the plate clean, and the sinkbasin is where things get cleaned.", "go to sinkbasin 1"),
        ("You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.",
         "I clean the plate here.", "clean plate 2 with sinkbasin 1"),
        ("You clean the plate 2 using the sinkbasin 1.",
         "The plate is clean; now it goes to the shelf.", "go to shelf 1"),
        ("You arrive at shelf 1. On the shelf 1, you see nothing.",
         "I place the clean plate on the shelf, which completes the task.", "move plate 2 to shelf 1"),
    )),
    "webshop": ("i need a pack of unscented bar soap, and price lower than 20.00 dollars", (
        ("Search", "I start by searching for the product with its key words.", "search[unscented bar soap]"),
        ("'Back to Search' [SEP] 'Page 1 (Total results: 50)' [SEP] 'Next >' [SEP] 'B07P1' [SEP] "
         "'Pure Unscented Bar Soap, Pack of 4' [SEP] '$12.99' [SEP] 'B08Q2' [SEP] 'Lavender Soap Bar' [SEP] '$8.50'",
         "B07P1 is an unscented bar soap pack and costs $12.99, under the $20 limit.", "click[b07p1]"),
        ("'Back to Search' [SEP] '< Prev' [SEP] 'Pure Unscented Bar Soap, Pack of 4' [SEP] 'Price: $12.99' "
         "[SEP] 'Rating: N.A.' [SEP] 'Description' [SEP] 'Features' [SEP] 'Reviews' [SEP] 'Buy Now'",
         "This product matches every requirement, so I buy it.", "click[buy now]"),
    )),
    "toy": ("put the key in the garden", (
        ("You are in the hall. Your task is to: put the key in the garden. Exits: kitchen.",
         "The key is not in the hall, and the only exit is the kitchen, so I go there.", "go to kitchen"),
        ("You arrive at the kitchen. You see: key. Exits: hall, garden.", "The key is here; I take it.", "take key"),
        ("You take the key. Exits: hall, garden.", "The garden is next to the kitchen.", "go to garden"),
        ("You arrive at the garden. Exits: kitchen.", "I drop the key here, which completes the task.", "drop key"),
    )),
}


def worked_example(env: str) -> str:
    """The ReAct-style example of one env: the task, then each observation with the reply it got."""
    if env not in _WORKED_EXAMPLES:
        raise ValueError(f"no ReAct-style example for env {env!r}; known: {sorted(_WORKED_EXAMPLES)}")
    task, steps = _WORKED_EXAMPLES[env]
    lines = [f"Here is an example of a different task solved step by step. Its task was to: {task}."]
    for observation, thought, action in steps:
        lines += [f"Observation: {observation}", f"Reply: {expert_reply(action, thought)}"]
    return "\n".join(lines)


def prompt_config(style: str, env: str, base: PromptConfig = PromptConfig()) -> PromptConfig:
    """The prompt settings of one prompting baseline, on top of `base` (e.g. a run's own prompt settings)."""
    if style == "zero-shot":
        return dataclasses.replace(base, example="")
    if style == "react":
        return dataclasses.replace(base, example=worked_example(env))
    raise ValueError(f"unknown prompting style {style!r}; choose from {list(PROMPTING_STYLES)}")
