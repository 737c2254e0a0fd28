"""WebShop search: the Lucene-like analyzer, BM25 against a plain numpy oracle, ranking ties, and the
persisted, memory-mapped index."""

from __future__ import annotations

import numpy as np
import pytest
from webshop_fixtures import make_product, real_world_dir, synthetic_world

from env_server.envs.webshop.catalog import load_catalog
from env_server.envs.webshop.search import (
    BM25Search,
    analyze,
    document_text,
    open_index,
    rank_top_k,
    reference_bm25_scores,
)

QUERIES = [
    "i need a long lasting shampoo for sensitive skin",
    "men's running shoes, and price lower than 50.00 dollars",
    "wireless bluetooth headphones noise cancelling noise",
    "gluten free green tea",
    "zzz-not-a-word",
]


def test_analyzer_is_lucene_english_with_porter():
    assert analyze("The Men's SHOES are running") == ["men", "shoe", "run"]
    assert analyze("size 6.5, 1,000 pieces; x-large") == ["size", "6.5", "1,000", "piec", "x", "larg"]
    assert analyze("D.O.N. Issue 2") == ["d.o.n", "issu", "2"]
    assert analyze("to be or not to be") == []


def test_document_text_indexes_title_description_first_bullet_and_options():
    product = make_product(title="Acme Mug", description="A mug.", bullet_points=("First", "Second"),
                           options={"color": ("red", "blue"), "size": ("large",)})
    assert document_text(product) == "acme mug a mug. first color: red, blue, and size: large"


def test_rank_top_k_breaks_ties_by_catalog_order_and_drops_non_matches():
    scores = np.array([0.0, 2.0, 1.0, 2.0, 1.0, 0.5], dtype=np.float32)
    assert rank_top_k(scores, k=3).tolist() == [1, 3, 2]
    assert rank_top_k(scores, k=10).tolist() == [1, 3, 2, 4, 5]


def _assert_same_ranking_as_oracle(products, queries):
    engine = BM25Search.build(products)
    documents = [analyze(document_text(p)) for p in products]
    for query in queries:
        oracle = reference_bm25_scores(documents, analyze(query))
        ours = engine.scores(query)
        np.testing.assert_allclose(ours, oracle, rtol=1e-5, atol=1e-6)
        expected = [products[i].asin for i in rank_top_k(oracle.astype(np.float32))]
        assert engine.search(query) == expected, query


def test_bm25_matches_the_numpy_oracle_on_the_synthetic_catalog():
    _assert_same_ranking_as_oracle(synthetic_world().catalog.products, QUERIES)


@pytest.mark.data
def test_bm25_matches_the_numpy_oracle_on_the_1k_catalog():
    from pathlib import Path

    catalog = load_catalog(Path(real_world_dir()), None, human_goals=False)
    _assert_same_ranking_as_oracle(catalog.products, QUERIES + ["reclaimed wood console table"])


def test_persisted_index_is_memory_mapped_and_ranks_the_same(tmp_path):
    world = synthetic_world()
    products = world.catalog.products
    saved = open_index(products, world.catalog.digest, tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    reloaded = open_index(products, world.catalog.digest, tmp_path)      # second worker: load only
    assert isinstance(reloaded._retriever.scores["data"], np.memmap)
    in_memory = BM25Search.build(products)
    for query in QUERIES:
        assert saved.search(query) == reloaded.search(query) == in_memory.search(query)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [entry.name]
