"""The shop as a real web site (Flask): the same page models as the text env, rendered as HTML with the
DOM hooks WebShop agents expect (#instruction-text h4, #search_input, .btn, a.product-link,
input[type=radio] + label, button.purchase, #reward). Stateless: each URL carries the search keywords,
results page, product and chosen options; a session id names the goal ("fixed_<i>" is goal i).

Run it for people: `python -m env_server.envs.webshop.site --port 3000`.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import re
import threading

from flask import Flask, abort, redirect, render_template, request, url_for
from jinja2 import DictLoader
from werkzeug.serving import WSGIRequestHandler, make_server

from env_server.envs.webshop.goals import Goal
from env_server.envs.webshop.pages import (
    SUB_PAGES,
    DonePage,
    ItemPage,
    SubPage,
    options_json,
    results_page,
    search_keywords,
)
from env_server.envs.webshop.world import World, WorldConfig, load_world

# ASCII digits only: `\d` and str.isdigit() also take "٣" or "²", which int() reads differently or refuses.
FIXED_SESSION = re.compile(r"fixed_([0-9]+)")
PAGE_NUMBER = re.compile(r"[1-9][0-9]{0,8}")
# Options are one flat JSON object of option name -> value; a product has a handful, each a few words.
MAX_OPTIONS_CHARS = 4096

# Every text node of these templates is a node of the matching page model (pages.py), in order;
# whitespace between tags always holds a newline, so it never becomes a node of its own.
_LAYOUT = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<link rel="icon" href="data:,">
<title>WebShop</title>
<style>
body { font-family: sans-serif; margin: 2em auto; max-width: 60em; }
.btn { margin: 0.2em; padding: 0.3em 0.8em; cursor: pointer; }
.purchase { font-weight: bold; }
.result { border-top: 1px solid #ccc; padding: 0.5em 0; }
.result img, #product-image { max-height: 8em; }
.hidden { display: none; }
</style>
</head>
<body>
{% block instruction %}
<div id="instruction-text">
<h4>Instruction:<br>{{ instruction }}</h4>
</div>
<form method="get" action="{{ url_for('start', sid=sid) }}">
<button type="submit" class="btn btn-back">Back to Search</button>
</form>
{% endblock %}
{% block content %}{% endblock %}
</body>
</html>
"""

_START = """{% extends "layout.html" %}
{% block instruction %}
<h2 id="logo">WebShop</h2>
<div id="instruction-text">
<h4>Instruction: <br>{{ instruction }}</h4>
</div>
{% endblock %}
{% block content %}
<form method="post" action="{{ url_for('start', sid=sid) }}">
<input id="search_input" type="text" name="search_query" placeholder="Search..." required>
<button type="submit" class="btn btn-search">Search</button>
</form>
{% endblock %}
"""

_RESULTS = """{% extends "layout.html" %}
{% block content %}
<h3>Page {{ page.page }} (Total results: {{ page.total }})</h3>
{% if page.page > 1 %}
<form method="get" action="{{ url_for('results', sid=sid) }}">
<input type="hidden" name="q" value="{{ query }}">
<input type="hidden" name="page" value="{{ page.page - 1 }}">
<button type="submit" class="btn btn-prev">&lt; Prev</button>
</form>
{% endif %}
<form method="get" action="{{ url_for('results', sid=sid) }}">
<input type="hidden" name="q" value="{{ query }}">
<input type="hidden" name="page" value="{{ page.page + 1 }}">
<button type="submit" class="btn btn-next">Next &gt;</button>
</form>
{% for product in page.products %}
<div class="result">
<img class="result-img" src="{{ image_src(product.main_image) }}" data-src="{{ product.main_image }}" alt="">
{% set item_url = url_for('item', sid=sid, asin=product.asin, q=query, page=page.page, options='{}') %}
<h4 class="product-asin"><a class="product-link" href="{{ item_url }}">{{ product.asin }}</a></h4>
<h4 class="product-title">{{ product.title }}</h4>
<h5 class="product-price">{{ product.price_tag }}</h5>
</div>
{% endfor %}
{% endblock %}
"""

