"""WebShop on the real 1k-product data (WEBSHOP_DATA): normalization, goal count and order, the saved
pages of the original site. (The scripted oracle plays through a real server: test_webshop_server.py.)"""

from __future__ import annotations

import hashlib
import html
import json
import re
from pathlib import Path

import pytest
from webshop_fixtures import make_product, real_world_dir

from env_server.envs.webshop.catalog import load_catalog
from env_server.envs.webshop.dom import read_page
from env_server.envs.webshop.env import WebShopEnv
from env_server.envs.webshop.pages import (
    ItemPage,
    ResultsPage,
    SubPage,
    clickables,
    render_text,
    render_text_rich,
)

pytestmark = pytest.mark.data

FIRST_TEST_GOAL = ("B0743JKHBV", 'Find me double sided, machine washable decorative pillows with printing technology '
                   'with size: 28" x 28", and price lower than 50.00 dollars')
TEST_SPLIT_SHA256 = "7d0a43af78296245e549b60d008025828f2cab31a8b0968a782dd6f5485ccbfc"


@pytest.fixture(scope="module")
def env() -> WebShopEnv:
    return WebShopEnv(data_dir=real_world_dir())


def test_catalog_is_normalized_as_the_original(env):
    catalog = env.world.catalog
    assert len(catalog.products) == 1000
    first = catalog.products[0]
    assert (first.asin, first.price_tag, catalog.prices[first.asin]) == ("B06Y3VLDFB", "$877.8", 877.8)
    ranged = next(p for p in catalog.products if len(p.pricing) == 2)
    assert " to $" in ranged.price_tag and ranged.pricing[0] <= catalog.prices[ranged.asin] <= ranged.pricing[1]
    assert all(p.rating == "N.A." for p in catalog.products)
    with_options = [p for p in catalog.products if p.options]
    assert all(name == name.lower() and all(v == v.lower() and "/" not in v for v in values)
               for p in with_options for name, values in p.options.items())


def test_goal_count_first_goal_and_test_split_are_pinned(env):
    goals = env.world.goals
    assert len(goals) == 6910
    assert (goals[0].asin, goals[0].instruction_text) == FIRST_TEST_GOAL
    test = env.splits()["test"]
    assert len(test.tasks) == 500 and len(env.splits()["train"].tasks) == 6410
    listing = [[t.task_id, goals[int(t.task_id)].asin, goals[int(t.task_id)].instruction_text] for t in test.tasks]
    assert hashlib.sha256(json.dumps(listing).encode()).hexdigest() == TEST_SPLIT_SHA256


def test_goals_do_not_depend_on_the_process_random_state():
    import random

    random.seed(12345)
    catalog = load_catalog(Path(real_world_dir()), None, human_goals=False)
    from env_server.envs.webshop.goals import ordered_goals

    assert ordered_goals(catalog, human=False)[0].instruction_text == FIRST_TEST_GOAL[1]


# ---- the original site's saved pages -------------------------------------------------------------
def _fixture(name: str) -> str:
    return (Path(real_world_dir()) / "webshop_site_html_samples" / name).read_text()


def _texts(source: str, pattern: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(pattern, source, flags=re.S)]


def _assert_same_page(saved_html: str, page) -> None:
    saved = read_page(saved_html)
    assert render_text(page.nodes()) == render_text(saved.nodes)
    assert render_text_rich(page.nodes()) == render_text_rich(saved.nodes)
    assert clickables(page.nodes()) == saved.clickables


INSTRUCTION_PATTERN = r'<h4>Instruction:<br>(.*?)</h4>'


def test_results_page_matches_the_saved_original():
    source = _fixture("mock_parse_results_ws.html")
    asins = _texts(source, r'class="product-link"[^>]*>(.*?)</a>')
    titles = _texts(source, r'product-title">(.*?)</h5>')
    prices = _texts(source, r'product-price">(.*?)</h6>')
    products = tuple(make_product(asin=a, title=t, price_tag=p) for a, t, p in zip(asins, titles, prices, strict=True))
    assert len(products) == 10
    page = ResultsPage(_texts(source, INSTRUCTION_PATTERN)[0], ("red", "basketball", "shoes"), 1, 50, products)
    _assert_same_page(source, page)


def _saved_item():
    source = _fixture("mock_parse_item_page_ws.html")
    radios = re.findall(r'<input type="radio"[^>]*name="([^"]*)" value="([^"]*)"', source)
    options: dict[str, tuple[str, ...]] = {}
    for name, value in radios:
        options[name] = options.get(name, ()) + (html.unescape(value),)
    product = make_product(asin="B09P87V3LZ", title=_texts(source, r"<h2>(.*?)</h2>")[0], price_tag="$100.0",
                           options=options)
    return source, product


def test_item_page_matches_the_saved_original():
    source, product = _saved_item()
    page = ItemPage(_texts(source, INSTRUCTION_PATTERN)[0], product, ("red",), 1, {})
    _assert_same_page(source, page)


@pytest.mark.parametrize("name, saved", [("Description", "mock_parse_item_page_ws_desc.html"),
                                         ("Features", "mock_parse_item_page_ws_feat.html")])
def test_sub_pages_match_the_saved_original(name, saved):
    source = _fixture(saved)
    texts = _texts(source, r'<p class="product-info">(.*?)</p>')
    product = make_product(description=texts[0] if name == "Description" else "",
                           bullet_points=tuple(t[1:] for t in texts) if name == "Features" else ())
    page = SubPage(_texts(source, INSTRUCTION_PATTERN)[0], product, ("red",), 1, {}, name)
    _assert_same_page(source, page)
