"""The book's `{eval}` role: a number of the prose, read from the values the chapter's code glued.

myst-nb's own `{eval}` asks a live kernel, which this build does not keep (tools/run_chapters.py executes the
chapters before `jupyter-book build`); this role, registered after myst-nb's, resolves ``name`` and
``f"{name:spec}"`` from the notebook's glued outputs with prge_lib.common.prose.resolve, the function that
also writes the values JupyterLab shows. Any other expression, or a name the chapter did not glue, is a
warning naming the chapter and line (an error under ``-W``).
"""
from __future__ import annotations

from docutils import nodes
from myst_nb.core.variables import create_warning
from myst_nb.ext.utils import RoleBase

from prge_lib.common.prose import resolve


class ProseEval(RoleBase):
    def run(self):
        renderer = self.document.get("nb_renderer")
        glue_data = renderer.renderer.nb_client.glue_data if renderer is not None else {}
        glued = {name: output["data"]["text/plain"] for name, output in glue_data.items()
                 if "text/plain" in output.get("data", {})}
        try:
            text = resolve(self.text, glued).text
        except ValueError as err:
            return [], [create_warning(str(err), self.document, self.line, subtype="eval")]
        node = nodes.inline(text, text, classes=["pasted-text"])
        self.set_source_info(node)
        return [node], []


def setup(app):
    app.setup_extension("myst_nb")          # so that this role replaces myst-nb's, not the other way round
    app.add_role("eval", ProseEval(), override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
