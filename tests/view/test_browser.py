"""``ce view`` in a real headless Chromium (Debian's ``chromium`` and ``chromedriver``, driven
by Selenium): click from the sessions list to a session's timeline, to a model call's input and
decisions, to its replay under another budget and the diff, and read what the page shows.

Skips, saying why, when Selenium, Chromium or its driver is not installed (the nox session
``tests-view`` installs them). With ``CE_VIEW_SCREENSHOTS=docs/images`` it saves the pages it
visits as ``viewer-*.png`` there."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from view_demo import SESSION, XSS_SESSION, XSS_TEXT

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="the browser test needs selenium (pip install selenium)"
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WAIT = 60  # seconds a page may take to render before the test fails (an upper bound only)


def _find(names: tuple[str, ...]) -> str | None:
    return next((path for path in map(shutil.which, names) if path), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    binary, driver = _find(BROWSERS), _find(("chromedriver",))
    if binary is None or driver is None:
        pytest.skip(
            "no headless browser: the viewer's browser test needs Chromium and chromedriver "
            "(Debian: apt-get install chromium chromium-driver; nox -s tests-view installs "
            "them when it runs as root)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--hide-scrollbars",
    ):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def _ready(browser: Any, suffix: str) -> None:
    """Wait until the page has rendered the route ending in ``suffix``."""

    def rendered(driver: Any) -> bool:
        ready = driver.find_element(By.TAG_NAME, "body").get_attribute("data-ready")
        return bool(ready) and ready.endswith(suffix)

    WebDriverWait(browser, WAIT).until(rendered)


def _text(browser: Any, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def _shoot(browser: Any, folder: Path | None, name: str, css: str | None = None) -> None:
    """Save the whole page (or the element ``css``) as ``viewer-<name>.png`` in ``folder``."""
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"viewer-{name}.png"
    options: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
    if css is not None:
        box = browser.execute_script(
            "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
            "return [r.left + scrollX, r.top + scrollY, r.width, r.height];",
            css,
        )
        x, y, width, height = (float(v) for v in box)
        margin = 8.0
        options["clip"] = {
            "x": max(0.0, x - margin),
            "y": max(0.0, y - margin),
            "width": width + 2 * margin,
            "height": height + 2 * margin,
            "scale": 1,
        }
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", options)
    target.write_bytes(base64.b64decode(shot["data"]))


def test_click_through_a_session_to_a_replay(
    browser: Any, viewer_url: str, screenshots_dir: Path | None
) -> None:
    browser.get(viewer_url)
    _ready(browser, "#/")
    sessions = _text(browser, "#sessions")
    assert SESSION in sessions and XSS_SESSION in sessions
    row = _text(browser, f'#sessions tr[data-session="{SESSION}"]')
    assert "alice, planner, researcher" in row
    _shoot(browser, screenshots_dir, "sessions")

    # the session's timeline
    browser.find_element(By.LINK_TEXT, SESSION).click()
    _ready(browser, f"#/s/{SESSION}")
    assert _text(browser, "#session-title") == f"Session {SESSION}"
    messages = browser.find_elements(By.CSS_SELECTOR, "#timeline li.item.message")
    assert len(messages) == 13
    assert messages[1].text.startswith("user · alice")
    assert "Mail [REDACTED:email]." in messages[1].text
    marker = messages[1].find_element(By.CSS_SELECTOR, ".redacted")
    assert marker.text == "[REDACTED:email]"
    assert "assistant · planner" in messages[7].text
    alerts = messages[7].find_elements(By.CSS_SELECTOR, ".tool-request")[1].text
    assert alerts.startswith("→ alerts(") and "timeout" in alerts and "2,500 ms" in alerts
    calls = browser.find_elements(By.CSS_SELECTOR, "#timeline li.item.model-call")
    assert [c.text.split("\n")[0].split(" 2026")[0] for c in calls] == [
        "model call 1 (turn)",
        "model call 2 (call)",
        "model call 3 (turn)",
        "model call 4 (call)",
        "model call 5 (turn)",
    ]
    assert "input 597 of 620 tokens" in calls[4].text
    assert "degraded 1 (59 tok)" in calls[4].text and "dropped 1 (49 tok)" in calls[4].text
    assert "reply #12: scripted/demo-model · 860 prompt + 38 completion tokens · 1,240 ms" in (
        calls[4].text
    )
    friday = browser.find_element(
        By.XPATH, "//li[contains(@class,'evidence')][contains(., 'kb://friday')]"
    )
    assert "retrieval" in friday.text and "score 0.9" in friday.text
    paris = browser.find_element(
        By.XPATH, "//li[contains(@class,'evidence')][contains(., 'kb://paris')]"
    )
    assert "from tool call kb_search [call-kb-1] success" in paris.text
    assert "answer-2" in _text(browser, "#usage")
    _shoot(browser, screenshots_dir, "timeline")

    # model call 5: its decisions, evidences with provenance, and the input
    link = calls[4].find_element(By.CSS_SELECTOR, "a.call-link")
    route = "#" + link.get_attribute("href").split("#", 1)[1]
    link.click()
    _ready(browser, route)
    assert _text(browser, "#turn-title").startswith("Model call 5 of 5 (turn)")
    assert "597 of 620 input tokens used" in _text(browser, "#turn-budget")
    degraded = _text(browser, '#decisions tr[data-action="degraded"]')
    assert "gist" in degraded and "Pack layers" in degraded and "saved" in degraded
    dropped = _text(browser, '#decisions tr[data-action="dropped"]')
    assert "budget exhausted" in dropped and "Night trains" in dropped
    evidence = _text(browser, "#evidence-blocks")
    assert "degraded @gist rag_doc rag kb://packing · score 0.41" in evidence
    assert "dropped rag_doc rag kb://rail · score 0.64" in evidence
    assert "from tool call alerts [call-alerts-2] timeout" in evidence
    assert "exactly the stored decisions" in _text(browser, "#input-note")
    given = _text(browser, "#input")
    assert "Friday forecast: Paris 19°C and sunny" in given
    assert "Night trains" not in given and "[11 more sentences omitted]" in given
    assert len(browser.find_elements(By.CSS_SELECTOR, "#input .redacted")) == 2
    assert "assistant · researcher" in _text(browser, "#reply")
    _shoot(browser, screenshots_dir, "model-call")

    # replay under 450 tokens: totals, the decisions that changed, the diff
    budget = browser.find_element(By.ID, "replay-budget")
    budget.clear()
    budget.send_keys("450")
    browser.find_element(By.ID, "replay-run").click()
    _ready(browser, "/replay/450")
    WebDriverWait(browser, WAIT).until(lambda d: d.find_elements(By.ID, "replay-diff"))
    totals = _text(browser, "#replay-totals")
    assert "@ 820 tokens (stored)" in totals and "@ 450 tokens" in totals
    changes = browser.find_elements(By.CSS_SELECTOR, "#replay-changes tbody tr")
    friday_change = next(r.text for r in changes if "Friday forecast" in r.text)
    assert "kept @live dropped" in friday_change
    removed = [
        e.text for e in browser.find_elements(By.CSS_SELECTOR, "#replay-diff .diff-line.del")
    ]
    assert any("Friday forecast" in line for line in removed)
    assert browser.find_elements(By.CSS_SELECTOR, "#replay-diff .diff-line.head")
    _shoot(browser, screenshots_dir, "replay", "#replay-result")


def test_session_markup_shows_as_text(browser: Any, viewer_url: str) -> None:
    browser.get(viewer_url)
    _ready(browser, "#/")
    browser.find_element(By.LINK_TEXT, XSS_SESSION).click()
    _ready(browser, f"#/s/{XSS_SESSION}")
    [message] = browser.find_elements(By.CSS_SELECTOR, "#timeline li.item.message")
    assert XSS_TEXT in message.text
    assert browser.find_elements(By.CSS_SELECTOR, "#app img, #app script") == []
    assert browser.execute_script("return document.body.dataset.pwned") is None
