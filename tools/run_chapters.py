"""Execute the staged chapters that have no outputs, and record how long each took.

tools/book runs this between tools/stage_book.py and `jupyter-book build`: each staged notebook
in build/book without outputs (new, or rewritten because its cells, settings, library code or
result files changed) is executed with nbclient, one after the other, in the staged folder, with
the per-cell timeout of its metadata; the outputs are written back, so the build finds every
chapter executed. Before each chapter a line says where the run is: "chapter k of n: NAME,
elapsed ..., recorded time of what remains ..." (from the times of earlier runs in this mode).

Each executed chapter also gets, in its Markdown cells' metadata, the values of their `{eval}` roles as a
kernel would have returned them (`show_numbers`), so that it opens in JupyterLab with its numbers shown;
chapters executed otherwise (by nbmake) get them at the end of a run.

Each chapter's execution seconds go to data/results/book/chapter_times.json, under the mode
it ran in ("fast" with PRGE_FAST=1, else "full"), with the provenance of the run. Entries of
the other mode and of chapters not run now are kept. The table of those times in README.md
and book/intro.md (between <!-- chapter-times --> and <!-- /chapter-times -->) is written
again from the file after a run, so that it never shows other numbers than the file.

Usage:
    python tools/run_chapters.py            # execute, record, write the tables
    python tools/run_chapters.py --table    # print the table (Markdown)
    python tools/run_chapters.py --paste    # write the table into README.md and book/intro.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

from stage_book import CHAPTERS, SOURCE, STAGE, was_run, write_config  # noqa: E402

from prge_lib.common.prose import expressions, glued_values, resolve  # noqa: E402
from prge_lib.common.provenance import atomic_file, provenance  # noqa: E402
from prge_lib.common.settings import fast_mode  # noqa: E402

TIMES = ROOT / "data" / "results" / "book" / "chapter_times.json"
MODES = ("full", "fast")
NOT_RECORDED = "not recorded yet"
BEGIN, END = "<!-- chapter-times -->", "<!-- /chapter-times -->"
PAGES = (ROOT / "README.md", SOURCE / "intro.md")


def read_times(path: Path = TIMES) -> dict:
    """The recorded times, {mode: {chapter: {"seconds": s, "provenance": {...}}}} ({} if none yet)."""
    if not path.exists():
        return {}
    try:
        times = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); fix or remove it, it is not overwritten") from err
    if not isinstance(times, dict) or set(times) - set(MODES):
        raise ValueError(f"{path}: expected an object with the modes {MODES} as keys, found {sorted(times)}")
    return times


def record(chapter: str, seconds: float, mode: str, path: Path = TIMES, prov: dict | None = None) -> dict:
    """Add one chapter's execution time in `mode` to the times file and return its new content. Every
    other entry (other chapters, the other mode) stays as it was."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {MODES}")
    times = read_times(path)
    times.setdefault(mode, {})[chapter] = {
        "seconds": round(seconds, 1),
        "provenance": prov if prov is not None else provenance(wall_time_s=seconds),
    }
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    return times


def duration(seconds: float | None) -> str:
    """Seconds as a reader reads them: "45 s", "3 min 20 s", "1 h 05 min"."""
    if seconds is None:
        return NOT_RECORDED
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _seconds(times: dict, mode: str, chapter: str) -> float | None:
    return (times.get(mode, {}).get(chapter) or {}).get("seconds")


def remaining(times: dict, mode: str, chapters: list[str]) -> str:
    """The recorded time of `chapters` in `mode`, naming those that have none."""
    known = [_seconds(times, mode, c) for c in chapters]
    text = duration(sum(s for s in known if s is not None))
    missing = [c for c, s in zip(chapters, known) if s is None]
    if len(missing) == len(chapters):
        return NOT_RECORDED
    return text + (f" (without {', '.join(missing)}: {NOT_RECORDED})" if missing else "")


def total(times: dict, mode: str, chapters: list[str]) -> str:
    """The recorded time of `chapters` in `mode`, with how many of them it covers when not all."""
    known = [s for s in (_seconds(times, mode, c) for c in chapters) if s is not None]
    if not known:
        return NOT_RECORDED
    return duration(sum(known)) + (f" ({len(known)} of {len(chapters)} chapters)" if len(known) < len(chapters) else "")


def progress(k: int, todo: list[str], elapsed: float, times: dict, mode: str) -> str:
    """The line printed before the k-th (from 1) of the chapters `todo` is executed."""
    return (f"chapter {k} of {len(todo)}: {todo[k - 1]}, elapsed {duration(elapsed)}, "
            f"recorded time of what remains ({mode} mode): {remaining(times, mode, todo[k - 1:])}")


def _title(chapter: Path) -> str:
    """A chapter's heading ("3. MeZO: the seed trick"), or its file name."""
    match = re.search(r"^# (\d+\. .+)$", chapter.read_text(), re.M)
    return match.group(1).strip() if match else chapter.stem


def conditions(times: dict, mode: str) -> str | None:
    """How the recorded times of `mode` were measured, from their provenance: the machine, the torch threads,
    the commits and the highest load average seen when a chapter finished (other work on the machine makes
    a chapter slower). None if no time of `mode` has its provenance."""
    entries = [e["provenance"] for e in times.get(mode, {}).values() if e.get("provenance")]
    if not entries:
        return None
    hardware = [e.get("hardware") or {} for e in entries]
    cpus = sorted({f"{h.get('cpu', '?')}, {h.get('cpu_count', '?')} cores" for h in hardware})
    threads = sorted({str(h.get("torch_threads", "?")) for h in hardware})
    commits = sorted({(e.get("commit") or "?")[:7] for e in entries})
    loads = [e["load_average"][0] for e in entries if e.get("load_average")]
    text = (f"{mode} mode: {'; '.join(cpus)}, {' or '.join(threads)} torch thread(s), "
            f"commit {', '.join(commits)}")
    return text + (f", load average up to {max(loads):.1f} at a chapter's end" if loads else "")


