"""Product search: BM25 over the fields the original indexed, standing in for pyserini/Lucene.

Lucene-like on purpose (docs/DESIGN.md#webshop-search): k1=0.9, b=0.4, Lucene idf, an English analyzer
(possessive strip, lowercase, Lucene's 33 stopwords, Porter stemming), repeated query terms weighted
by their count, ties broken by catalog order. The index is saved once and memory-mapped by every
worker. Not reproduced: Lucene's lossy one-byte document-length norms (rare rank swaps).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import bm25s
import numpy as np
import Stemmer

from env_server.envs.webshop.catalog import Product

TOP_K = 50
K1, B = 0.9, 0.4
ANALYZER_VERSION = "lucene-english-porter-1"
# Lucene's EnglishAnalyzer default stop set (ENGLISH_STOP_WORDS_SET), 33 words.
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
# Word tokens in the spirit of Unicode word breaking (UAX #29, Lucene's StandardTokenizer):
# letters or digits, kept together across "." or an apostrophe between letters ("d.o.n", "don't")
# and across "." "," or an apostrophe between digits ("6.5", "1,000").
_TOKEN = re.compile(r"\w+(?:(?:(?<=[^\W\d])[.'’](?=[^\W\d])|(?<=\d)[.,;'’](?=\d))\w+)*")
_POSSESSIVE = re.compile(r"['’][sS]$")
_STEMMER = Stemmer.Stemmer("porter")


def analyze(text: str) -> list[str]:
    """Lucene's English analysis chain: tokenize, strip possessive 's, lowercase, drop stopwords, stem."""
    words = (_POSSESSIVE.sub("", token).lower() for token in _TOKEN.findall(text))
    return _STEMMER.stemWords([w for w in words if w and w not in LUCENE_STOPWORDS])


def option_text(product: Product) -> str:
    return ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.options.items())


def document_text(product: Product) -> str:
    """What the original indexed: title, description, the first bullet only, and the options."""
    first_bullet = product.bullet_points[0] if product.bullet_points else ""
    return " ".join([product.title, product.description, first_bullet or "", option_text(product)]).lower()


def rank_top_k(scores: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Indices of the k best positive scores, best first, equal scores in ascending index order."""
    matching = np.flatnonzero(scores > 0)
    if len(matching) > k:
        kth_best = np.partition(scores[matching], len(matching) - k)[len(matching) - k]
        matching = matching[scores[matching] >= kth_best]     # keeps every tie at the cut
    order = np.lexsort((matching, -scores[matching]))
    return matching[order[:k]]


class SearchEngine(Protocol):
    def search(self, query: str) -> list[str]:
        """The asins of the top 50 products for a bag-of-words query, best first."""


@dataclass(frozen=True)
class IndexKey:
    catalog_digest: str
    num_docs: int

    @property
    def hex(self) -> str:
        text = f"{self.catalog_digest}:{self.num_docs}:{ANALYZER_VERSION}:{K1}:{B}:{bm25s.__version__}"
        return hashlib.sha256(text.encode()).hexdigest()[:24]


class BM25Search:
    """A bm25s eager index plus the asin of every row."""

    def __init__(self, retriever: bm25s.BM25, asins: list[str]) -> None:
        self._retriever = retriever
        self._asins = asins

    @classmethod
    def build(cls, products: tuple[Product, ...]) -> "BM25Search":
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene", idf_method="lucene")
        retriever.index([analyze(document_text(p)) for p in products], show_progress=False)
        return cls(retriever, [p.asin for p in products])

    def save(self, directory: Path) -> None:
        self._retriever.save(str(directory))
        (directory / "asins.json").write_text(json.dumps(self._asins))

    @classmethod
    def load(cls, directory: Path) -> "BM25Search":
        """Memory-mapped, so worker processes on one host share the score matrix pages."""
        retriever = bm25s.BM25.load(str(directory), mmap=True)
        return cls(retriever, json.loads((directory / "asins.json").read_text()))

    def scores(self, query: str) -> np.ndarray:
        token_ids = self._retriever.get_tokens_ids(analyze(query))
        if not token_ids:
            return np.zeros(len(self._asins), dtype=np.float32)
        return self._retriever.get_scores_from_ids(token_ids)

    def search(self, query: str) -> list[str]:
        return [self._asins[i] for i in rank_top_k(self.scores(query))]


def default_index_root() -> Path:
    return Path(os.environ.get("WEBSHOP_INDEX_DIR") or Path.home() / ".cache" / "limen" / "webshop-index")


def open_index(products: tuple[Product, ...], catalog_digest: str, index_root: Path | None) -> BM25Search:
    """Load the persisted index for this catalog, building and saving it on first use.

    index_root None keeps the index in memory only. The save goes to a temporary directory that is
    renamed into place, so concurrent workers never read a half-written index.
    """
    if index_root is None:
        return BM25Search.build(products)
    target = index_root / IndexKey(catalog_digest, len(products)).hex
    if not (target / "asins.json").is_file():
        index_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=index_root, prefix=".building-"))
        try:
            BM25Search.build(products).save(staging)
            os.replace(staging, target)
        except OSError:
            if not (target / "asins.json").is_file():   # not merely lost a race with another worker
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return BM25Search.load(target)


def reference_bm25_scores(documents: list[list[str]], query: list[str], k1: float = K1, b: float = B) -> np.ndarray:
    """Plain numpy BM25 (Lucene idf, no (k1+1) factor), one float64 score per document: a test oracle."""
    lengths = np.array([len(d) for d in documents], dtype=np.float64)
    norm = k1 * (1 - b + b * lengths / lengths.mean())
    scores = np.zeros(len(documents))
    for term in query:
        tf = np.array([d.count(term) for d in documents], dtype=np.float64)
        df = np.count_nonzero(tf)
        if df:
            idf = np.log(1 + (len(documents) - df + 0.5) / (df + 0.5))
            scores += idf * tf / (tf + norm)
    return scores
