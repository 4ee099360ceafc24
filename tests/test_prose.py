"""The prose's numbers (prge_lib.common.prose): `{eval}` roles resolved from glued values, as the built book
(book/_ext/prose_eval.py) and the executed notebooks for JupyterLab (tools/run_chapters.py) resolve them; and
every chapter's roles in an allowed form, naming a value its code glues."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

from prge_lib.common.prose import expressions, glued_values, parse, resolve

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
STAGE = ROOT / "build" / "book"
GLUED = {"ratio": "0.6666666666666666", "steps": "1000", "label": "'seven'", "quoted": '"it\'s"',
         "fig": "<Figure size 640x480 with 1 Axes>"}


def test_a_name_shows_its_glued_text_without_quotes():
    assert resolve("label", GLUED) == ("seven", "'seven'")
    assert resolve("quoted", GLUED).text == "it's"
    assert resolve("steps", GLUED) == ("1000", "1000")
    assert resolve(" ratio ", GLUED).text == "0.6666666666666666"
    assert resolve("fig", GLUED).text == "<Figure size 640x480 with 1 Axes>"


def test_an_fstring_formats_the_glued_value_with_its_spec():
    assert resolve('f"{ratio:.3f}"', GLUED) == ("0.667", "'0.667'")
    assert resolve("f'{steps:,.0f}'", GLUED).text == "1,000"
    assert resolve('f"{steps:.1e}"', GLUED).text == "1.0e+03"
    assert resolve('f"{ratio:.0%}"', GLUED).text == "67%"
    assert resolve('f"{label:>7s}"', GLUED).text == "  seven"


@pytest.mark.parametrize("expression", ["ratio + 1", 'f"{ratio:.2f} s"', 'f"{ratio}"', 'f"{ratio!r:.2f}"',
                                        'f"{ratio:{w}}"', "ratio.real", "len(label)", "", "glue:text"])
def test_other_expressions_are_refused_naming_the_allowed_forms(expression):
    with pytest.raises(ValueError, match=r"not an allowed form; expected a glued name, or f\"\{name:spec\}\""):
        resolve(expression, GLUED)


def test_an_unknown_name_or_a_spec_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="no value glued as 'nope' in this chapter"):
        resolve('f"{nope:.2f}"', GLUED)
    with pytest.raises(ValueError, match=r"'label' \('seven'\) does not take the spec '.2f'"):
        resolve('f"{label:.2f}"', GLUED)
    with pytest.raises(ValueError, match="'fig' .* is not a number or string"):
        resolve('f"{fig:.2f}"', GLUED)


def test_roles_and_glued_values_are_read_from_a_notebook():
    assert expressions('a {eval}`x` b {eval}`f"{y:.1f}"`, {eval}`x` and `{glue:text}`z``') == ["x", 'f"{y:.1f}"']
    hidden = {"output_type": "display_data", "data": {"application/papermill.record/text/plain": "3"},
              "metadata": {"scrapbook": {"name": "n", "mime_prefix": "application/papermill.record/"}}}
    shown = {"output_type": "display_data", "data": {"text/plain": "'s'", "text/html": "<b>s</b>"},
             "metadata": {"scrapbook": {"name": "s", "mime_prefix": ""}}}
    other = {"output_type": "stream", "name": "stdout", "text": "x"}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=[other, hidden, shown]),
                                         nbformat.v4.new_markdown_cell("{eval}`n`")])
    assert glued_values(nb) == {"n": "3", "s": "'s'"}


def _glue_names(cells) -> tuple[set[str], list[re.Pattern]]:
    """What the chapter's code glues, read from its source: the literal names of glue() calls, the
    patterns of f-string names, and for a name held in a variable every identifier-like string of that
    cell (the keys of the dict it loops over)."""
    names, patterns = set(), []
    for cell in cells:
        tree = ast.parse(cell)
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "glue" and call.args):
                continue
            arg = call.args[0]
            if isinstance(arg, ast.Constant):
                names.add(arg.value)
            elif isinstance(arg, ast.JoinedStr):
                patterns.append(re.compile("".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+"
                                                   for v in arg.values) + "$"))
            else:
                names |= {c.value for c in ast.walk(tree) if isinstance(c, ast.Constant)
                          and isinstance(c.value, str) and c.value.isidentifier()}
    return names, patterns


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_role_of_a_chapter_is_allowed_and_names_a_glued_value(chapter):
    nb = jupytext.read(chapter)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "{glue:text}" not in prose, f"{chapter.name}: {{glue:text}} does not render in JupyterLab; use {{eval}}"
    assert not re.search(r"^from myst_nb import glue$", "\n".join(code), re.M), \
        f"{chapter.name}: import glue from prge_lib.common.prose (it binds the names {{eval}} reads)"
    names, patterns = _glue_names(code)
    for expression in expressions(prose):
        name, _ = parse(expression)
        assert name in names or any(p.match(name) for p in patterns), \
            f"{chapter.name}: {{eval}}`{expression}` names {name!r}, which its code does not glue"


def _glued_expressions(tree: ast.AST) -> list[tuple[str, str]]:
    """(name, the expression glued under it) for glue() calls with a literal name, and for glue(key, value)
    in a loop over the items of a dict literal."""
    pairs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "glue" and len(node.args) > 1 \
                and isinstance(node.args[0], ast.Constant):
            pairs.append((node.args[0].value, ast.unparse(node.args[1])))
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
                isinstance(getattr(node.iter.func, "value", None), ast.Dict):
            table = node.iter.func.value
            pairs += [(k.value, ast.unparse(v)) for k, v in zip(table.keys, table.values)
                      if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return pairs


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_binds_a_glued_name_to_another_value(chapter):
    """A name the chapter glues holds the glued value in the kernel (JupyterLab evaluates `{eval}` there):
    where the chapter's code also binds that name itself, before or after, it glues that very variable.
    (glue() refuses the case "before" at run time; this also finds "after".)"""
    tree = ast.parse("\n".join(c.source for c in jupytext.read(chapter).cells if c.cell_type == "code"))
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    clashes = [(name, value) for name, value in _glued_expressions(tree) if name in bound and value != name]
    assert not clashes, f"{chapter.name}: glued names that its code binds to something else: {clashes}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_role_of_an_executed_chapter_resolves(chapter):
    """Where tools/run_chapters.py or nbmake executed the staged chapter, each of its roles resolves from
    the values it glued in that run."""
    sys.path.insert(0, str(ROOT / "tools"))
    from stage_book import was_run

    staged = STAGE / f"{chapter.stem}.ipynb"
    nb = nbformat.read(staged, 4) if staged.exists() else None
    if nb is None or not was_run(nb):
        pytest.skip(f"{staged.relative_to(ROOT)} is not executed")
    glued = glued_values(nb)
    for cell in nb.cells:
        for expression in expressions(cell.source) if cell.cell_type == "markdown" else ():
            resolve(expression, glued)


def test_glue_binds_the_name_in_the_kernel_and_refuses_to_rebind_the_chapters_own():
    """glue() in an IPython shell: the name holds the value where jupyterlab-myst evaluates `{eval}`; a
    name glued before may be glued again, one the chapter bound itself only to the same object; a name that
    is not a Python name or that hides a builtin is refused."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_cell("from prge_lib.common.prose import glue\nsteps = 1000\nglue('share', 0.25, display=False)",
                       silent=True).raise_error()
        assert shell.user_ns["share"] == 0.25
        shell.run_cell("glue('share', 0.5, display=False); glue('steps', steps, display=False)").raise_error()
        assert shell.user_ns["share"] == 0.5 and shell.user_ns["steps"] == 1000
        for name, why in [("steps", r"the chapter binds steps itself \(to a value of type int\)"), ("max", "would hide the builtin"),
                          ("two words", "reads it as a Python name"), ("lambda", "reads it as a Python name")]:
            with pytest.raises(ValueError, match=why):
                shell.run_cell(f"glue({name!r}, 3, display=False)").raise_error()
        # text for the prose: markdown in it would show as it stands, since {eval} inserts plain text
        for text in ("at $q = 4$", "run `prge bench`", "see [chapter 6](06_inner_loop.md)"):
            with pytest.raises(ValueError, match="writes as it stands"):
                shell.run_cell(f"glue('said', {text!r}, display=False)").raise_error()
        shell.run_cell("glue('said', 'at q = 4, 1.86×', display=False)").raise_error()
        assert shell.user_ns["steps"] == 1000
    finally:
        InteractiveShell.clear_instance()
