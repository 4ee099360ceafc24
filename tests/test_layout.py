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
