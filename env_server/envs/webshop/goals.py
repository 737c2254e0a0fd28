"""WebShop goals: synthetic (one per option combination of each goal-seed product) or human (one
per annotated instruction), in the original's fixed seeded order (docs/DESIGN.md#webshop-goals).

Seed scheme, every draw with its own fresh `random.Random`, so goals depend on nothing but the data:
product prices use catalog.PRICE_SEED (233); price bounds use BOUND_SEED (233, as AgentGym seeds its
synthetic goals); the final order is `Random(SHUFFLE_SEED=233).shuffle`, the original's permutation.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from env_server.envs.datasets import OfflineSplits
from env_server.envs.webshop.catalog import Catalog, Product

PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))   # 10, 20, ..., 990
NO_PRICE_BOUND = 1_000_000.0
BOUND_SEED = 233
SHUFFLE_SEED = 233
TEST_GOALS = 500   # goals 0-499 are the test split, the rest train (the RL wrappers' split)


@dataclass(frozen=True)
class Goal:
    asin: str
    name: str                       # the target product's title
    category: str
    query: str
    product_category: str
    instruction_text: str
    attributes: tuple[str, ...]
    price_upper: float
    # Synthetic goals: (option name, value) pairs. Human goals: bare values. The reward treats
    # the two differently, exactly as the original does with a dict's items vs a list.
    goal_options: tuple[tuple[str, str], ...] | tuple[str, ...]
    weight: float = 1.0


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """The larger of two distinct picks among the first four steps above the price, and its text."""
    candidates = [step for step in PRICE_STEPS if step > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_BOUND, ""
    upper = max(rng.sample(candidates, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def option_combinations(options: dict[str, tuple[str, ...]]) -> list[tuple[tuple[str, str], ...]]:
    """Every choice of one value per option, option names sorted; no options gives one empty choice."""
    names = sorted(options)
    return [tuple(zip(names, values, strict=True)) for values in itertools.product(*(options[n] for n in names))]


def _goal(product: Product, instruction_text: str, attributes, price_upper, goal_options) -> Goal:
    return Goal(
        asin=product.asin,
        name=product.title,
        category=product.category,
        query=product.query,
        product_category=product.product_category,
        instruction_text=instruction_text,
        attributes=tuple(attributes),
        price_upper=price_upper,
        goal_options=tuple(goal_options),
    )


def synthetic_goals(catalog: Catalog) -> list[Goal]:
    rng = random.Random(BOUND_SEED)
    goals = []
    for product in catalog.products:
        if product.instruction is None:
            continue
        if not product.instruction_attributes:
            raise ValueError(f"goal-seed product {product.asin} has an instruction but no instruction_attributes")
        upper, price_text = price_bound(catalog.prices[product.asin], rng)
        for combination in option_combinations(product.options):
            options_text = ", and ".join(f"{name}: {value}" for name, value in combination)
            options_text = f" with {options_text}" if options_text else ""
            text = f"{product.instruction}{options_text}{price_text}"
            goals.append(_goal(product, text, product.instruction_attributes, upper, combination))
    return with_attribute_weights(goals)


def with_attribute_weights(goals: list[Goal]) -> list[Goal]:
    """weight = mean over a goal's attributes of 1 / (how many goals have that attribute)."""
    counts = Counter(a for goal in goals for a in goal.attributes)
    return [
        Goal(**{**goal.__dict__, "weight": sum(1.0 / counts[a] for a in goal.attributes) / len(goal.attributes)})
        for goal in goals
    ]


def human_goals(catalog: Catalog) -> list[Goal]:
    """One goal per annotated instruction with attributes; options are the annotated values."""
    rng = random.Random(BOUND_SEED)
    goals = []
    for product in catalog.products:
        for entry in product.human_instructions:
            if not entry["instruction_attributes"]:
                continue
            upper, price_text = price_bound(catalog.prices[product.asin], rng)
            text = entry["instruction"].strip(".") + price_text
            goals.append(_goal(product, text, entry["instruction_attributes"], upper, entry["instruction_options"]))
    return goals


def ordered_goals(catalog: Catalog, human: bool) -> tuple[Goal, ...]:
    """All goals in goal-index order: the original's seed-233 shuffle of the generation order."""
    goals = human_goals(catalog) if human else synthetic_goals(catalog)
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return tuple(goals)


def split_ranges(num_goals: int, val_goals: int = 0) -> dict[str, range]:
    """test = goals 0-499, train = the rest (fewer goals: test shrinks to the first tenth); val_goals > 0 cuts
    the last that many goals of train into `val`, a split to choose settings on in the test split's own shop."""
    test_size = TEST_GOALS if num_goals > 2 * TEST_GOALS else max(1, num_goals // 10)
    if not 0 <= val_goals < num_goals - test_size:
        raise ValueError(f"val_goals must leave train at least one goal: 0 <= val_goals < {num_goals - test_size}, "
                         f"got {val_goals}")
    ranges = {"test": range(0, test_size), "train": range(test_size, num_goals - val_goals)}
    return ranges | ({"val": range(num_goals - val_goals, num_goals)} if val_goals else {})


def served_splits(options: Mapping[str, Any]) -> frozenset[str]:
    """Every catalog, the synthetic one included, is cut into the same splits whatever its number of goals: val
    only where the val_goals option is set."""
    return frozenset(split_ranges(num_goals=10_000, val_goals=min(1, int(options.get("val_goals", 0)))))


# What a trainer's dry run checks its splits against (registry.ENV_SPLITS).
OFFLINE_SPLITS = OfflineSplits(names=served_splits({"val_goals": 1}), served=served_splits)
