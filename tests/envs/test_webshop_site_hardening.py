"""The WebShop site under odd requests, through a real HTTP client against the real site on a port: every
parameter of every route, one at a time, gets values that once made it answer 500; each must be a 4xx with
a short reason (or an ordinary page), never a server error."""

from __future__ import annotations

import json

import httpx
import pytest

from env_server.envs.webshop.site import SiteServer
from webshop_fixtures import synthetic_world

DEEP = 5000
HOSTILE = {
    # The three 500s of issue 19 first, then their relatives.
    "page": ["²", "٣", "9" * 5000, "99999999999999999999", "0", "-1", "1e3", "", " 1", "1.0", "0x10"],
    # (Objects nest 3,000 deep here: 5,000 would pass the URL length limit of the client, not the site's.)
    "options": ["[" * DEEP + "]" * DEEP, '{"a":' * 3000 + '"b"' + "}" * 3000, '{"a": 1' + "0" * 5000 + "}",
                '{"a": NaN}', "NaN", '"text"', "[]", "null", '{"a": 1}', '{"a": {"b": "c"}}', "{", "x" * 20000,
                '{"' + "k" * 5000 + '": "v"}', '{"a": "\\ud800"}'],
    "sid": ["fixed_" + "9" * 5000, "fixed_99999999999", "fixed_²", "fixed_٣", "fixed_-1", "x" * 5000, "fixed_",
            "%00", "fixed_0%00"],
    "asin": ["x" * 5000, "..", "%00", "²", "S000000000%20"],
    "sub": ["x" * 5000, "description", "..", "%00"],
    "q": ["²", "a " * 5000, "\x00", "%ff%fe", "  ", "<script>"],
    "search_query": ["²", "a " * 5000, "\x00", ""],
}


@pytest.fixture(scope="module")
def site():
    world = synthetic_world()
    server = SiteServer(world)
    with httpx.Client(base_url=server.base_url, timeout=30, follow_redirects=False) as client:
        yield client, world
    server.stop()


def routes(asin: str) -> list[tuple[str, str, dict[str, str]]]:
    """(method, path template, parameters) of every route, with valid values for each parameter."""
    nav = {"q": "shirt", "page": "1"}
    return [
        ("GET", "/{sid}", {"sid": "fixed_0"}),
        ("POST", "/{sid}", {"sid": "fixed_0", "search_query": "shirt"}),
        ("GET", "/{sid}/results", {"sid": "fixed_0", **nav}),
        ("GET", "/{sid}/item/{asin}", {"sid": "fixed_0", "asin": asin, **nav, "options": "{}"}),
        ("GET", "/{sid}/item/{asin}/{sub}", {"sid": "fixed_0", "asin": asin, "sub": "Description", **nav,
                                             "options": "{}"}),
        ("POST", "/{sid}/buy/{asin}", {"sid": "fixed_0", "asin": asin, "options": "{}"}),
    ]


def send(client: httpx.Client, method: str, template: str, params: dict[str, str]) -> httpx.Response:
    in_path = {name for name in ("sid", "asin", "sub") if "{" + name + "}" in template}
    path = template.format(**{name: params[name] for name in in_path})
    rest = {name: value for name, value in params.items() if name not in in_path}
    if method == "POST":
        return client.post(path, data=rest)
    return client.get(path, params=rest)


def assert_short_client_error(response: httpx.Response, reason: str) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert reason in response.text and len(response.text) < 2000


def test_valid_requests_are_answered(site):
    client, world = site
    for method, template, params in routes(world.catalog.products[0].asin):
        assert send(client, method, template, params).status_code in (200, 302), template


def test_a_page_number_of_unicode_digits_is_a_400(site):
    client, _ = site
    response = client.get("/fixed_0/results", params={"q": "shirt", "page": "²"})
    assert_short_client_error(response, "page must be a positive integer")


def test_options_nested_thousands_deep_are_a_400(site):
    client, world = site
    asin = world.catalog.products[0].asin
    response = client.get(f"/fixed_0/item/{asin}", params={"options": "[" * DEEP + "]" * DEEP})
    assert_short_client_error(response, "options must be a JSON object")
    response = client.post(f"/fixed_0/buy/{asin}", data={"options": '{"a":' * DEEP + '"b"' + "}" * DEEP})
    assert_short_client_error(response, "options must be a JSON object")


def test_a_goal_number_of_thousands_of_digits_is_a_404(site):
    client, world = site
    response = client.get("/fixed_" + "9" * 5000)
    assert_short_client_error(response, f"there are {len(world.goals)}")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_no_parameter_of_any_route_makes_a_server_error(site, name):
    client, world = site
    sent = 0
    for method, template, valid in routes(world.catalog.products[0].asin):
        if name not in valid:
            continue
        for value in HOSTILE[name]:
            response = send(client, method, template, {**valid, name: value})
            assert response.status_code < 500, (method, template, name, value[:40], response.text[:300])
            if response.status_code >= 400:
                assert len(response.text) < 2000, (template, name, value[:40])
            sent += 1
    assert sent >= len(HOSTILE[name])


def test_options_are_echoed_back_as_json_of_strings_only(site):
    client, world = site
    product = next(p for p in world.catalog.products if p.options)
    name, values = next(iter(product.options.items()))
    chosen = json.dumps({name: values[0]})
    page = client.get(f"/fixed_0/item/{product.asin}", params={"q": "x", "page": "1", "options": chosen})
    assert page.status_code == 200 and "checked" in page.text


def test_percent_encoded_bytes_that_are_not_utf8_are_no_server_error(site):
    client, world = site
    asin = world.catalog.products[0].asin
    for path in ("/fixed_0/results?q=%ff%fe&page=1", "/fixed_0/results?q=a&page=%ff",
                 f"/fixed_0/item/{asin}?q=a&page=1&options=%ff", f"/fixed_0/item/{asin}/%ff?q=a&page=1",
                 f"/fixed_%ff/item/{asin}", "/%ff%fe"):
        response = client.get(path)
        assert response.status_code < 500 and len(response.text) < 20000, path
