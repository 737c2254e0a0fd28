"""Read a WebShop HTML page back the way the original text env reads its pages (BeautifulSoup with
html.parser): the visible text nodes in document order, and the clickables. Used for the browser
mode and to check our site and the original's saved pages against our text pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser

from env_server.envs.webshop.pages import Node, NodeKind, parsed_text

# Text directly under these is not shown (the original's tag_visible).
_HIDDEN_PARENTS = frozenset({"style", "script", "head", "title", "meta"})
_VOID = frozenset(
    "area base br col embed hr img input keygen link menuitem meta param source track wbr "
    "basefont bgsound command frame image isindex nextid spacer".split()
)
_KEEP_WHITESPACE = frozenset({"pre", "textarea"})


@dataclass(frozen=True)
class PageReading:
    nodes: tuple[Node, ...]
    clickables: list[str]        # same rule as pages.clickables
    has_search_box: bool


@dataclass
class _Element:
    tag: str
    classes: tuple[str, ...]
    text: list[str]              # every string inside it, for get_text()


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[_Element] = []
        self.nodes: list[Node] = []
        self.buttons: list[_Element] = []
        self.links: list[_Element] = []
        self.radio_values: list[str] = []
        self.has_search_box = False
        self._pending: list[str] = []

    # -- tags --
    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._flush()
        attributes = dict(attrs)
        element = _Element(tag, tuple((attributes.get("class") or "").split()), [])
        if attributes.get("id") == "search_input":
            self.has_search_box = True
        if tag == "input" and (attributes.get("type") or "").lower() == "radio":
            self.radio_values.append(attributes.get("value") or "")
        if "btn" in element.classes:
            self.buttons.append(element)
        if "product-link" in element.classes:
            self.links.append(element)
        if tag not in _VOID:
            self.open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        self._flush()
        # Close the innermost open element of that name; a stray end tag is ignored.
        for depth in range(len(self.open) - 1, -1, -1):
            if self.open[depth].tag == tag:
                del self.open[depth:]
                break

    def handle_comment(self, data: str) -> None:
        self._flush()

    def handle_decl(self, decl: str) -> None:
        self._flush()

    # -- text --
    def handle_data(self, data: str) -> None:
        self._pending.append(data)

    def _flush(self) -> None:
        if not self._pending:
            return
        raw, self._pending = "".join(self._pending), []
        keep = any(e.tag in _KEEP_WHITESPACE for e in self.open)
        text = raw if keep else parsed_text(raw)
        if not text:
            return
        for element in self.open:
            element.text.append(text)
        parent = self.open[-1] if self.open else None
        if parent is None or parent.tag in _HIDDEN_PARENTS:
            return
        if parent.tag == "button":
            kind = NodeKind.BUTTON
        elif parent.tag == "label":
            kind = NodeKind.OPTION
        elif parent.classes == ("product-link",):
            kind = NodeKind.PRODUCT_LINK
        else:
            kind = NodeKind.TEXT
        self.nodes.append(Node(text, kind))

    def close(self) -> None:
        super().close()
        self._flush()


def read_page(html: str) -> PageReading:
    reader = _Reader()
    reader.feed(html)
    reader.close()
    ordered = ["".join(e.text).lower() for e in reader.buttons + reader.links] + reader.radio_values
    return PageReading(tuple(reader.nodes), list(dict.fromkeys(ordered)), reader.has_search_box)
