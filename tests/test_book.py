"""Checks of the book itself.

Fast: notebooks tracked by git carry no outputs; every chapter is a MyST notebook; the chapter times
table in README and the intro is the recorded one.
Slow: the HTML build (warnings are errors), and chapter 0 opened in headless Chromium with
all traffic kept on this machine: equations typeset, the cell-output figure shown, nothing
loaded from another host.

Run after `pytest --nbmake --overwrite build/book` (see tools/test) so that the build finds
the notebooks already executed and does not run them again.
"""

from __future__ import annotations

import os
import re
import runpy
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "book"
HTML = STAGE / "_build" / "html"
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
CHROMIUM = Path("/usr/bin/chromium")
PAGE = "00_getting_started.html"


# ---------------------------------------------------------------- fast checks


def test_no_notebook_is_tracked():
    """Chapters are MyST Markdown (book/NN_*.md); executed notebooks are build artifacts and stay out of git."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", "*.ipynb"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert not [name for name in listed.split("\0") if name], f"notebooks tracked by git: {listed}"


def test_every_chapter_mentioned_is_in_the_table_of_contents():
    """README, the library and the chapters mention only chapters that exist in book/_toc.yml, or say
    "(coming)" right after the number."""
    toc = (ROOT / "book" / "_toc.yml").read_text()
    listed = {int(m) for m in re.findall(r"file: (\d\d)_", toc)}
    texts = [ROOT / "README.md", *sorted((ROOT / "prge_lib").rglob("*.py")), *sorted((ROOT / "book").glob("*.md"))]
    missing = {}
    for path in texts:
        text = path.read_text()
        for match in re.finditer(r"[Cc]hapters? ((?:\d+(?:, | and | or |–|-))*\d+)", text):
            if text[match.end():match.end() + 9] == " (coming)":      # announced as not written yet
                continue
            for number in map(int, re.findall(r"\d+", match.group(1))):
                if number not in listed:
                    missing.setdefault(number, set()).add(path.relative_to(ROOT).as_posix())
    assert not missing, f"chapters mentioned but not in book/_toc.yml: {missing}"


def _front_matter(path: Path) -> dict:
    """The YAML front matter of a Markdown file ({} if there is none)."""
    match = re.match(r"---\n(.*?)\n---\n", path.read_text(), re.S)
    return yaml.safe_load(match.group(1)) if match else {}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_is_myst_notebook(chapter):
    """Each chapter carries jupytext front matter in the MyST format, with a kernel."""
    meta = _front_matter(chapter)
    representation = (meta.get("jupytext") or {}).get("text_representation") or {}
    assert representation.get("format_name") == "myst", f"{chapter.name}: no jupytext myst header"
    assert (meta.get("kernelspec") or {}).get("name"), f"{chapter.name}: no kernelspec"


def test_book_has_chapters():
    assert CHAPTERS, "no chapter book/NN_*.md found"


@pytest.mark.parametrize("page", ["README.md", "book/intro.md"])
def test_chapter_times_table_is_the_recorded_one(page):
    """The table of chapter execution times in README and the intro is the one
    data/results/book/chapter_times.json gives (tools/run_chapters.py --table)."""
    runner = runpy.run_path(str(ROOT / "tools" / "run_chapters.py"))
    expected = runner["table"](runner["read_times"]())
    assert runner["pasted"](ROOT / page) == expected, \
        f"{page}: the chapter times table is stale; run `python tools/run_chapters.py --paste`"


# ---------------------------------------------------------------- HTML build


@pytest.fixture(scope="module")
def html_dir() -> Path:
    """Build the HTML of the staged book once; fail with the tail of the build log."""
    stager = runpy.run_path(str(ROOT / "tools" / "stage_book.py"))
    if (STAGE / "_config.yml").exists():
        stager["write_config"]()  # keep notebooks run by nbmake, exclude them from execution
    else:
        stager["stage"]()
    exe = Path(sys.executable).with_name("jupyter-book")
    command = [str(exe) if exe.exists() else "jupyter-book", "build", "-W", "-n", "--keep-going", str(STAGE)]
    log = STAGE / "_build" / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = "\n".join(log.read_text().splitlines()[-60:])
        pytest.fail(f"jupyter-book build failed ({done.returncode}), see {log}:\n{tail}")
    return HTML


def test_html_build(html_dir):
    """The book builds with warnings as errors, with one page per chapter."""
    assert (html_dir / "index.html").exists()
    for chapter in CHAPTERS:
        assert (html_dir / f"{chapter.stem}.html").exists(), f"no page for {chapter.name}"


# ---------------------------------------------------------------- browser


class _Page(HTMLParser):
    """Collects what a page loads and the images inside cell outputs."""

    LOADS = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src"}

    def __init__(self, text: str):
        super().__init__()
        self.loads, self.output_images, self._divs = [], [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div":
            self._divs.append("cell_output" in (attrs.get("class") or "").split())
        if attrs.get(self.LOADS.get(tag, "")):
            self.loads.append((tag, attrs[self.LOADS[tag]]))
        if tag == "img" and any(self._divs):
            self.output_images.append(attrs.get("src", ""))

    def handle_endtag(self, tag):
        if tag == "div" and self._divs:
            self._divs.pop()


def _external(url: str) -> bool:
    return bool(re.match(r"(?i)(https?:)?//", url)) and not re.match(r"(?i)(https?:)?//127\.0\.0\.1[:/]", url)


@contextmanager
def _serve(folder: Path):
    """Serve a folder on 127.0.0.1 (free port); yield the base URL and the request log."""
    requests = []

    class Handler(SimpleHTTPRequestHandler):
        def log_request(self, code="-", size="-"):
            requests.append((self.path.split("?")[0], int(code)))

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    """A local port nobody listens on: the dead-end proxy for any non-local request."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium(url: str, profile: Path, *extra: str) -> str:
    """Run headless Chromium on url with the network cut off; return its stdout."""
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-extensions",
        f"--user-data-dir={profile}",
        # Loopback is never proxied; everything else goes to a closed local port, and
        # no host name resolves, so no request can leave the machine.
        f"--proxy-server=http://127.0.0.1:{_closed_port()}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--virtual-time-budget=15000", *extra, url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"chromium failed:\n{done.stderr[-3000:]}"
    return done.stdout