_ITEM = """{% extends "layout.html" %}
{% block content %}
<form method="get" action="{{ url_for('results', sid=sid) }}">
<input type="hidden" name="q" value="{{ query }}">
<input type="hidden" name="page" value="{{ page.page }}">
<button type="submit" class="btn btn-prev">&lt; Prev</button>
</form>
<img id="product-image" src="{{ image_src(image) }}" data-src="{{ image }}" alt="">
{% for name, values in page.product.options.items() %}
<div class="option">
<h4>{{ name }}</h4>
{% for value in values %}
{% set option_url = url_for('item', sid=sid, asin=page.product.asin, q=query, page=page.page,
                             options=with_option(name, value)) %}
<input type="radio" id="radio_{{ name }}{{ loop.index0 }}" name="{{ name }}" value="{{ value }}"
 data-href="{{ option_url }}"{% if page.options.get(name) == value %} checked{% endif %}>
<label for="radio_{{ name }}{{ loop.index0 }}">{{ value }}</label>
{% endfor %}
</div>
{% endfor %}
<h2>{{ page.product.title }}</h2>
<h4>Price: {{ page.product.price_tag }}</h4>
<h4>Rating: {{ page.product.rating }}</h4>
{% for sub in sub_pages %}
<form method="get" action="{{ url_for('sub_page', sid=sid, asin=page.product.asin, sub=sub) }}">
<input type="hidden" name="q" value="{{ query }}">
<input type="hidden" name="page" value="{{ page.page }}">
<input type="hidden" name="options" value="{{ options }}">
<button type="submit" class="btn btn-sub">{{ sub }}</button>
</form>
{% endfor %}
<form method="post" action="{{ url_for('buy', sid=sid, asin=page.product.asin) }}">
<input type="hidden" name="options" value="{{ options }}">
<button type="submit" class="btn btn-lg purchase">Buy Now</button>
</form>
<script>
for (const radio of document.querySelectorAll('input[type=radio]')) {
  radio.addEventListener('click', () => { window.location.href = radio.dataset.href; });
}
</script>
{% endblock %}
"""

_SUB_PAGE = """{% extends "layout.html" %}
{% block content %}
<form method="get" action="{{ url_for('item', sid=sid, asin=page.product.asin) }}">
<input type="hidden" name="q" value="{{ query }}">
<input type="hidden" name="page" value="{{ page.page }}">
<input type="hidden" name="options" value="{{ options }}">
<button type="submit" class="btn btn-prev">&lt; Prev</button>
</form>
<div class="sub-page" id="{{ page.name | lower }}">
{% if page.name == "Description" %}
<p class="product-info">{{ page.product.description }}</p>
{% elif page.name == "Features" %}
<ul>
{% for bullet in page.product.bullet_points %}
<li><p class="product-info"> {{ bullet }}</p></li>
{% endfor %}
</ul>
{% endif %}
</div>
{% endblock %}
"""

_DONE = """{% extends "layout.html" %}
{% block instruction %}{% endblock %}
{% block content %}
<h1>Thank you for shopping with us!</h1>
<h3>Your code: </h3>
<p><span class="code">None</span> (Paste it in your MTurk interface.)</p>
<div class="hidden">
<h2>Purchased</h2>
<h4 id="asin">asin<pre>{{ page.asin }}</pre></h4>
<h4 id="options">options<pre>{{ options_json }}</pre></h4>
{% for label in ["attrs", "category", "query", "product category"] %}
<h4>{{ label }}<pre>None</pre></h4>
{% endfor %}
<h2>Target</h2>
{% for label in ["asin", "options", "attrs", "price upper", "instuction text", "category", "product category", "query"] %}
<h4>{{ label }}<pre></pre></h4>
{% endfor %}
<h4>Goal <span><pre>None</pre></span></h4>
<h2>Reward</h2>
</div>
<h3 id="reward">Your score (min 0.0, max 1.0)<pre>{{ reward }}</pre></h3>
<h4 hidden>Reward Details <span id="reward_info"><pre>None</pre></span></h4>
{% endblock %}
"""

TEMPLATES = {"layout.html": _LAYOUT, "start.html": _START, "results.html": _RESULTS, "item.html": _ITEM,
             "sub_page.html": _SUB_PAGE, "done.html": _DONE}


def session_goal(world: World, sid: str) -> Goal:
    """'fixed_<i>' (optionally followed by '_anything') is goal i; any other id draws a goal by
    weight, seeded by the id so that a reload keeps it."""
    fixed = FIXED_SESSION.match(sid)
    if fixed:
        digits = fixed.group(1)
        # The length check comes first: int() refuses over 4,300 digits, and the reason must stay short.
        if len(digits) > len(str(len(world.goals))) or int(digits) >= len(world.goals):
            abort(404, f"no goal {_clip(digits)}; there are {len(world.goals)}")
        return world.goals[int(digits)]
    return random.Random(sid).choices(world.goals, weights=[g.weight for g in world.goals])[0]


