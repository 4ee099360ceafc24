"""Headless Chromium for the browser checks of the book (tests/test_book.py) and of JupyterLab
(tests/test_jupyterlab.py): one driver, `chromium --dump-dom`, with all traffic kept on this machine.

What a check needs beyond the serialized DOM (image sizes, the width of code blocks) is measured by a
probe script that `serve` adds to each HTML page it hands out; the probe writes its findings into the
page as JSON, where `probe_report` reads them back from the dumped DOM.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
from contextlib import contextmanager
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

# Raw MyST that a renderer left as text: a role ("{doc}" followed by its backticked target), a fenced
# directive, or a colon fence.
RAW_ROLE = re.compile(r"\{[A-Za-z][\w:+-]*\}`")
RAW_FENCE = re.compile(r"(?m)^[ \t]*(?:```|~~~|:::)[ \t]*(?:\{|$)")


def unavailable(message: str) -> None:
    """Skip a test that needs something not installed here; fail in CI, which installs everything."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must install it: {message}")
    pytest.skip(message)


def need_chromium() -> None:
    if not CHROMIUM.exists():
        unavailable("needs the package chromium (apt-get install chromium)")


class Page(HTMLParser):
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


class Prose(HTMLParser):
    """The text a reader sees in a DOM, for finding raw MyST: scripts, styles and templates are left
    out; `text` is what lies outside code blocks, with each inline `code` element read as "`C`" (so a
    role left raw, "{doc}" before its target rendered as code, reads "{doc}`C`", while prose that quotes
    MyST inside code does not match); `code` is the text of the code blocks (`pre`). `inside(classes)`
    picks the subtrees to read (default: all); `skip(classes)` drops subtrees inside them."""

    HIDDEN = {"script", "style", "template", "noscript", "title"}
    BLOCKS = {"p", "div", "li", "pre", "tr", "h1", "h2", "h3", "h4", "h5", "h6"}

    def __init__(self, dom: str, inside=lambda classes: True, skip=lambda classes: False):
        super().__init__()
        self.inside, self.skip = inside, skip
        self._text: list[str] = []
        self._code: list[str] = []
        self._stack: list[tuple[str, bool, bool, bool]] = []   # tag, reading, dropped, in pre
        self.feed(dom)

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def code(self) -> str:
        return "".join(self._code)

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        reading, dropped, in_pre = self._stack[-1][1:] if self._stack else (False, False, False)
        reading = reading or self.inside(classes)
        dropped = dropped or tag in self.HIDDEN or (reading and self.skip(classes))
        in_pre = in_pre or tag == "pre"
        if reading and not dropped:
            if tag == "code" and not in_pre:
                self._text.append("`C`")
                dropped = True
            elif tag in self.BLOCKS:
                (self._code if in_pre else self._text).append("\n")
        self._stack.append((tag, reading, dropped, in_pre))

    def handle_endtag(self, tag):
        while self._stack:                      # close what the tag closes, tolerating unclosed children
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if self._stack and self._stack[-1][1] and not self._stack[-1][2]:
            (self._code if self._stack[-1][3] else self._text).append(data)


def _around(text: str, match: re.Match) -> str:
    return text[max(0, match.start() - 40):match.end() + 40].strip()


def raw_myst(page: Prose) -> list[str]:
    """The pieces of raw MyST syntax a reader sees, each with a little context: roles in the text outside
    code blocks (code may hold "{name}`" in its strings), fences anywhere."""
    found = [_around(page.text, m) for m in RAW_ROLE.finditer(page.text)]
    for text in (page.text, page.code):
        found += [_around(text, m) for m in RAW_FENCE.finditer(text)]
    return found


def external(url: str) -> bool:
    return bool(re.match(r"(?i)(https?:)?//", url)) and not re.match(r"(?i)(https?:)?//127\.0\.0\.1[:/]", url)


# Measures, once the page and its fonts have loaded, what the DOM alone does not say: whether each image
# loaded, and whether each block of code or cell output (a code block, a printed text, an HTML table)
# fits its box or scrolls.
PROBE = """<script>
window.addEventListener("load", async () => {
  await document.fonts.ready;
  const fits = (el) => el.scrollWidth <= el.clientWidth + 1;
  const report = {
    images: [...document.images].map((img) => ({
      src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0})),
    blocks: [...document.querySelectorAll("pre, div.cell_output > .output")]
      .filter((el) => el.offsetParent !== null).map((el) => ({
        printed: el.tagName === "PRE" && el.closest(".cell_output") !== null,
        fits: fits(el),
        scrolls: ["auto", "scroll"].includes(getComputedStyle(el).overflowX),
        start: el.textContent.trim().slice(0, 60)})),
    links: [...document.querySelectorAll("a[href]")].map((a) => a.getAttribute("href")),
  };
  const out = document.createElement("script");
  out.type = "application/json";
  out.id = "prge-probe";
  out.textContent = JSON.stringify(report).replace(/</g, "\\\\u003c");
  document.body.appendChild(out);
});
</script>"""


def probe_report(dom: str) -> dict:
    """What PROBE wrote into a dumped DOM; fails if it did not run."""
    match = re.search(r'<script type="application/json" id="prge-probe">(.*?)</script>', dom, re.S)
    assert match, "the page's probe did not run (the page did not finish loading)"
    return json.loads(match.group(1))


@contextmanager
def serve(folder: Path, probe: bool = False):
    """Serve a folder on 127.0.0.1 (free port); yield the base URL and the request log. With probe=True,
    every HTML page is handed out with PROBE before its </body>."""
    requests = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            path = Path(self.translate_path(self.path))
            if not (probe and path.suffix == ".html" and path.is_file()):
                return super().do_GET()
            body = path.read_bytes().replace(b"</body>", PROBE.encode() + b"</body>", 1)
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

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


def free_port() -> int:
    """A local port nobody listens on now: for a server to start on, or as the dead-end proxy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium(url: str, profile: Path, *extra: str, budget_ms: int = 15000, timeout: int = 180) -> str:
    """Run headless Chromium on url with the network cut off; return its stdout. `budget_ms` is the
    virtual time the page gets (timers run ahead of the clock while nothing loads)."""
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-extensions",
        f"--user-data-dir={profile}",
        # Loopback is never proxied; everything else goes to a closed local port, and
        # no host name resolves, so no request can leave the machine.
        f"--proxy-server=http://127.0.0.1:{free_port()}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--virtual-time-budget={budget_ms}", *extra, url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"chromium failed:\n{done.stderr[-3000:]}"
    return done.stdout
