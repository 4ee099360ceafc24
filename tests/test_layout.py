"""The library's layout (prge_lib/__init__.py lists the layers): no import cycle between its modules, and no
module that runs a program or starts work when it is imported. The layer order itself is the import-linter
contract in pyproject.toml (`lint-imports`, run by tools/test)."""
import subprocess
import sys
import textwrap

import grimp
import pytest


def _import_graph():
    return grimp.build_graph("prge_lib", include_external_packages=False)


def _cycles(graph) -> list[list[str]]:
    """Every module that lies on a cycle of direct imports, as one cycle through it (depth-first search)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    state, stack, found = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in edges[m]:
            if state.get(n) == "open":
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in modules:
        if m not in state:
            visit(m)
    return found


def test_cycle_finder_finds_a_planted_cycle():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    assert _cycles(graph) == []
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]


def test_no_import_cycles():
    assert _cycles(_import_graph()) == []


def test_importing_the_library_runs_nothing():
    """Importing every module must not run git (or any program) nor start threads of work: a program run on
    import would make `prge --help` slow and every import depend on the checkout."""
    modules = sorted(m for m in _import_graph().modules)
    script = textwrap.dedent(f"""
        import importlib, subprocess
        def refuse(*args, **kwargs):
            raise AssertionError(f"a program was run on import: {{args[0] if args else kwargs}}")
        subprocess.run = subprocess.Popen = subprocess.check_output = subprocess.call = refuse
        for name in {modules!r}:
            importlib.import_module(name)
        print("imported", len({modules!r}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"imported {len(modules)}" in out.stdout


def test_pyproject_lists_every_subpackage():
    """pyproject.toml lists the packages by name (prge_lib.shipped maps data/ into the wheel): a new folder of
    the library must be listed there, or a wheel would leave it out."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {str(p.parent.relative_to(root)).replace("/", ".") for p in (root / "prge_lib").rglob("__init__.py")}
    assert listed - {"prge_lib.shipped"} == folders


def test_a_wheel_installed_without_the_clone_finds_the_shipped_pools(tmp_path):
    """A non-editable install, run from another folder, reads the task pools from inside the package."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(root)], capture_output=True, text=True, timeout=600)
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              *map(str, (tmp_path / "dist").glob("*.whl"))], capture_output=True, text=True,
                             timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    script = ("import prge_lib, prge_lib.common.paths as p; from prge_lib.data.tasks import get_task; "
              "from prge_lib.data.splits import sample_task; d = sample_task(get_task('rte'), seed=0); "
              "print(prge_lib.__file__, p.REPO, len(d.train), len(d.test))")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("PRGE_DATA_DIR", "PRGE_REPO")}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    where, repo, n_train, n_test = out.stdout.split()
    assert where.startswith(str(target)) and repo == "None"
    assert int(n_train) > 0 and int(n_test) > 0
