"""WebShop pages and their rules, as the original text environment has them (docs/DESIGN.md#webshop-pages):
what each page shows, as the visible text nodes of its HTML in document order; the `text` and
`text_rich` observations made from those nodes; the clickables; and one session's click/search
state machine. The Flask site renders the same page models as HTML (site.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from env_server.envs.webshop.catalog import Product

if TYPE_CHECKING:
    from env_server.envs.webshop.goals import Goal
    from env_server.envs.webshop.reward import Reward
    from env_server.envs.webshop.world import World

RESULTS_PER_PAGE = 10
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
SEARCH = "Search"
SUB_PAGES = ("Description", "Features", "Reviews")
SEARCH_ACTION_HINT = "search[<your query>]"
SEP = " [SEP] "
# The original's action grammar: greedy, anchored at the start only ("click[x]]" -> arg "x]").
_ACTION = re.compile(r"(.+)\[(.+)\]")
_HTML_SPACE = " \n\t\f\r"


class NodeKind(Enum):
    TEXT = "text"
    BUTTON = "button"            # text inside a <button>
    OPTION = "option"            # the <label> of an option radio
    PRODUCT_LINK = "product_link"


@dataclass(frozen=True)
class Node:
    text: str
    kind: NodeKind = NodeKind.TEXT
    clicked: bool = False        # text_rich only: a chosen option, or a product visited this session


def parsed_text(text: str) -> str | None:
    """A string as an HTML parser leaves it: none if empty, whitespace-only runs collapsed to one
    newline (when they hold one) or one space, anything else verbatim."""
    if not text:
        return None
    if not text.strip(_HTML_SPACE):
        return "\n" if "\n" in text else " "
    return text


def _nodes(*items: str | Node) -> tuple[Node, ...]:
    nodes = []
    for item in items:
        node = item if isinstance(item, Node) else Node(item)
        text = parsed_text(node.text)
        if text is not None:
            nodes.append(Node(text, node.kind, node.clicked))
    return tuple(nodes)


def _button(text: str) -> Node:
    return Node(text, NodeKind.BUTTON)


# ---- page models -------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartPage:
    instruction: str
    kind = "start"

    def nodes(self) -> tuple[Node, ...]:
        return _nodes("WebShop", "Instruction: ", self.instruction, _button(SEARCH))


def _header(instruction: str) -> tuple[str | Node, ...]:
    return ("Instruction:", instruction, _button(BACK_TO_SEARCH))


@dataclass(frozen=True)
class ResultsPage:
    instruction: str
    keywords: tuple[str, ...]
    page: int
    total: int
    products: tuple[Product, ...]
    visited: frozenset[str] = frozenset()
    kind = "results"

    def nodes(self) -> tuple[Node, ...]:
        paging = (_button(PREV_PAGE),) if self.page > 1 else ()
        listing = []
        for p in self.products:
            listing += [Node(p.asin, NodeKind.PRODUCT_LINK, p.asin in self.visited), p.title, p.price_tag]
        return _nodes(*_header(self.instruction), f"Page {self.page} (Total results: {self.total})",
                      *paging, _button(NEXT_PAGE), *listing)


@dataclass(frozen=True)
class ItemPage:
    instruction: str
    product: Product
    keywords: tuple[str, ...]
    page: int
    options: dict[str, str] = field(default_factory=dict)
    kind = "item"

    def nodes(self) -> tuple[Node, ...]:
        # The original marks an option as clicked when '"value"' occurs in its page URL, which
        # embeds json.dumps(options): an option *name* equal to the value counts too.
        chosen = json.dumps(self.options)
        option_nodes = []
        for name, values in self.product.options.items():
            option_nodes.append(name)
            option_nodes += [Node(v, NodeKind.OPTION, f'"{v}"' in chosen) for v in values]
        return _nodes(*_header(self.instruction), _button(PREV_PAGE), *option_nodes, self.product.title,
                      f"Price: {self.product.price_tag}", f"Rating: {self.product.rating}",
                      *(_button(s) for s in SUB_PAGES), _button(BUY_NOW))


@dataclass(frozen=True)
class SubPage:
    instruction: str
    product: Product
    keywords: tuple[str, ...]
    page: int
    options: dict[str, str]
    name: str                   # one of SUB_PAGES
    kind = "sub"

    def nodes(self) -> tuple[Node, ...]:
        if self.name == "Description":
            body: tuple[str, ...] = (self.product.description,)
        elif self.name == "Features":
            body = tuple(f" {bullet}" for bullet in self.product.bullet_points)  # the template's space
        else:
            body = ()           # the original never loads reviews
        return _nodes(*_header(self.instruction), _button(PREV_PAGE), *body)


def options_json(options: dict[str, str]) -> str:
    """Flask's `tojson` as the done page shows it: sorted keys, ASCII, and <>&' as \\u escapes."""
    text = json.dumps(options, sort_keys=True)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(char, escape)
    return text


@dataclass(frozen=True)
class DonePage:
    asin: str
    options: dict[str, str]
    reward: float
    kind = "done"

    def nodes(self) -> tuple[Node, ...]:
        # The original's confirmation page; its target fields are never filled ("instuction" sic).
        purchased = ("asin", self.asin, "options", options_json(self.options), "attrs", "None",
                     "category", "None", "query", "None", "product category", "None")
        target = ("asin", "options", "attrs", "price upper", "instuction text", "category",
                  "product category", "query", "Goal ", "None")
        return _nodes("Thank you for shopping with us!", "Your code: ", "None",
                      " (Paste it in your MTurk interface.)", "Purchased", *purchased, "Target", *target,
                      "Reward", "Your score (min 0.0, max 1.0)", repr(self.reward), "Reward Details ", "None")


Page = StartPage | ResultsPage | ItemPage | SubPage | DonePage


# ---- observations and clickables ---------------------------------------------------------------
def render_text(nodes: tuple[Node, ...]) -> str:
    return SEP.join(node.text.strip() for node in nodes if node.text != "\n")


def render_text_rich(nodes: tuple[Node, ...]) -> str:
    """One line per node, clickables bracketed; each chosen option also prepends a notice."""
    observation = ""
    for node in nodes:
        if node.text == "\n":
            continue
        clicked = "clicked button" if node.clicked else "button"
        if node.kind is NodeKind.BUTTON:
            line = f"[button] {node.text} [button_]"
        elif node.kind is NodeKind.OPTION:
            line = f"  [{clicked}] {node.text} [{clicked}_]"
            if node.clicked:
                observation = f"You have clicked {node.text}.\n" + observation
        elif node.kind is NodeKind.PRODUCT_LINK:
            line = f"\n[{clicked}] {node.text} [{clicked}_]"
        else:
            line = node.text
        observation += line + "\n"
    return observation


RENDERERS = {"text": render_text, "text_rich": render_text_rich}


def clickables(nodes: tuple[Node, ...]) -> list[str]:
    """Buttons, then product links, lowercased, then option values; a repeated text keeps its first place."""
    ordered = [n.text.lower() for n in nodes if n.kind is NodeKind.BUTTON]
    ordered += [n.text.lower() for n in nodes if n.kind is NodeKind.PRODUCT_LINK]
    ordered += [n.text for n in nodes if n.kind is NodeKind.OPTION]
    return list(dict.fromkeys(ordered))


def admissible_actions(page_kind: str, clickable_texts: list[str]) -> list[str]:
    """The search hint on the start page (the only page with a search box), then click[...] for each
    clickable. `search[...]` itself is accepted on every page, as in the original."""
    hint = [SEARCH_ACTION_HINT] if page_kind == "start" else []
    return hint + [f"click[{c}]" for c in clickable_texts if c != SEARCH.lower()]


def parse_action(action: str) -> tuple[str, str | None]:
    """(name, lowercased argument) by the original's regex; (action, None) when it does not match."""
    match = _ACTION.match(action)
    if match is None:
        return action, None
    name, argument = match.groups()
    return name, argument.lower()