def table(times: dict, source: Path = SOURCE) -> str:
    """The Markdown table of every chapter's recorded full and fast execution time, their totals, and how
    each mode's times were measured."""
    lines = ["| Chapter | full mode | fast mode (`PRGE_FAST=1`) |", "|---|---|---|"]
    chapters = [chapter.stem for chapter in sorted(source.glob(CHAPTERS))]
    for chapter in sorted(source.glob(CHAPTERS)):
        full, fast = (duration(_seconds(times, m, chapter.stem)) for m in MODES)
        lines.append(f"| {_title(chapter)} | {full} | {fast} |")
    lines.append("| **all chapters** | " + " | ".join(total(times, m, chapters) for m in MODES) + " |")
    notes = [c for c in (conditions(times, m) for m in MODES) if c]
    if notes:
        lines += ["", "Measured " + "; ".join(notes) + "."]
    return "\n".join(lines) + "\n"


def paste(text: str, page: Path) -> bool:
    """Put `text` between the chapter-times markers of `page`; return True if the page changed."""
    old = page.read_text()
    if old.count(BEGIN) != 1 or old.count(END) != 1 or old.index(BEGIN) > old.index(END):
        raise ValueError(f"{page}: expected one {BEGIN} followed by one {END}")
    head, rest = old.split(BEGIN)
    new = f"{head}{BEGIN}\n{text}{END}{rest.split(END, 1)[1]}"
    if new != old:
        page.write_text(new)
    return new != old


def pasted(page: Path) -> str:
    """The text between the chapter-times markers of `page`."""
    return page.read_text().split(BEGIN, 1)[1].split(END, 1)[0].removeprefix("\n")


def to_run(stage: Path = STAGE) -> list[Path]:
    """The staged chapters without outputs, in book order."""
    return [p for p in sorted(stage.glob(CHAPTERS.replace(".md", ".ipynb"))) if not was_run(nbformat.read(p, 4))]


def show_numbers(nb) -> int:
    """Write into each Markdown cell of an executed notebook the `user_expressions` metadata that
    jupyterlab-myst renders its `{eval}` roles from (what a kernel would have answered, resolved from the
    glued values as the built book resolves them), so that JupyterLab shows the numbers without running
    anything. Returns the number of expressions written; an expression that does not resolve raises."""
    glued, count = glued_values(nb), 0
    for cell in nb.cells:
        found = expressions(cell.source) if cell.cell_type == "markdown" else []
        if found:
            cell.metadata["user_expressions"] = [
                {"expression": e, "result": {"status": "ok", "data": {"text/plain": resolve(e, glued).plain},
                                             "metadata": {}}} for e in found]
            count += len(found)
        elif cell.cell_type == "markdown":
            cell.metadata.pop("user_expressions", None)
    return count


def execute(path: Path) -> float:
    """Execute one staged notebook in its folder, write its outputs back, with the replies to its `{eval}`
    roles (`show_numbers`); return the seconds the execution took."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    timeout = (nb.metadata.get("execution") or {}).get("timeout")
    kernel = (nb.metadata.get("kernelspec") or {}).get("name") or "python3"
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()          # a failing cell raises: the notebook is not written, so it runs again next time
    seconds = time.perf_counter() - start
    show_numbers(nb)
    nbformat.write(nb, path)
    return seconds


def show_numbers_in(stage: Path = STAGE) -> list[str]:
    """`show_numbers` on every executed staged chapter whose replies are missing or stale (one executed by
    `pytest --nbmake --overwrite`, say); return the names of those written again."""
    written = []
    for path in sorted(stage.glob(CHAPTERS.replace(".md", ".ipynb"))):
        nb = nbformat.read(path, as_version=4)
        if was_run(nb):
            before = [cell.metadata.get("user_expressions") for cell in nb.cells]
            show_numbers(nb)
            if before != [cell.metadata.get("user_expressions") for cell in nb.cells]:
                nbformat.write(nb, path)
                written.append(path.stem)
    return written


def _say(line: str) -> None:
    print(line, flush=True)


def run(stage: Path = STAGE, times_path: Path = TIMES, mode: str | None = None, out=_say,
        source: Path = SOURCE) -> list[str]:
    """Execute every staged chapter without outputs, recording each one's time; return their names.
    A failing chapter stops the run (its error is raised); the chapters done before it keep their outputs
    and their times."""
    mode = mode or ("fast" if fast_mode() else "full")
    todo = [p.stem for p in to_run(stage)]
    start, done = time.perf_counter(), []
    try:
        for k, name in enumerate(todo, 1):
            out(progress(k, todo, time.perf_counter() - start, read_times(times_path), mode))
            record(name, execute(stage / f"{name}.ipynb"), mode, times_path)
            done.append(name)
    finally:
        if done:
            out(f"{len(done)} of {len(todo)} chapters executed in {duration(time.perf_counter() - start)} "
                f"({mode} mode)")
            write_config(stage, source)         # the build must not execute them again
    for name in show_numbers_in(stage):
        out(f"{name}: the values of its {{eval}} roles written for JupyterLab")
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="print the table of recorded times and stop")
    parser.add_argument("--paste", action="store_true", help="write the table into README.md and book/intro.md")
    args = parser.parse_args(argv)
    if args.table:
        print(table(read_times()), end="")
        return
    if not args.paste:
        run()
    for page in PAGES:
        if paste(table(read_times()), page):
            print(f"chapter times written into {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
