"""The review console in a real browser: Debian's chromium, driven by Selenium through
/usr/bin/chromedriver (``make browser`` installs both; nothing is downloaded at run time), against
a ``cogproxy serve`` process whose policy sends a module answer to review. Takes the pictures
docs/review-console.md shows: into the test's own directory, or into docs/images/ when
``COGPROXY_CONSOLE_PICTURES=1`` (``make console-pictures``), so a test run leaves the clone as it
found it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.wait import WebDriverWait

from tests.conftest import ROOT
from tests.console.harness import ADMIN, CLIENT, envelope, send_to_review_at
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, free_port, proxy_process, upstream_policy
from tests.support.polling import eventually

CHROMEDRIVER = Path("/usr/bin/chromedriver")
IMAGES = ROOT / "docs" / "images"
PICTURES_ENV = "COGPROXY_CONSOLE_PICTURES"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REVIEW_INPUT = {"code": "def f(x):\n    return x\n", "language": "python"}
HOSTILE = '<script>window.pwned = 1</script><img src="x" onerror="window.pwned = 2">'
SIBLINGS = 10_000
LOAD_TIMEOUT_S = 10.0
"""A bound on a page load after a click (a condition polled, not a measurement)."""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    binary = _chromium()
    if binary is None or not CHROMEDRIVER.exists():
        pytest.skip(
            "chromium and chromium-driver are not installed here "
            "(make browser: apt-get install -y chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    except WebDriverException as exc:
        pytest.skip(f"chromium does not start here: {exc.msg}")
    try:
        yield driver
    finally:
        driver.quit()


def _hostile() -> dict[str, Any]:
    deep: Any = HOSTILE
    for _ in range(60):  # a model answer nests 64 levels at most (proxy.jsonshape.MAX_JSON_DEPTH)
        deep = {"a": deep}
    return envelope(
        0.91,
        summary=HOSTILE,
        rationale="javascript:window.pwned=3",
        link="javascript:window.pwned=3",
        deep=deep,
        many=[f"<i>{n}</i>" for n in range(SIBLINGS)],
    )


def _login(driver: webdriver.Chrome, url: str, key: str) -> None:
    driver.get(url + "/review/login")
    driver.find_element(By.ID, "key").send_keys(key)
    _submit(driver, driver.find_element(By.CSS_SELECTOR, "#login button").click)


def _submit(driver: webdriver.Chrome, act: Any) -> None:
    """``act()``, then wait for the page it leaves to be replaced by the next."""
    page = driver.find_element(By.TAG_NAME, "html")
    act()
    WebDriverWait(driver, LOAD_TIMEOUT_S).until(staleness_of(page))


def _pwned(driver: webdriver.Chrome) -> Any:
    return driver.execute_script("return window.pwned === undefined ? null : window.pwned;")


async def test_a_reviewer_judges_an_answer_in_the_browser(
    browser: webdriver.Chrome, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(upstream_policy(fake_upstream)))
    pictures = IMAGES if os.environ.get(PICTURES_ENV) == "1" else tmp_path
    admin_port = free_port()
    async with proxy_process(
        "--policy",
        str(policy),
        "--admin-port",
        str(admin_port),
        "--log-format",
        "json",
        env={"COGPROXY_API_KEYS": CLIENT, "COGPROXY_ADMIN_KEYS": ADMIN, UPSTREAM_KEY_ENV: UPSTREAM_KEY},
    ) as served:
        console = f"http://127.0.0.1:{admin_port}"
        plain = await send_to_review_at(served.url + "/v1", fake_upstream, envelope(0.82))
        hostile = await send_to_review_at(served.url + "/v1", fake_upstream, _hostile())
        driver = browser

        def browse(step: Any, *args: Any) -> Any:
            return asyncio.to_thread(step, *args)

        # No key, a client key: no console.
        await browse(driver.get, console + "/review/")
        assert driver.current_url.endswith("/review/login")
        await browse(_login, driver, console, CLIENT)
        assert "not an admin key" in driver.find_element(By.CSS_SELECTOR, ".error").text
        await browse(driver.get, console + "/review/")
        assert driver.current_url.endswith("/review/login")

        await browse(_login, driver, console, ADMIN)
        assert driver.current_url.endswith("/review/")
        rows = driver.find_elements(By.CSS_SELECTOR, "tr.item")
        assert len(rows) == 2 and plain in rows[0].text and hostile in rows[1].text
        assert driver.execute_script("return document.cookie").find("cogproxy_console=") == -1
        await browse(driver.save_screenshot, str(pictures / "review-console-queue.png"))

        # The hostile envelope renders as text, fast, and no script of it runs.
        await browse(driver.get, console + f"/review/items/key-{_hash(CLIENT)}/{hostile}")
        assert _pwned(driver) is None
        cells = driver.find_elements(By.CSS_SELECTOR, "#envelope td.v")
        assert any(cell.text == HOSTILE for cell in cells[:40])
        assert driver.find_elements(By.CSS_SELECTOR, "#envelope a, #envelope script, #envelope img") == []
        assert driver.find_element(By.ID, "omitted").is_displayed()  # 10,000 siblings: the table stops
        assert _pwned(driver) is None

        # Keyboard: "[" goes to the previous (the plain answer), "c" judges it correct.
        await browse(_submit, driver, lambda: driver.find_element(By.TAG_NAME, "body").send_keys("["))
        assert plain in driver.current_url
        await browse(_submit, driver, lambda: driver.find_element(By.TAG_NAME, "body").send_keys("c"))
        assert driver.current_url.endswith("/review/")
        rows = driver.find_elements(By.CSS_SELECTOR, "tr.item")
        assert len(rows) == 1 and hostile in rows[0].text and plain not in rows[0].text

        async with aiohttp.ClientSession() as s:

            async def scrape() -> str:
                async with s.get(console + "/metrics") as resp:
                    return await resp.text()

            scraped = await eventually(
                scrape, "the verdict counted", ready=lambda t: "cognitive_feedback_total{" in t
            )
        assert re.search(r'cognitive_feedback_total\{[^}]*verdict="correct"[^}]*\} 1\.0', scraped)

        # A form post without its CSRF token, from this logged-in browser: refused, the item stays.
        await browse(driver.get, console + "/review/")
        await browse(
            _submit,
            driver,
            lambda: driver.execute_script(
                "const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];"
                "const v = document.createElement('input'); v.name = 'verdict'; v.value = 'incorrect';"
                "f.appendChild(v); document.body.appendChild(f); f.submit();",
                console + f"/review/items/key-{_hash(CLIENT)}/{hostile}/verdict",
            ),
        )
        assert "CSRF" in driver.find_element(By.ID, "reason").text
        await browse(driver.get, console + "/review/")
        assert len(driver.find_elements(By.CSS_SELECTOR, "tr.item")) == 1

        await browse(driver.get, console + "/review/reliability")
        figure = driver.find_element(By.CSS_SELECTOR, "figure.diagram")
        assert "up/strong" in figure.text and "ECE 0.180" in figure.text  # one correct verdict at 0.82
        assert "0.180" in driver.find_element(By.ID, "report").text
        await browse(driver.save_screenshot, str(pictures / "review-console-reliability.png"))
    for name in ("review-console-queue.png", "review-console-reliability.png"):
        assert (pictures / name).read_bytes().startswith(PNG_MAGIC)
    assert ADMIN not in served.output[0] + served.output[1]
    audit = [
        json.loads(line) for line in "".join(served.output).splitlines() if "proxy.review_console" in line
    ]
    assert [(a["action"], a["result"]) for a in audit] == [
        ("login", "refused"),
        ("login", "done"),
        ("judge", "done"),
        ("csrf", "refused"),
    ]


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]
