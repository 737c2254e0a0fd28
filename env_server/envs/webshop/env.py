"""`webshop`: the WebShop shopping task as a limen TextEnv, in `text`, `text_rich` or `browser`
observation mode (browser: the same text, read through headless chromium from the Flask site).

Task ids are goal indices in the original's seed-233 order; split test = goals 0-499, train = the
rest (less the last `val_goals`, split val, when that is set). Reward is sparse success (1.0 iff the purchase scores exactly 1.0) unless `reward="score"`; the raw
score is always `score`.
"""

from __future__ import annotations

import functools
import json

from env_server.envs.base import Split, StepResult, Task, TextEnv
from env_server.envs.webshop.goals import split_ranges
from env_server.envs.webshop.pages import (
    RENDERERS,
    RESULTS_PER_PAGE,
    Screen,
    ShopSession,
    admissible_actions,
    clickables,
)
from env_server.envs.webshop.world import World, WorldConfig, load_world

OBSERVATION_MODES = ("text", "text_rich", "browser")
# What `reward` carries at the purchase: "success", 1.0 iff it scores exactly 1.0 (verl-agent's choice, the
# anchor's); "score", the raw score in [0, 1] (the original's RL), which credits a purchase that is nearly right.
REWARDS = ("success", "score")


@functools.lru_cache(maxsize=8)
def world_splits(world: World, val_goals: int = 0) -> dict[str, Split]:
    return {
        name: Split(
            name,
            tuple(Task(str(i), world.goals[i].category) for i in indices),
            description=f"goals {indices.start}-{indices.stop - 1} of the seed-233 goal order "
                        f"({world.goal_source} goals, {len(world.catalog.products)} products)",
        )
        for name, indices in split_ranges(len(world.goals), val_goals).items()
    }


def expert_action(session: ShopSession) -> str | None:
    """A scripted shopper's next move: search the instruction, page to the target, open it, choose
    the goal's options, buy. None when it has no move left (target not found even by its title)."""
    goal, page = session.goal, session.page
    if page.kind == "start":
        return f"search[{_bracket_free(goal.instruction_text)}]"
    if page.kind == "results":
        hits = [p.asin for p in session.world.search(" ".join(page.keywords))]
        if goal.asin in hits:
            target_page = hits.index(goal.asin) // RESULTS_PER_PAGE + 1
            if target_page == page.page:
                return f"click[{goal.asin.lower()}]"
            return "click[next >]" if target_page > page.page else "click[< prev]"
        title_query = _bracket_free(goal.name).lower()
        return None if " ".join(page.keywords) == title_query else f"search[{title_query}]"
    if page.kind == "item" and page.product.asin == goal.asin:
        wanted = [o[1] if isinstance(o, tuple) else o for o in goal.goal_options]
        shown = clickables(page.nodes())
        missing = [v for v in wanted if v not in session.options.values() and v in shown]
        return f"click[{missing[0]}]" if missing else "click[buy now]"
    if page.kind in ("item", "sub"):
        return "click[< prev]"
    return None


def _bracket_free(text: str) -> str:
    # A '[' inside search[...] would make the original's greedy parser reject the action.
    return text.replace("[", " ").replace("]", " ")


class WebShopEnv(TextEnv):
    name = "webshop"
    code_version = "webshop-1"
    default_max_turns = 15

    def __init__(
        self,
        observation_mode: str = "text",
        goals: str = "synthetic",
        data_dir: str | None = None,
        num_products: int | None = None,
        pos_tagger: str = "auto",
        index_dir: str | None = None,
        synthetic_products: int = WorldConfig.synthetic_products,
        synthetic_seed: int = WorldConfig.synthetic_seed,
        reward: str = "success",
        val_goals: int = 0,
    ) -> None:
        super().__init__()
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        self.observation_mode = observation_mode
        self.reward = reward
        self.val_goals = val_goals
        self.world = load_world(WorldConfig(data_dir=data_dir, goals=goals, num_products=num_products,
                                            pos_tagger=pos_tagger, index_dir=index_dir,
                                            synthetic_products=synthetic_products, synthetic_seed=synthetic_seed))
        self._session: ShopSession | None = None
        self._browser = None          # a BrowserSession, started on the first browser-mode reset
        self._task: Task | None = None
        world_splits(self.world, val_goals)   # a val_goals the shop cannot hold fails here, at start-up

    def splits(self) -> dict[str, Split]:
        return world_splits(self.world, self.val_goals)

    def data_hash(self) -> str:
        return self.world.digest

    @property
    def version(self) -> str:
        # Another reward, or a train split with goals cut off for val, is another env for a replay or a pool.
        return (super().version + ("" if self.reward == "success" else f"+reward-{self.reward}")
                + (f"+val-{self.val_goals}" if self.val_goals else ""))

    def _reset(self, split: str, task: Task, seed: int, options: dict[str, str]) -> StepResult:
        # `seed` changes nothing: a WebShop episode has no randomness once its goal is fixed.
        self._task = task
        goal = self.world.goals[int(task.task_id)]
        if self.observation_mode == "browser":
            if self._browser is None:
                from env_server.envs.webshop.browser import BrowserSession

                self._browser = BrowserSession(self.world)
            self._browser.start(int(task.task_id))
        else:
            self._session = ShopSession(self.world, goal)
        return self._result()

    def _step(self, action: str) -> StepResult:
        if self.observation_mode == "browser":
            self._browser.act(action)
        else:
            self._session.act(action)
        return self._result()

    def close(self) -> None:
        if self._browser is not None:
            self._browser.close()
            self._browser = None

    # ---- helpers ----------------------------------------------------------------------------------
    def _screen(self) -> Screen:
        if self.observation_mode == "browser":
            return self._browser.screen()
        session = self._session
        nodes = session.nodes
        score = session.purchase.reward.value if session.purchase else None
        return Screen(RENDERERS[self.observation_mode](nodes), clickables(nodes), session.page.kind, score)

    def _result(self) -> StepResult:
        screen = self._screen()
        goal = self.world.goals[int(self._task.task_id)]
        won = screen.score == 1.0
        info = {"page": screen.page_kind}
        if self._session is not None and self.observation_mode != "browser":
            expert = expert_action(self._session)
            if expert is not None:
                info["expert_action"] = expert
            if self._session.purchase is not None:
                info["reward_info"] = json.dumps(self._session.purchase.reward.info(goal))
        return StepResult(
            observation=screen.observation,
            admissible_actions=admissible_actions(screen.page_kind, screen.clickables),
            instruction=goal.instruction_text,
            task_id=self._task.task_id,
            task_category=goal.category,
            reward=(screen.score or 0.0) if self.reward == "score" else float(won),
            terminated=screen.score is not None,
            won=won,
            score=screen.score or 0.0,
            info=info,
        )
