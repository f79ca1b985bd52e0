"""The dashboard in a real browser (marker ``browser``, ``make test-browser``): the generated ``index.html`` opened
in Debian's headless Chromium (driven by playwright, which never downloads a browser of its own here).

Asserted, at desktop and at phone width: every image loads, every counterexample link (and every other link to a
file of the report) resolves to a file of the report, the findings row of the table (H.16, eq 48 a FINDING) is
visible and highlighted, the page has a "Findings" section, the screenshot is not blank, and at phone width the page
does not overflow sideways (the wide table scrolls inside its own box). The screenshots are kept with the report
(``screenshot.png``, ``screenshot-phone.png``).

The report is a subset of the statements (H.9, H.16, H.29: a finding, a counterexample file and figures) made in a
temporary folder; ``PREFALIGN_BROWSER_REPORT=DIR`` checks an existing report instead, e.g. the full default
dashboard of ``make report`` (``PREFALIGN_BROWSER_REPORT=reports make test-browser``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("PREFALIGN_CHROMIUM", "/usr/bin/chromium")
#: Chromium's flags on a machine without a display, a sandbox or a network (no background connections).
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
SUBSET = ["H.9", "H.16", "H.29"]
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    given = os.environ.get("PREFALIGN_BROWSER_REPORT")
    if given:
        out = Path(given).resolve()
        assert (out / "index.html").is_file(), f"PREFALIGN_BROWSER_REPORT={given}: no index.html there"
        return out
    from verification.__main__ import main

    out = tmp_path_factory.mktemp("dashboard") / "report"
    assert main(["report", *SUBSET, "--out", str(out), "--no-studies"]) == 0
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.fail(f"Chromium not found at {CHROMIUM}: install Debian's chromium (make chromium) or set "
                    "PREFALIGN_CHROMIUM")
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                    args=CHROMIUM_ARGS)
        yield ctx
        ctx.close()


def _open(browser, report: Path, viewport, mobile: bool = False):
    page = browser.new_page()
    page.set_viewport_size(viewport)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto((report / "index.html").as_uri(), wait_until="load")
    return page, errors


def _not_blank(png: Path) -> None:
    from matplotlib.image import imread

    img = imread(png)[..., :3]
    assert img.shape[0] > 200 and img.shape[1] > 200
    ink = (img.min(axis=-1) < 0.9).mean()  # share of pixels that are not near-white
    assert ink > 0.01 and img.std() > 0.02, f"{png.name} looks blank (ink {ink:.4f}, std {img.std():.4f})"
    assert len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 16


def _local_links(page) -> list[str]:
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    return [h for h in hrefs if not urlsplit(h).scheme and not h.startswith("#")]


def test_images_links_findings_and_screenshot(browser, report):
    page, errors = _open(browser, report, {"width": 1400, "height": 1000})
    images = page.eval_on_selector_all(
        "img", "els => els.map(e => ({src: e.getAttribute('src'), ok: e.complete && e.naturalWidth > 0}))")
    assert images, "the dashboard shows no figure"
    assert [i["src"] for i in images if not i["ok"]] == [], "images that did not load"
    links = _local_links(page)
    cex = [h for h in links if h.startswith("counterexamples/")]
    assert cex, "no counterexample link (H.16 shows its counterexamples)"
    missing = [h for h in links if not (report / unquote(urlsplit(h).path)).is_file()]
    assert missing == [], f"links to files that are not in the report: {missing}"
    row = page.locator("tr.finding").first
    assert row.is_visible() and "H.16" in row.inner_text()
    colour = row.evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)"), "the findings row is not highlighted"
    assert page.locator("h2", has_text="Findings").is_visible()
    findings = page.locator("h2:has-text('Findings') + ul").inner_text()
    assert "H.16 (verdict finding)" in findings and not set("`*") & set(findings), "markup shown as text"
    assert "`" not in page.inner_text("body"), "Markdown code marks shown as text"
    shot = report / "screenshot.png"
    page.screenshot(path=str(shot), full_page=True)
    _not_blank(shot)
    assert errors == []
    page.close()


def test_phone_width(browser, report):
    page, errors = _open(browser, report, PHONE)
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page is {overflow} px wider than a {PHONE['width']} px phone screen"
    row = page.locator("tr.finding").first
    row.scroll_into_view_if_needed()
    box = row.bounding_box()
    assert row.is_visible() and box is not None and box["x"] >= 0 and box["x"] < PHONE["width"]
    # the main table is wider than the phone: it scrolls inside its own box, which fits the screen
    box_w, table_w = page.eval_on_selector("div.scroll", "e => [e.clientWidth, e.scrollWidth]")
    assert box_w <= PHONE["width"] and table_w > box_w
    shot = report / "screenshot-phone.png"
    page.screenshot(path=str(shot), full_page=False)
    _not_blank(shot)
    assert errors == []
    page.close()
