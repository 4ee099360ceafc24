"""What every result file records: command, commit, library versions, hardware, wall time.

A result without its provenance cannot be checked, so ``write_result`` refuses to write one without it.
"""
from __future__ import annotations

import functools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import numpy

from prge_lib.common.paths import PACKAGE, REPO, RESULTS_PATH

_LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "datasets", "executorch", "prge-lib")




def git_commit(root: Path | None = None) -> str | None:
    """The commit of the checkout this code runs from (with ``+dirty`` for local changes), or None.

    Result files are outputs, not code: a result written earlier in the same session (``tools/bench_engine``
    writes two in a row) does not make the next one's code dirty. A copy of a checkout sent to another machine
    (a GPU machine, say) names its commit in ``PRGE_SOURCE_COMMIT``, which wins where it is set: such a copy may
    come without a git folder, or with one at another commit than the code it holds."""
    if os.environ.get("PRGE_SOURCE_COMMIT"):
        return os.environ["PRGE_SOURCE_COMMIT"]
    root = root or REPO or PACKAGE
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":(exclude){RESULTS_PATH}"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("+dirty" if dirty else "")


def library_versions() -> dict[str, str | None]:
    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.lru_cache(maxsize=1)
def cpu_name() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` knows, or None), read once a process:
    it prices every cell of a ``--list``."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


def processor(device=None) -> str | None:
    """The processor that computes on ``device``: the GPU's name on a CUDA device, else the CPU's model name.
    Float rounding follows the processor's kernels, so a run resumed on another one leaves the trajectory the
    uninterrupted run would have had (the trainer records each sitting's, ``sittings``)."""
    import torch

    device = torch.device(device or "cpu")
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def hardware() -> dict:
    import torch

    info = {"machine": platform.machine(), "system": platform.system(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cuda": None, "cpu": cpu_name()}
    try:
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    # the device, and the CUDA version torch was built with (the one bitsandbytes loads a library for)
    if torch.cuda.is_available():
        info["cuda"], info["cuda_runtime"] = torch.cuda.get_device_name(0), torch.version.cuda
    return info


_COMMIT_AT_START: list[str | None] = []     # filled once, by start_commit()


def start_commit() -> str | None:
    """The commit of the code that runs: read once, the first time it is asked for (the trainer and the CLI
    ask as they start), so a long run reports the code it started with even if the checkout changes while
    it runs. Importing this module runs nothing."""
    if not _COMMIT_AT_START:
        _COMMIT_AT_START.append(git_commit())
    return _COMMIT_AT_START[0]


def provenance(wall_time_s: float | None = None, command: str | None = None) -> dict:
    """The provenance block of a result: command line, commit, versions, hardware, time stamp, load.

    ``command``: the command that made the result, given by its writer (``prge`` passes the command line it was
    called with, also when ``main()`` runs inside a notebook or a test, where ``sys.argv`` is the host's; a grid's
    cell the command that makes it alone); None: this process's arguments. The commit is the one
    :func:`start_commit` read as the run started."""
    return {
        "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": start_commit(),
        "versions": library_versions(),
        "hardware": hardware(),
        "fast_mode": os.environ.get("PRGE_FAST", ""),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_time_s": None if wall_time_s is None else round(wall_time_s, 3),
        "load_average": load_average(),
    }


def load_average() -> list[float] | None:
    """The machine's 1-, 5- and 15-minute load averages as the result is written: well above the run's own
    ``torch_threads``, the CPU was shared and the wall time (not the result) says so."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def check_writable(path: str | os.PathLike, folder: bool = False, option: str = "the output") -> None:
    """Refuse, before any work starts, an output location that cannot be written (a run must not compute for
    minutes and then lose its result). ``folder``: the path is a folder to create or reuse."""
    p = Path(path).expanduser()
    if folder and p.exists() and not p.is_dir():
        raise ValueError(f"{option} {path} is a file, not a folder; choose a folder path")
    if not folder and p.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file name inside it, e.g. {p / 'result.json'}")
    probe = p if folder else p.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{option} {path} cannot be written: {probe} is a file, not a folder; choose another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path} cannot be written: no write permission in {probe}")


@contextmanager
def atomic_file(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; once the block finishes, it replaces ``path`` in one step,
    so a crash leaves the old file or the new one, never half of one.

    Each writer gets a temporary file of its own (two processes writing the same file never take each other's),
    removed if the block fails; it gets the permissions a new file would get."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)     # mkstemp makes it private to its owner
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def result_json(value, level: int = 0) -> str:
    """``value`` as the JSON of a result file: objects and lists of objects indented by two spaces, but a list of
    plain values (a run's losses, one step's q projected gradients) on one line. A run of 1000 steps keeps every
    step's loss and q gradients; one number per line made a quarter of such a file indentation. Objects are
    not sorted; anything JSON cannot write is written as its ``str``."""
    inner = "  " * (level + 1)
    if isinstance(value, dict) and value:
        # a key as JSON writes it: a number, true, false or null becomes the string of its JSON
        items = (f"{inner}{json.dumps(key if isinstance(key, str) else json.dumps(key))}: "
                 f"{result_json(item, level + 1)}" for key, item in value.items())
        return "{\n" + ",\n".join(items) + "\n" + "  " * level + "}"
    if isinstance(value, (list, tuple)) and any(isinstance(item, (dict, list, tuple)) for item in value):
        return "[\n" + ",\n".join(inner + result_json(item, level + 1) for item in value) + "\n" + "  " * level + "]"
    if isinstance(value, (list, tuple)) and value:
        return "[" + ", ".join(_list_number(item) for item in value) + "]"
    return json.dumps(list(value) if isinstance(value, tuple) else value, default=str)


def as_float32(values: list) -> list:
    """A result file's list of float32 values (:func:`_list_number`) as the run held them: each float cast to
    float32 and widened back, so that it equals the run's own value exactly; other items as they are."""
    return [float(numpy.float32(v)) if type(v) is float else v for v in values]


def _list_number(item) -> str:
    """One value of a list of plain values as :func:`result_json` writes it. A float that is a float32 widened
    (a step's loss or projected gradients, computed in float32) is written with the fewest digits that give that
    float32 back (at most 9 significant, ``str`` of ``numpy.float32``) instead of the 17 that name the double:
    read back and cast to float32 it is the value computed, and a 1000-step P-RGE result at q 16 is half the size
    (every result travels with the repository to a GPU machine). A double that merely happens to be a float32 value
    (a short timed step now and then) is kept so to float32 precision, 6e-8 relative, not bit for bit. Any other
    value is written as JSON writes it."""
    if type(item) is float and math.isfinite(item) and float(numpy.float32(item)) == item:
        return str(numpy.float32(item))
    return json.dumps(item, default=str)


def write_result(path: str | os.PathLike, result: dict) -> Path:
    """Write ``result`` as JSON (:func:`result_json`) atomically (a crash never leaves half a file). It must carry
    provenance."""
    if "provenance" not in result or "seed" not in result:
        raise ValueError("a result must carry 'provenance' and 'seed' (see prge_lib.common.provenance.provenance)")
    with atomic_file(path) as tmp:
        tmp.write_text(result_json(result) + "\n")
    return Path(path)