def parse_options(text: str) -> dict[str, str]:
    if len(text) > MAX_OPTIONS_CHARS:
        abort(400, f"options must be a JSON object of at most {MAX_OPTIONS_CHARS} characters")
    try:
        options = json.loads(text or "{}")
    # JSONDecodeError is a ValueError, as is a number past int()'s digit limit; deep nesting recurses.
    except (ValueError, RecursionError):
        abort(400, "options must be a JSON object")
    if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
        abort(400, "options must be a JSON object of strings")
    return options


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def create_app(world: World, show_images: bool = False) -> Flask:
    """show_images: point <img> at the scraped image URLs. Off by default, so that a browser on a
    machine without internet (tests, workers) never reaches for another host."""
    app = Flask(__name__)
    app.jinja_loader = DictLoader(TEMPLATES)

    @app.context_processor
    def images():
        return {"image_src": lambda url: url if show_images and url else "data:,"}

    def navigation() -> tuple[tuple[str, ...], int, str]:
        query = request.args.get("q", "")
        page = request.args.get("page", "1")
        if not PAGE_NUMBER.fullmatch(page):
            abort(400, "page must be a positive integer of at most 9 digits")
        return search_keywords(query), int(page), query

    def product_or_404(asin: str):
        if asin not in world.catalog.by_asin:
            abort(404, f"no product {_clip(asin)}")
        return world.product(asin)

    @app.route("/")
    def index():
        return redirect(url_for("start", sid=f"s{random.getrandbits(40):010x}"))

    @app.route("/<sid>", methods=["GET", "POST"])
    def start(sid: str):
        goal = session_goal(world, sid)
        if request.method == "POST":
            # As the original site: the query is lowercased before it is split into keywords.
            return redirect(url_for("results", sid=sid, q=request.form.get("search_query", "").lower(), page=1))
        return render_template("start.html", sid=sid, instruction=goal.instruction_text)

    @app.route("/<sid>/results")
    def results(sid: str):
        goal = session_goal(world, sid)
        keywords, page_number, query = navigation()
        page = results_page(world, goal, keywords, page_number)
        return render_template("results.html", sid=sid, instruction=goal.instruction_text, page=page, query=query)

    @app.route("/<sid>/item/<asin>")
    def item(sid: str, asin: str):
        goal = session_goal(world, sid)
        keywords, page_number, query = navigation()
        options = parse_options(request.args.get("options", "{}"))
        page = ItemPage(goal.instruction_text, product_or_404(asin), keywords, page_number, options)
        image = next((page.product.option_images.get(v) for v in options.values()
                      if page.product.option_images.get(v)), page.product.main_image)
        return render_template(
            "item.html", sid=sid, instruction=goal.instruction_text, page=page, query=query, image=image,
            options=json.dumps(options), sub_pages=SUB_PAGES,
            with_option=lambda name, value: json.dumps({**options, name: value}),
        )

    @app.route("/<sid>/item/<asin>/<sub>")
    def sub_page(sid: str, asin: str, sub: str):
        goal = session_goal(world, sid)
        if sub not in SUB_PAGES:
            abort(404, f"no sub-page {_clip(sub)}; there are {', '.join(SUB_PAGES)}")
        keywords, page_number, query = navigation()
        options = parse_options(request.args.get("options", "{}"))
        page = SubPage(goal.instruction_text, product_or_404(asin), keywords, page_number, options, sub)
        return render_template("sub_page.html", sid=sid, instruction=goal.instruction_text, page=page,
                               query=query, options=json.dumps(options))

    @app.route("/<sid>/buy/<asin>", methods=["POST"])
    def buy(sid: str, asin: str):
        goal = session_goal(world, sid)
        product_or_404(asin)
        options = parse_options(request.form.get("options", "{}"))
        page = DonePage(asin, options, world.reward(goal, asin, options).value)
        return render_template("done.html", sid=sid, page=page, reward=repr(page.reward),
                               options_json=options_json(options))

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args, **kwargs) -> None:
        """Browser sessions make a request per step; the worker's log is no place for them."""


class SiteServer:
    """The site on a free localhost port, served from a daemon thread of this process."""

    def __init__(self, world: World, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = make_server(host, port, create_app(world), threaded=True, request_handler=_QuietHandler)
        self.base_url = f"http://{host}:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webshop-site", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()


@functools.lru_cache(maxsize=None)
def shared_site(world: World) -> SiteServer:
    """One site per world per process, shared by every browser session of the worker."""
    return SiteServer(world)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--data-dir", default=None, help="WebShop data (default $WEBSHOP_DATA, else synthetic)")
    parser.add_argument("--goals", default="synthetic", choices=("synthetic", "human"))
    parser.add_argument("--show-images", action="store_true", help="load product images from their hosts")
    args = parser.parse_args(argv)
    world = load_world(WorldConfig(data_dir=args.data_dir, goals=args.goals))
    create_app(world, show_images=args.show_images).run(host=args.host, port=args.port)


if __name__ == "__main__":
    main()
