"""Browser mode: play WebShop through the real web site (site.py) with selenium driving headless
Debian chromium + chromedriver. Observations are read from the browser's DOM exactly as the text
mode reads its pages, so the two modes show the same text for the same actions.
"""

from __future__ import annotations

import shutil
import tempfile
from urllib.parse import urlencode, urlparse

from env_server.envs.webshop.dom import read_page
from env_server.envs.webshop.pages import SEARCH, Screen, parse_action, render_text
from env_server.envs.webshop.world import World

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
)
PAGE_LOAD_TIMEOUT_S = 20
# (first path part after the session id, number of parts after it) -> page kind; routes in site.py.
_PAGE_KINDS = {("results", 1): "results", ("item", 2): "item", ("item", 3): "sub", ("buy", 2): "done"}


def chromium_executables() -> tuple[str, str] | None:
    """(chromium, chromedriver) from PATH, or None when either is missing (`make browser-deps`)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def page_kind(url: str) -> str:
    after_session = urlparse(url).path.strip("/").split("/")[1:]
    if not after_session:
        return "start"
    return _PAGE_KINDS.get((after_session[0], len(after_session)), "unknown")


class BrowserSession:
    """One chromium instance, reused across the episodes of one env instance."""

    def __init__(self, world: World) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        from env_server.envs.webshop.site import shared_site

        executables = chromium_executables()
        if executables is None:
            raise RuntimeError("browser mode needs chromium and chromedriver on PATH (make browser-deps)")
        self._base_url = shared_site(world).base_url
        self._profile = tempfile.mkdtemp(prefix="limen-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = executables[0]
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={self._profile}"):
            options.add_argument(flag)
        try:
            self._driver = webdriver.Chrome(options=options, service=Service(executable_path=executables[1]))
        except Exception:
            shutil.rmtree(self._profile, ignore_errors=True)
            raise
        self._driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
        self._sid = ""

    def start(self, goal_index: int) -> None:
        self._sid = f"fixed_{goal_index}"
        self._driver.get(f"{self._base_url}/{self._sid}")

    def act(self, action: str) -> bool:
        """Apply one action as the text mode would; False when it is ignored."""
        name, argument = parse_action(action)
        if name == "search" and argument:
            self._search(argument)
            return True
        if name == "click" and argument != SEARCH.lower():
            element = self._clickable_elements().get(argument)
            if element is not None:
                self._navigate(element.click)
                return True
        return False

    def screen(self) -> Screen:
        reading = read_page(self._driver.page_source)
        kind = page_kind(self._driver.current_url)
        score = None
        if kind == "done":
            score = float(self._text_of(self._driver.find_element("css selector", "#reward pre")))
        return Screen(render_text(reading.nodes), reading.clickables, kind, score)

    def close(self) -> None:
        try:
            self._driver.quit()
        finally:
            shutil.rmtree(self._profile, ignore_errors=True)

    # ---- helpers ----------------------------------------------------------------------------------
    def _search(self, argument: str) -> None:
        boxes = self._driver.find_elements("css selector", "#search_input")
        if boxes:
            # Set the value by script: chromedriver cannot type characters outside the BMP.
            self._driver.execute_script("arguments[0].value = arguments[1];", boxes[0], argument)
            button = self._driver.find_element("css selector", "form .btn")
            self._navigate(button.click)
        else:
            # Pages without a search box: go where the box would have sent us (the text mode
            # accepts search[...] on every page).
            query = urlencode({"q": argument, "page": 1})
            self._driver.get(f"{self._base_url}/{self._sid}/results?{query}")

    def _clickable_elements(self) -> dict:
        """Text -> element with the original's precedence: buttons, product links, then radios,
        a later element taking over a repeated text."""
        find = self._driver.find_elements
        targets = {}
        for element in find("css selector", ".btn") + find("css selector", ".product-link"):
            targets[self._text_of(element).lower()] = element
        for radio in find("css selector", "input[type=radio]"):
            targets[radio.get_attribute("value")] = radio
        return targets

    def _navigate(self, trigger) -> None:
        """Run a click that loads a new page, and wait until that page has loaded.

        The old page is marked with a window property; a new document has a fresh window object, so
        the mark's absence plus readyState "complete" means the new page is in. Chromedriver answers
        mid-navigation with assorted errors ("node does not belong to the document", "execution
        context destroyed"), so those are retried until the page settles or the timeout hits.
        """
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.support.wait import WebDriverWait

        self._driver.execute_script("window.__limenOldPage = true;")
        trigger()
        WebDriverWait(self._driver, PAGE_LOAD_TIMEOUT_S, ignored_exceptions=(WebDriverException,)).until(
            lambda driver: driver.execute_script(
                "return window.__limenOldPage === undefined && document.readyState === 'complete';"
            )
        )

    @staticmethod
    def _text_of(element) -> str:
        return element.get_attribute("textContent")
