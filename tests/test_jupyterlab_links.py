"""A reader in JupyterLab clicks a link between chapters and the linked chapter opens.

JupyterLab runs as in tests/test_jupyterlab.py (local, a token, temporary settings); Playwright drives the system
Chromium (no browser of its own is downloaded), with every host other than this machine unreachable. Chapter 5
opens as a notebook; its first link, "Chapter 2", is clicked, and a tab for 02_rge.md must appear and be the one
shown.
"""

from __future__ import annotations

import importlib.util

from browser import CHROMIUM, need_chromium, unavailable
from test_jupyterlab import CHAPTER, _need_jupyterlab_myst, jupyterlab

TARGET = "02_rge.md"
WAIT_MS = 180_000        # the first render of a chapter on a busy 2-core machine


def test_a_link_between_chapters_opens_the_chapter_in_jupyterlab(tmp_path):
    need_chromium()
    _need_jupyterlab_myst()
    if importlib.util.find_spec("playwright") is None:
        unavailable("needs the package playwright (bash tools/setup.sh, or pip install -e '.[test]')")
    from playwright.sync_api import sync_playwright

    with jupyterlab(tmp_path) as (base, token), sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.goto(f"{base}lab/tree/{CHAPTER}?token={token}")
            link = page.locator(".jp-MarkdownCell a", has_text="Chapter 2").first
            link.wait_for(state="visible", timeout=WAIT_MS)
            assert link.get_attribute("href").split("?")[0].endswith(f"/book/{TARGET}"), \
                f"the link points at {link.get_attribute('href')!r}, not at the chapter file {TARGET}"
            link.click()
            opened = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel",
                                  has_text=TARGET)
            opened.wait_for(state="visible", timeout=WAIT_MS)
            labels = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tabLabel").all_inner_texts()
            assert TARGET in labels and CHAPTER.split("/")[-1] in labels, f"open tabs: {labels}"
        finally:
            browser.close()
