"""The install script of an offline bundle (``prge bundle build`` copies this file into the bundle as
``install.py``): on a machine with no network it checks every part's SHA-256, joins the parts of each
wheel, checks the joined wheel's SHA-256, and installs the wheels with pip from the bundle alone.

It runs with only the machine's Python 3 and pip (the standard library, no project code)::

    python3 install.py --check-only        # verify the copy: every part, then every joined file
    python3 install.py                     # install into the active environment
    python3 install.py --target DIR        # install into DIR (then add DIR to PYTHONPATH)

A missing or corrupt part is named on one line with what to copy again, and nothing is installed.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

MANIFEST = "MANIFEST.json"
FORMAT = "prge-bundle/1"
_BLOCK = 1 << 20


def sha256_of(path):
    """The SHA-256 (hex) of a file, read in blocks of 1 MiB."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(bundle):
    """The bundle's MANIFEST.json, refused with a message when it is missing or of another format."""
    path = os.path.join(bundle, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except OSError:
        raise SystemExit("install.py: {} is missing: copy {} again (with install.py and the wheels/ folder)"
                         .format(path, MANIFEST))
    except ValueError as err:
        raise SystemExit("install.py: {} is not valid JSON ({}): copy {} again".format(path, err, MANIFEST))
    if manifest.get("format") != FORMAT:
        raise SystemExit("install.py: {} has format {!r}; this script reads {!r}".format(
            path, manifest.get("format"), FORMAT))
    return manifest


def part_problems(bundle, manifest):
    """One line for each part that is missing or whose size or SHA-256 differs from the manifest."""
    lines = []
    for entry in manifest["files"]:
        for part in entry["parts"]:
            path = os.path.join(bundle, part["name"])
            what = "part {} of {}".format(part["name"], entry["name"]) if len(entry["parts"]) > 1 \
                else "file {}".format(part["name"])
            if not os.path.isfile(path):
                lines.append("install.py: {} is missing: copy {} into {} again".format(
                    what, part["name"], bundle))
                continue
            size = os.path.getsize(path)
            if size != part["size"]:
                lines.append("install.py: {} is corrupt ({} bytes, the manifest says {}): copy {} again".format(
                    what, size, part["size"], part["name"]))
            elif sha256_of(path) != part["sha256"]:
                lines.append("install.py: {} is corrupt (its SHA-256 differs from the manifest's): copy {} "
                             "again".format(what, part["name"]))
    return lines


def join(bundle, entry, dest=None):
    """Stream the parts of one file in order (writing them to ``dest`` when given); return the SHA-256 of
    the whole file."""
    digest = hashlib.sha256()
    out = open(dest, "wb") if dest else None
    try:
        for part in entry["parts"]:
            with open(os.path.join(bundle, part["name"]), "rb") as f:
                for block in iter(lambda: f.read(_BLOCK), b""):
                    digest.update(block)
                    if out:
                        out.write(block)
    finally:
        if out:
            out.close()
    return digest.hexdigest()


def verify(bundle, manifest, into=None):
    """Check every part, then every joined file (written into the folder ``into`` when given). Returns the
    problem lines; none means the bundle arrived whole."""
    problems = part_problems(bundle, manifest)
    if problems:
        return problems
    for entry in manifest["files"]:
        whole = join(bundle, entry, os.path.join(into, entry["name"]) if into else None)
        if whole != entry["sha256"]:
            problems.append("install.py: {} joined from its parts has the wrong SHA-256: copy its parts ({}) "
                            "again".format(entry["name"], ", ".join(p["name"] for p in entry["parts"])))
    return problems


def missing_on_this_machine(names):
    """The packages the bundle leaves to the machine (``assumed_on_box``) that this Python does not have."""
    from importlib import metadata

    missing = []
    for name in names:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def main(argv=None):
    parser = argparse.ArgumentParser(prog="install.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check-only", action="store_true",
                        help="verify every part and every joined file, install nothing")
    parser.add_argument("--target", default=None,
                        help="install into this folder (pip install --target) instead of the active environment")
    parser.add_argument("--bundle", default=os.path.dirname(os.path.abspath(__file__)),
                        help="the bundle folder (default: the folder of this script)")
    args = parser.parse_args(argv)
    manifest = read_manifest(args.bundle)
    work = tempfile.mkdtemp(prefix="prge-bundle-")
    try:
        problems = verify(args.bundle, manifest, into=None if args.check_only else work)
        if problems:
            if not args.check_only:
                problems[-1] += "; nothing was installed"
            print("\n".join(problems), file=sys.stderr)
            return 1
        total = sum(entry["size"] for entry in manifest["files"])
        print("install.py: {} files ({:.1f} MiB) match MANIFEST.json".format(len(manifest["files"]), total / 2**20))
        missing = missing_on_this_machine(manifest.get("assumed_on_box", []))
        if missing:
            print("install.py: note: the bundle expects the machine to have {} already; this Python ({}) lacks "
                  "{}".format(", ".join(manifest["assumed_on_box"]), sys.executable, ", ".join(missing)),
                  file=sys.stderr)
        if args.check_only:
            return 0
        wheels = [os.path.join(work, entry["name"]) for entry in manifest["files"]]
        command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--find-links", work]
        if args.target:
            command += ["--target", os.path.abspath(args.target), "--upgrade"]
        done = subprocess.run(command + wheels)
        if done.returncode != 0:
            print("install.py: pip stopped with status {} (its message is above)".format(done.returncode),
                  file=sys.stderr)
            return done.returncode
        if args.target:
            print("install.py: installed into {0}; add it to the search path: "
                  "export PYTHONPATH={0}${{PYTHONPATH:+:$PYTHONPATH}}".format(os.path.abspath(args.target)))
        else:
            print("install.py: installed into {}".format(sys.prefix))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
