"""One WebShop world per worker process: catalog, search index, goals and reward tagger, loaded once
and shared by every session of the process (text sessions, browser sessions and the web site).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from env_server.envs.webshop import catalog as catalog_module
from env_server.envs.webshop.catalog import PRICE_SEED, Catalog, Product
from env_server.envs.webshop.goals import BOUND_SEED, SHUFFLE_SEED, Goal, ordered_goals
from env_server.envs.webshop.reward import TAGGERS, NounTagger, Reward, compute_reward, noun_tagger
from env_server.envs.webshop.search import SearchEngine, default_index_root, open_index

GOAL_SOURCES = ("synthetic", "human")
SEARCH_CACHE_SIZE = 4096


@dataclass(frozen=True)
class WorldConfig:
    data_dir: str | None = None         # None: $WEBSHOP_DATA, else (or "synthetic") a generated catalog
    goals: str = "synthetic"            # "synthetic" (6,910 on the 1k world) or "human"
    num_products: int | None = None     # keep only the first N products of the file
    synthetic_products: int = 300       # size of the generated catalog when there is no data
    synthetic_seed: int = 0
    index_dir: str | None = None        # None: $WEBSHOP_INDEX_DIR or ~/.cache/limen/webshop-index
    pos_tagger: str = "auto"            # "auto" | "spacy" | "heuristic" (reward.noun_tagger)

    def __post_init__(self) -> None:
        if self.goals not in GOAL_SOURCES:
            raise ValueError(f"goals must be one of {GOAL_SOURCES}, got {self.goals!r}")
        if self.pos_tagger not in TAGGERS:
            raise ValueError(f"pos_tagger must be one of {TAGGERS}, got {self.pos_tagger!r}")
        if self.num_products is not None and self.num_products <= 0:
            raise ValueError(f"num_products must be positive, got {self.num_products}")
        if self.synthetic_products <= 0:
            raise ValueError(f"synthetic_products must be positive, got {self.synthetic_products}")


class World:
    def __init__(self, catalog: Catalog, search_engine: SearchEngine, goal_source: str, tagger: NounTagger):
        self.catalog = catalog
        self.goal_source = goal_source
        self.goals: tuple[Goal, ...] = ordered_goals(catalog, goal_source == "human")
        self.tagger = tagger
        self._engine = search_engine
        self._cached_search = functools.lru_cache(maxsize=SEARCH_CACHE_SIZE)(self._search)

    def product(self, asin: str) -> Product:
        return self.catalog.by_asin[asin]

    def search(self, query: str) -> list[Product]:
        """The top-50 products for a query (cached: RL asks the same queries again and again)."""
        return self._cached_search(query)

    def _search(self, query: str) -> list[Product]:
        # asins missing from the catalog are dropped, as the original does with its Lucene hits
        return [self.catalog.by_asin[a] for a in self._engine.search(query) if a in self.catalog.by_asin]

    def reward(self, goal: Goal, asin: str, options: dict[str, str]) -> Reward:
        return compute_reward(self.product(asin), goal, self.catalog.prices[asin], options, self.tagger)

    @property
    def digest(self) -> str:
        """Data, goal source and tagger: anything that changes a task or its reward changes this."""
        parts = f"{self.catalog.digest}:{self.goal_source}:{PRICE_SEED}:{BOUND_SEED}:{SHUFFLE_SEED}:{self.tagger.name}"
        return hashlib.sha256(parts.encode()).hexdigest()


def load_world(config: WorldConfig) -> World:
    """The process-wide world for this config ($WEBSHOP_DATA is resolved first, so it is part of the key)."""
    data_dir = catalog_module.resolve_data_dir(config.data_dir)
    index_root = Path(config.index_dir) if config.index_dir else default_index_root()
    return _load_world(config, str(data_dir) if data_dir else None, index_root)


@functools.lru_cache(maxsize=8)
def _load_world(config: WorldConfig, data_dir: str | None, index_root: Path) -> World:
    if data_dir is None:
        if config.goals == "human":
            raise FileNotFoundError("human goals need the WebShop data (set WEBSHOP_DATA)")
        catalog = catalog_module.synthetic_catalog(config.synthetic_products, config.synthetic_seed)
        engine = open_index(catalog.products, catalog.digest, None)    # tiny: built in memory
    else:
        catalog = catalog_module.load_catalog(Path(data_dir), config.num_products, config.goals == "human")
        engine = open_index(catalog.products, catalog.digest, index_root)
    return World(catalog, engine, config.goals, noun_tagger(config.pos_tagger))
