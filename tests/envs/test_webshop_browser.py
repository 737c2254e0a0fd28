"""Browser mode: one episode driven through headless chromium and the Flask site shows, step for step,
the same observations and actions as the text mode."""

from __future__ import annotations

import pytest

from env_server.envs.webshop.browser import chromium_executables, page_kind
from env_server.envs.webshop.env import WebShopEnv

pytestmark = pytest.mark.browser


def test_page_kind_reads_the_site_routes():
    assert page_kind("http://h/fixed_3") == "start"
    assert page_kind("http://h/fixed_3/results?q=a&page=2") == "results"
    assert page_kind("http://h/fixed_3/item/B0?q=a") == "item"
    assert page_kind("http://h/fixed_3/item/B0/Features?q=a") == "sub"
    assert page_kind("http://h/fixed_3/buy/B0") == "done"


@pytest.mark.skipif(chromium_executables() is None, reason="needs chromium + chromedriver (make browser-deps)")
def test_browser_and_text_modes_give_the_same_episode():
    text = WebShopEnv(data_dir="synthetic", pos_tagger="heuristic")
    browser = WebShopEnv(data_dir="synthetic", pos_tagger="heuristic", observation_mode="browser")
    try:
        task = next(t for t in text.splits()["test"].tasks if text.world.goals[int(t.task_id)].goal_options)
        goal = text.world.goals[int(task.task_id)]
        value = goal.goal_options[0][1]
        # Detours first (paging, a search from an item page, sub-pages, an ignored action, a search
        # for markup), then the expert's own way to the purchase.
        detours = ["search[<script>alert(1)</script> shampoo]", "click[next >]", "click[< prev]",
                   "click[back to search]", f"search[{goal.instruction_text}]", f"click[{goal.asin.lower()}]",
                   f"click[{value}]", "click[features]", "click[< prev]", "click[reviews]", "click[no such thing]",
                   "click[< prev]", "search[green tea]", "click[back to search]"]
        pairs = [(text.reset("test", task.task_id, max_turns=30), browser.reset("test", task.task_id, max_turns=30))]
        for action in detours:
            pairs.append((text.step(action), browser.step(action)))
        while not pairs[-1][0].done:
            action = pairs[-1][0].info["expert_action"]
            pairs.append((text.step(action), browser.step(action)))
        for turn, (by_text, by_browser) in enumerate(pairs):
            assert by_browser.observation == by_text.observation, turn
            assert by_browser.admissible_actions == by_text.admissible_actions, turn
            assert by_browser.info["page"] == by_text.info["page"], turn
        final_text, final_browser = pairs[-1]
        assert final_browser.terminated and final_browser.score == final_text.score
        assert final_browser.won == final_text.won
    finally:
        browser.close()
