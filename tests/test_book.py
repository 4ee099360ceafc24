"""Checks of the book itself.

Fast: notebooks tracked by git carry no outputs; every chapter is a MyST notebook; the chapter times
table in README and the intro is the recorded one.
Slow: the HTML build (warnings are errors); chapter 0 opened in headless Chromium with all traffic
kept on this machine: equations typeset, the cell-output figure shown, nothing loaded from another
host; and every page (the intro and each chapter) in the same browser: no raw MyST left as text, every
image loaded, every internal link resolving to a page and anchor of the build, every code block
fitting its box or scrolling, output blocks wrapped (book/_static/wrap-outputs.css).

Run after `pytest --nbmake --overwrite build/book` (see tools/test) so that the build finds
the notebooks already executed and does not run them again.
"""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import yaml

from browser import Page, Prose, chromium, external, need_chromium, probe_report, raw_myst, serve

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "book"
HTML = STAGE / "_build" / "html"
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
PAGE = "00_getting_started.html"
PAGES = ["intro", *(chapter.stem for chapter in CHAPTERS)]


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


def test_raw_myst_is_found_as_a_reader_sees_it():
    """The raw-MyST check of the browser tests finds a role left as text (its target rendered as code),
    a fenced directive and a colon fence; MyST quoted inside inline code, braces in prose or code, and
    scripts do not count."""
    shown = ("<p>{doc}<code>Chapter 2 &lt;02_rge&gt;</code> showed</p>"
             "<pre>```{code-cell} ipython3\nx = 1</pre><div><p>:::{note}</p></div>")
    assert len(raw_myst(Prose(shown))) == 3, Prose(shown).text
    quiet = ("<p>the role <code>{eval}`f'{key:.2f}'`</code>, a set {1, 2}, a name {q}</p>"
             "<pre>print(f\"{q}`\")</pre><script>let s = '{doc}`x`';</script>")
    assert raw_myst(Prose(quiet)) == []


def test_broken_links_are_found(tmp_path):
    """The link check of the browser tests: a missing page or anchor is reported; pages and anchors that
    exist, anchors added to the page by its scripts, and links to other hosts are not."""
    (tmp_path / "a.html").write_text('<h1 id="top">A</h1>')
    (tmp_path / "b.html").write_text('<h1 id="start">B</h1>')
    hrefs = ["a.html", "a.html#top", "#start", "#added", "./b.html#start", "https://example.org/x.html",
             "mailto:x@y.z", "a.html#gone", "c.html", "#gone"]
    broken = _broken_links(hrefs, "b.html", '<h1 id="start">B</h1><p id="added"></p>', tmp_path)
    assert broken == ["a.html#gone (no anchor #gone in a.html)", "c.html (no file c.html)",
                      "#gone (no anchor #gone in b.html)"]


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


def test_chapter_renders_offline(html_dir, tmp_path):
    """Chapter 0 in a real browser: MathJax ran, the figure loads, nothing is fetched remotely."""
    need_chromium()
    screenshot = STAGE / "_build" / "screenshot_00.png"
    with serve(html_dir) as (base, requests):
        dom = chromium(base + PAGE, tmp_path / "dom", "--dump-dom")
        chromium(base + PAGE, tmp_path / "shot", f"--screenshot={screenshot}", "--window-size=1280,2400")
    html = (html_dir / PAGE).read_text()

    # (a) every equation of the page was typeset by MathJax, without TeX errors
    equations = len(re.findall(r'class="math notranslate nohighlight"', html))
    assert equations, "the chapter has no equation"
    assert len(re.findall(r"<mjx-container\b", dom)) >= equations, "MathJax did not typeset the page"
    assert "<mjx-merror" not in dom, "MathJax reported a TeX error"
    raw = re.findall(r'class="math[^"]*"[^>]*>\s*(\\\(|\\\[|\$\$|\\begin)', dom)
    assert not raw, f"untypeset math left in the page: {raw}"

    # (b) a figure from a cell output: a PNG file in the HTML folder, fetched by the browser
    pngs = [src for src in Page(html).output_images if src.split("?")[0].endswith(".png")]
    assert pngs, "no PNG image in the chapter's cell outputs"
    for src in pngs:
        path = src.split("?")[0]
        assert (html_dir / path).is_file(), f"{src} missing from the HTML folder"
        assert ("/" + path, 200) in requests, f"the browser did not load {src}"

    # (c) nothing from another host, neither in the page nor added by its scripts
    remote = [load for text in (html, dom) for load in Page(text).loads if external(load[1])]
    assert not remote, f"page loads remote resources: {remote}"
    missing = [r for r in requests if r[1] >= 400 and r[0] != "/favicon.ico"]
    assert not missing, f"local resources not found: {missing}"
    assert screenshot.exists()


def _ids(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def _broken_links(hrefs: list[str], page: str, dom: str, html_dir: Path) -> list[str]:
    """The links of a page to this build that point at no file, or at an anchor the target lacks."""
    base = f"http://127.0.0.1/{page}"
    broken = []
    for href in hrefs:
        url = urlsplit(urljoin(base, href))
        if url.scheme not in {"http", "https"} or url.netloc != "127.0.0.1" or external(href):
            continue                                         # another host, mailto:, javascript:
        target = html_dir / url.path.lstrip("/")
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{href} (no file {url.path.lstrip('/')})")
        elif url.fragment and url.fragment not in _ids(dom if target.name == page else target.read_text()):
            broken.append(f"{href} (no anchor #{url.fragment} in {target.name})")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_page_reads_well_in_a_browser(html_dir, tmp_path, page):
    """One page of the book in headless Chromium, 1280 px wide: no MyST role, directive or colon fence
    left as text; every image loaded (naturalWidth > 0); every link into the build resolves to an
    existing file and anchor; every code block and cell output fits its box or scrolls, and printed
    outputs fit (the book's CSS wraps their long lines)."""
    need_chromium()
    name = f"{page}.html"
    with serve(html_dir, probe=True) as (base, _):
        dom = chromium(base + name, tmp_path / "profile", "--dump-dom", "--window-size=1280,2000")
    report = probe_report(dom)

    raw = raw_myst(Prose(dom))
    assert not raw, f"{name}: raw MyST shown as text: {raw}"
    missing = [image["src"] for image in report["images"] if not image["loaded"]]
    assert not missing, f"{name}: images not shown: {missing}"
    broken = _broken_links(report["links"], name, dom, html_dir)
    assert not broken, f"{name}: broken links: {broken}"
    cut = [block["start"] for block in report["blocks"] if not block["fits"] and not block["scrolls"]]
    assert not cut, f"{name}: code or output blocks cut off (wider than their box, no scrollbar): {cut}"
    unwrapped = [block["start"] for block in report["blocks"] if block["printed"] and not block["fits"]]
    assert not unwrapped, f"{name}: printed outputs wider than their box (lines not wrapped): {unwrapped}"
