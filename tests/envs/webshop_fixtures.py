"""Hand-built WebShop products and goals for the webshop tests (no data files needed)."""

from __future__ import annotations

import dataclasses

import pytest

from env_server.envs.webshop.catalog import Product
from env_server.envs.webshop.goals import Goal
from env_server.envs.webshop.world import World, WorldConfig, load_world

_PRODUCT = Product(
    asin="B000000001", title="", description="", bullet_points=(), pricing=(35.0,), price_tag="$35.0",
    options={}, option_images={}, main_image="", category="beauty", query="query 1",
    product_category="a › b › c", attributes=(),
)
_GOAL = Goal(
    asin="B000000001", name="", category="beauty", query="query 1", product_category="a › b › c",
    instruction_text="", attributes=(), price_upper=40.0, goal_options=(),
)


def make_product(**fields) -> Product:
    return dataclasses.replace(_PRODUCT, **fields)


def make_goal(**fields) -> Goal:
    return dataclasses.replace(_GOAL, **fields)


def synthetic_world() -> World:
    """The generated catalog every machine has (WEBSHOP_DATA ignored)."""
    return load_world(WorldConfig(data_dir="synthetic", synthetic_products=300, pos_tagger="heuristic"))


def real_world_dir() -> str:
    import os

    data_dir = os.environ.get("WEBSHOP_DATA")
    if not data_dir:
        pytest.skip("needs the WebShop data: set WEBSHOP_DATA (see docs/DATA.md)")
    return data_dir
