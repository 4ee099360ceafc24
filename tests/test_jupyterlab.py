"""The reader's other path: a chapter opened in JupyterLab renders its MyST (jupyterlab-myst), offline.

JupyterLab starts on 127.0.0.1 (a free port, a token, no browser of its own, settings, workspaces and
runtime files in a temporary folder) and is stopped at the end; headless Chromium (tests/browser.py)
opens book/05_outer_loop.md there as a notebook (jupytext) with all traffic kept on this machine, and
the rendered cells are read from its DOM. A second test opens a notebook executed as tools/run_chapters.py
executes the chapters and finds the numbers of its `{eval}` roles shown.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import jupytext
import nbformat

from browser import Page, Prose, chromium, external, free_port, need_chromium, raw_myst, unavailable

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "book/05_outer_loop.md"
START_S = 120       # JupyterLab's start on a busy machine

# User settings of the temporary JupyterLab: Markdown opens as a notebook (jupytext), every cell is
# rendered (no windowing), no news or update checks.
SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {
        "defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def _need_jupyterlab_myst() -> None:
    if importlib.util.find_spec("jupyterlab_myst") is None:
        unavailable("needs the package jupyterlab-myst (bash tools/setup.sh, or pip install -e '.[book]')")


@contextmanager
def jupyterlab(folder: Path, root: Path = ROOT):
    """JupyterLab serving `root` (the repository); yields its base URL and token, stops it (and its kernels)."""
    for name, values in SETTINGS.items():
        path = folder / "settings" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(folder / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(folder / "workspaces"), "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
           "JUPYTER_CONFIG_DIR": str(folder / "config"), "IPYTHONDIR": str(folder / "ipython")}
    port, token = free_port(), secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", "--LabApp.extension_manager=readonly"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = folder / "jupyterlab.log"
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert server.poll() is None, f"JupyterLab exited ({server.returncode}):\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{base}api/status?token={token}", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"JupyterLab not up in {START_S} s:\n{log.read_text()[-3000:]}"
                time.sleep(1)
        yield base, token
    finally:
        server.terminate()                      # the server shuts its kernels down on SIGTERM
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


def test_chapter_renders_myst_in_jupyterlab(tmp_path):
    """Chapter 5 opened in JupyterLab: every Markdown cell is rendered by jupyterlab-myst, its math is
    typeset, the {doc} role of its first line is a link whose text is "Chapter 2", no raw MyST is shown,
    and nothing is loaded from another host."""
    need_chromium()
    _need_jupyterlab_myst()
    cells = sum(cell.cell_type == "markdown" for cell in jupytext.read(ROOT / CHAPTER).cells)
    with jupyterlab(tmp_path) as (base, token):
        dom = chromium(f"{base}lab/tree/{CHAPTER}?token={token}", tmp_path / "profile", "--dump-dom",
                       "--window-size=1280,2000", budget_ms=60000, timeout=300)

    rendered = len(re.findall(r'<div class="lm-Widget myst"', dom))
    assert rendered >= cells, f"{rendered} of the chapter's {cells} Markdown cells rendered by jupyterlab-myst"
    assert '<span class="katex">' in dom, "no math typeset by jupyterlab-myst (KaTeX)"
    links = re.findall(r'<a\b([^>]*)>Chapter 2</a>', dom)
    assert links, "the role {doc}`Chapter 2 <02_rge>` is not rendered as a link"
    assert not any(external(href) for link in links for href in re.findall(r'href="([^"]*)"', link))
    shown = Prose(dom, inside=lambda classes: "jp-MarkdownCell" in classes,
                  skip=lambda classes: "lm-mod-hidden" in classes)       # the hidden editor of a rendered cell
    assert "Chapter 2" in shown.text, "no Markdown cell of the chapter is shown"
    raw = raw_myst(shown)
    assert not raw, f"raw MyST shown in JupyterLab: {raw}"
    remote = [load for load in Page(dom).loads if external(load[1])]
    assert not remote, f"JupyterLab loads remote resources: {remote}"


NUMBERS = """\
---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---

# Numbers

```{code-cell} ipython3
from prge_lib.common.prose import glue

glue("ratio", 2 / 3, display=False)
glue("label", "seven", display=False)
```

The ratio is {eval}`f"{ratio:.3f}"` and the label {eval}`label`.
"""


def test_executed_notebook_shows_glued_numbers_in_jupyterlab(tmp_path):
    """A notebook executed by tools/run_chapters.py's `execute` opens in JupyterLab with the values of its
    `{eval}` roles in the rendered Markdown, without running anything: "0.667" and "seven", not the
    expressions."""
    need_chromium()
    _need_jupyterlab_myst()
    sys.path.insert(0, str(ROOT / "tools"))
    from run_chapters import execute

    folder = tmp_path / "book"
    folder.mkdir()
    path = folder / "numbers.ipynb"
    nbformat.write(jupytext.reads(NUMBERS, fmt="md:myst"), path)
    execute(path)
    with jupyterlab(tmp_path, root=folder) as (base, token):
        dom = chromium(f"{base}lab/tree/numbers.ipynb?token={token}", tmp_path / "profile", "--dump-dom",
                       "--window-size=1280,1200", budget_ms=30000, timeout=300)
    shown = Prose(dom, inside=lambda classes: "jp-MarkdownCell" in classes,
                  skip=lambda classes: "lm-mod-hidden" in classes)
    assert "The ratio is" in shown.text, "the Markdown cell is not shown"
    line = " ".join(shown.text.split())
    assert "The ratio is 0.667 and the label seven." in line, line
    assert "ratio:" not in line and "`label`" not in line, line


def test_saving_a_chapter_writes_no_numbers_into_its_markdown(tmp_path):
    """book/jupytext.toml: a chapter saved from JupyterLab after its Markdown cells ran (jupyterlab-myst
    stores their `{eval}` values in the cell metadata) is written back byte for byte as it was read."""
    from jupyter_server.services.contents.largefilemanager import LargeFileManager
    from jupytext.sync_contentsmanager import build_sync_jupytext_contents_manager_class

    (tmp_path / "book").mkdir()
    for name in ("jupytext.toml", Path(CHAPTER).name):
        (tmp_path / "book" / name).write_text((ROOT / "book" / name).read_text())
    manager = build_sync_jupytext_contents_manager_class(LargeFileManager)(root_dir=str(tmp_path))
    nb = manager.get(CHAPTER)["content"]
    ran = [c for c in nb.cells if c.cell_type == "markdown" and "{eval}" in c.source]
    assert ran, f"{CHAPTER} has no {{eval}} role"
    for cell in ran:
        cell.metadata["user_expressions"] = [{"expression": "x", "result": {"status": "ok", "data": {"text/plain": "1"}}}]
    manager.save({"type": "notebook", "format": "json", "content": nb}, CHAPTER)
    assert (tmp_path / CHAPTER).read_text() == (ROOT / CHAPTER).read_text()
