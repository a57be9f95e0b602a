"""A real headless Chromium (Debian's chromium and chromium-driver), driven by Selenium,
for the admin pages people look at. Tests that use it skip, saying so, without them.

    def test_page(admin_browser, live_server):
        admin_browser.get(live_server.url + "/admin/...")
        shot = screenshot(admin_browser, "overview")   # saved, and checked not blank
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
# where screenshots are kept for a person to open (CI prints the folder)
SCREENSHOT_DIR = Path(os.environ.get("SCREENSHOT_DIR", tempfile.gettempdir())) / "webhook-screens"
WINDOW = (1400, 1000)


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture
def browser() -> Iterator[object]:
    missing = _missing()
    if missing:
        pytest.skip(f"needs a headless browser: {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # flags for a closed network and a root user; the profile is new and empty
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def admin_browser(browser, live_server, admin_user) -> object:
    """The browser, logged in as a superuser (pytest-django's admin_user, password
    "password") through the admin's own login form."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys(admin_user.username)
    browser.find_element(By.NAME, "password").send_keys("password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # the click returns before the browser has followed the redirect
    WebDriverWait(browser, 15).until(lambda d: "/admin/login/" not in d.current_url)
    assert "/admin/login/" not in browser.current_url, "admin login failed"
    return browser


def screenshot(driver, name: str) -> Path:
    """Save a PNG of the whole window and fail if it is blank (one colour throughout)."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    png = driver.get_screenshot_as_png()
    path.write_bytes(png)
    assert distinct_colours(png) > 8, f"screenshot {path} is blank"
    return path


def distinct_colours(png: bytes) -> int:
    """How many colours a screenshot holds, from a small PNG decoder (8-bit RGB or RGBA,
    as Chromium writes them), so that no imaging library is needed."""
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    depth, colour_type = png[24], png[25]
    assert depth == 8 and colour_type in (2, 6), "not an 8-bit RGB(A) PNG"
    bpp = 4 if colour_type == 6 else 3
    data, pos = bytearray(), 8
    while pos < len(png):
        length = int.from_bytes(png[pos : pos + 4], "big")
        if png[pos + 4 : pos + 8] == b"IDAT":
            data += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(bytes(data))
    stride = width * bpp
    previous = bytearray(stride)
    colours: set[bytes] = set()
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, up_left = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                near = left if pa <= pb and pa <= pc else up if pb <= pc else up_left
                line[i] = (line[i] + near) & 0xFF
        previous = line
        if row % 7 == 0:  # a sample of rows is enough to tell a page from a blank one
            colours.update(bytes(line[i : i + 3]) for i in range(0, stride, bpp * 5))
    return len(colours)


def click_through(driver, element) -> None:
    """Click, and wait for the page the click leads to: a click returns before the
    browser has navigated. While it navigates, chromedriver may answer a look at the old
    page with "unhandled inspector error" (its context is going) rather than "stale":
    that is asked again, not raised."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    wait = WebDriverWait(driver, 15, ignored_exceptions=(WebDriverException,))
    wait.until(expected_conditions.staleness_of(page))


def no_sideways_scroll(driver, box: str | None = "#changelist .results") -> None:
    """Neither the page nor ``box`` (by default the admin's results table, which it wraps
    in a scrolling box; None: the page alone) is wider than what it shows."""
    page, window = driver.execute_script(
        "return [document.documentElement.scrollWidth, window.innerWidth]"
    )
    assert page <= window, (page, window)
    if box:
        inner, shown = driver.execute_script(
            f"const r = document.querySelector('{box}'); return [r.scrollWidth, r.clientWidth]"
        )
        assert inner <= shown, (inner, shown)