# ---- page builders (shared with the web site) --------------------------------------------------
def results_page(world: "World", goal: "Goal", keywords: tuple[str, ...], page: int,
                 visited: frozenset[str] = frozenset()) -> ResultsPage:
    hits = world.search(" ".join(keywords))
    window = hits[(page - 1) * RESULTS_PER_PAGE: page * RESULTS_PER_PAGE]
    return ResultsPage(goal.instruction_text, keywords, page, len(hits), tuple(window), visited)


def search_keywords(argument: str) -> tuple[str, ...]:
    """The original splits on single spaces (so doubled spaces give empty keywords)."""
    return tuple(argument.split(" "))


# ---- one session -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Screen:
    """What one page gives the agent, whichever mode produced it."""

    observation: str
    clickables: list[str]
    page_kind: str              # start | results | item | sub | done
    score: float | None         # the purchase reward, on the done page only


@dataclass(frozen=True)
class Purchase:
    asin: str
    options: dict[str, str]
    reward: "Reward"


class ShopSession:
    """One shopper's walk through the site: the original SimServer's rules, without HTML."""

    def __init__(self, world: "World", goal: "Goal") -> None:
        self.world = world
        self.goal = goal
        self.purchase: Purchase | None = None
        self._back_to_search()

    def _back_to_search(self) -> None:
        self.keywords: tuple[str, ...] = ()
        self.results_page_number = 1
        self.asin: str | None = None
        self.options: dict[str, str] = {}
        self.visited: set[str] = set()
        self.page: Page = StartPage(self.goal.instruction_text)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.page.nodes()

    def act(self, action: str) -> bool:
        """Apply one action; False (and nothing changes) when the original would ignore it."""
        name, argument = parse_action(action)
        if name == "search" and argument:
            self._search(search_keywords(argument), 1)
            return True
        if name == "click" and argument != SEARCH.lower() and argument in clickables(self.nodes):
            self._click(argument)
            return True
        return False

    def _search(self, keywords: tuple[str, ...], page: int) -> None:
        self.keywords, self.results_page_number = keywords, page
        self.asin, self.options = None, {}
        self.page = results_page(self.world, self.goal, keywords, page, frozenset(self.visited))

    def _click(self, target: str) -> None:
        # Dispatch by the clicked text first, as the original does, then by what was clicked.
        kind = self.page.kind
        if target == BUY_NOW.lower():
            reward = self.world.reward(self.goal, self.asin, self.options)
            self.purchase = Purchase(self.asin, dict(self.options), reward)
            self.page = DonePage(self.asin, dict(self.options), reward.value)
        elif target == BACK_TO_SEARCH.lower():
            self._back_to_search()
        elif target == NEXT_PAGE.lower() and kind == "results":
            self._search(self.keywords, self.results_page_number + 1)
        elif target == PREV_PAGE.lower() and kind == "results":
            self._search(self.keywords, self.results_page_number - 1)
        elif target == PREV_PAGE.lower() and kind == "sub":
            self._show_item()
        elif target == PREV_PAGE.lower() and kind == "item":
            self._search(self.keywords, self.results_page_number)
        elif target in (s.lower() for s in SUB_PAGES):
            sub = next(s for s in SUB_PAGES if s.lower() == target)
            self.page = SubPage(self.goal.instruction_text, self.world.product(self.asin), self.keywords,
                                self.results_page_number, dict(self.options), sub)
        else:
            self._pick(target)

    def _pick(self, target: str) -> None:
        """A product link opens its item page; an option value selects it (the last radio with that
        value wins, as a repeated text maps to the last element in the original)."""
        option_names = [name for name, values in self._shown_options() if target in values]
        if option_names:
            self.options[option_names[-1]] = target
        else:
            self.asin = target.upper()
            self.visited.add(self.asin)
        self._show_item()

    def _shown_options(self) -> list[tuple[str, tuple[str, ...]]]:
        return list(self.page.product.options.items()) if self.page.kind == "item" else []

    def _show_item(self) -> None:
        self.page = ItemPage(self.goal.instruction_text, self.world.product(self.asin), self.keywords,
                             self.results_page_number, dict(self.options))