def test_chapter_renders_offline(html_dir, tmp_path):
    """Chapter 0 in a real browser: MathJax ran, the figure loads, nothing is fetched remotely."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (apt-get install chromium)")
        pytest.skip("needs /usr/bin/chromium (apt-get install chromium)")
    screenshot = STAGE / "_build" / "screenshot_00.png"
    with _serve(html_dir) as (base, requests):
        dom = _chromium(base + PAGE, tmp_path / "dom", "--dump-dom")
        _chromium(base + PAGE, tmp_path / "shot", f"--screenshot={screenshot}", "--window-size=1280,2400")
    html = (html_dir / PAGE).read_text()

    # (a) every equation of the page was typeset by MathJax, without TeX errors
    equations = len(re.findall(r'class="math notranslate nohighlight"', html))
    assert equations, "the chapter has no equation"
    assert len(re.findall(r"<mjx-container\b", dom)) >= equations, "MathJax did not typeset the page"
    assert "<mjx-merror" not in dom, "MathJax reported a TeX error"
    raw = re.findall(r'class="math[^"]*"[^>]*>\s*(\\\(|\\\[|\$\$|\\begin)', dom)
    assert not raw, f"untypeset math left in the page: {raw}"

    # (b) a figure from a cell output: a PNG file in the HTML folder, fetched by the browser
    pngs = [src for src in _Page(html).output_images if src.split("?")[0].endswith(".png")]
    assert pngs, "no PNG image in the chapter's cell outputs"
    for src in pngs:
        path = src.split("?")[0]
        assert (html_dir / path).is_file(), f"{src} missing from the HTML folder"
        assert ("/" + path, 200) in requests, f"the browser did not load {src}"

    # (c) nothing from another host, neither in the page nor added by its scripts
    external = [load for text in (html, dom) for load in _Page(text).loads if _external(load[1])]
    assert not external, f"page loads remote resources: {external}"
    missing = [r for r in requests if r[1] >= 400 and r[0] != "/favicon.ico"]
    assert not missing, f"local resources not found: {missing}"
    assert screenshot.exists()
