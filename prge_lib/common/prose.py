"""Numbers in a chapter's prose: glued by its code, shown by `{eval}` roles in the book and in JupyterLab.

A chapter's code calls :func:`glue` (myst-nb's glue, which also binds the name in the kernel); its prose
writes ``{eval}`name``` or ``{eval}`f"{name:spec}"```. The built book resolves those from the glued outputs
(book/_ext/prose_eval.py); JupyterLab (jupyterlab-myst) evaluates them in the kernel when a Markdown cell
is run, or shows the replies that tools/run_chapters.py wrote into an executed notebook. Both read
:func:`resolve`, so the two show the same text (chapter 0 says how a reader sees them).
"""
from __future__ import annotations

import ast
import builtins
import keyword
import re
from typing import Any, Mapping, NamedTuple

FORMS = 'a glued name, or f"{name:spec}" with a format spec'
ROLE = re.compile(r"\{eval\}`([^`]+)`")

_bound: dict[str, Any] = {}   # what glue() bound each name to in this kernel: such a name may be glued again


class Shown(NamedTuple):
    """An `{eval}` role resolved: `text` is what the reader sees, `plain` the text/plain reply of a kernel
    that evaluated the expression (a string's repr, quotes and all)."""
    text: str
    plain: str


def parse(expression: str) -> tuple[str, str | None]:
    """The glued name an `{eval}` expression reads and its format spec (None for a bare name); any other
    expression is refused."""
    try:
        body = ast.parse(expression.strip(), mode="eval").body
    except SyntaxError:
        body = None
    if isinstance(body, ast.Name):
        return body.id, None
    if isinstance(body, ast.JoinedStr) and len(body.values) == 1:
        part = body.values[0]
        spec = getattr(part, "format_spec", None)
        if (isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and part.conversion == -1
                and spec is not None and len(spec.values) == 1 and isinstance(spec.values[0], ast.Constant)):
            return part.value.id, spec.values[0].value
    raise ValueError(f"{{eval}}`{expression}`: not an allowed form; expected {FORMS}")


def resolve(expression: str, glued: Mapping[str, str]) -> Shown:
    """Resolve an `{eval}` expression from a chapter's glued values (name -> glued text/plain): a name shows
    its text/plain with a string's quotes stripped (as `{glue:text}` did); f"{name:spec}" formats the value
    that text/plain is the repr of."""
    name, spec = parse(expression)
    if name not in glued:
        raise ValueError(f"{{eval}}`{expression}`: no value glued as {name!r} in this chapter "
                         f"({len(glued)} names glued); expected {FORMS}")
    plain = glued[name]
    try:
        value = ast.literal_eval(plain)
    except (SyntaxError, ValueError):
        if spec is not None:
            raise ValueError(f"{{eval}}`{expression}`: the value glued as {name!r} ({plain[:60]}) is not a "
                             f"number or string, so it takes no format spec") from None
        return Shown(plain, plain)
    if spec is None:
        return Shown(str(value), plain)
    try:
        text = format(value, spec)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{{eval}}`{expression}`: the value glued as {name!r} ({plain}) does not take the "
                         f"spec {spec!r} ({err})") from None
    return Shown(text, repr(text))


def expressions(markdown: str) -> list[str]:
    """The expressions of the `{eval}` roles in a Markdown text, each once, in order."""
    return list(dict.fromkeys(ROLE.findall(markdown)))


def glued_values(nb) -> dict[str, str]:
    """The text/plain of every value glued in an executed notebook, by name."""
    values = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else ():
            record = (output.get("metadata") or {}).get("scrapbook")
            if record:
                prefix = record.get("mime_prefix", "")
                data = {k.removeprefix(prefix): v for k, v in (output.get("data") or {}).items()}
                if "text/plain" in data:
                    values[record["name"]] = data["text/plain"]
    return values


def glue(name: str, variable: Any, display: bool = True) -> None:
    """myst-nb's ``glue(name, variable, display)``, and ``name`` bound to ``variable`` in the kernel's
    namespace, where jupyterlab-myst evaluates the prose's `{eval}` roles. A name that is not an identifier,
    that names a builtin, or that the chapter bound to another object itself is refused (also after gluing
    that object under it); a name that glue() bound may be glued again."""
    from IPython import get_ipython
    from myst_nb import glue as glue_output

    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"glue name {name!r}: {{eval}} reads it as a Python name; use letters, digits and _")
    if hasattr(builtins, name):
        raise ValueError(f"glue name {name!r} would hide the builtin {name}; glue under another name")
    markup = [mark for mark in ("$", "`", "](") if isinstance(variable, str) and mark in variable]
    if markup:
        raise ValueError(f"glue {name!r}: the text holds {markup[0]!r}, markdown that the prose's {{eval}} role "
                         f"writes as it stands (it inserts plain text); write it without: {variable[:80]!r}")
    shell = get_ipython()
    if shell is not None:
        namespace = shell.user_ns
        if name in namespace and namespace[name] is not variable:
            if name not in _bound or namespace[name] is not _bound[name]:
                raise ValueError(f"glue name {name!r}: the chapter binds {name} itself (to a value of type "
                                 f"{type(namespace[name]).__name__}); glue under another name")
        if name not in namespace or name in _bound:
            namespace[name] = _bound[name] = variable
    glue_output(name, variable, display=display)
