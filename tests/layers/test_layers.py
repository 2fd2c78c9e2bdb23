"""The layering of ARCHITECTURE.md, checked at run time: importing the client, the wire spec or a
driver never loads SQLite (`apsw`), and the domain package loads nothing but the standard library.

Each import runs in a fresh interpreter, so what another test already imported cannot hide a
dependency. (The static contracts are import-linter's, in `make lint`.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The client (issue 19: Engine, CLI, GUI, demo), the wire spec and every driver module.
APSW_FREE = (
    "agenthost.cli",
    "agenthost.engine",
    "agenthost.session_client",
    "agenthost.gui.app",
    "agenthost.demo",
    "transport.wire",
    "transport.client",
    "drivers.tutti_agent",
    "drivers.codex",
    "drivers.claude",
    "drivers.worker",
)

OUR_PACKAGES = ("storage", "actors", "transport", "drivers", "tutti_agent", "agenthost")


def _loaded_after_import(module: str) -> list[str]:
    """The names in `sys.modules` after `import module` in a fresh interpreter."""
    code = f"import json, sys\nimport {module}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("module", APSW_FREE)
def test_importing_client_wire_or_driver_does_not_load_sqlite(module: str) -> None:
    loaded = _loaded_after_import(module)
    assert "apsw" not in loaded, f"importing {module} loads apsw"
    assert not any(m == "storage" or m.startswith("storage.") for m in loaded), (
        f"importing {module} loads the store: {[m for m in loaded if m.split('.')[0] == 'storage']}"
    )


@pytest.mark.parametrize(
    "module",
    [
        "domain",
        "domain.errors",
        "domain.enums",
        "domain.fork_states",
        "domain.providers",
        "domain.worker_messages",
    ],
)
def test_domain_loads_only_the_standard_library(module: str) -> None:
    loaded = _loaded_after_import(module)
    ours = sorted(m for m in loaded if m.split(".")[0] in OUR_PACKAGES)
    assert ours == []
    stdlib = set(sys.stdlib_module_names) | {"domain", "__main__", "_distutils_hack"}
    foreign = sorted({m.split(".")[0] for m in loaded} - stdlib)
    # `_virtualenv`/site hooks may be preloaded by the interpreter itself: check against a
    # baseline interpreter that imports nothing of ours.
    baseline = {m.split(".")[0] for m in _loaded_after_import("json")}
    assert [m for m in foreign if m not in baseline] == []


FORK_MODULES = ("actors/fork_saga.py", "actors/fork_resolve.py", "actors/fork_host.py")


@pytest.mark.parametrize("path", FORK_MODULES)
def test_the_fork_modules_never_import_the_session_actor(path: str) -> None:
    """The saga and fork.resolve see their Session actor only through `actors.fork_host`
    (`ForkHost`), so `session_actor → fork_saga` is the only direction (no cycle, not even one
    hidden under TYPE_CHECKING or inside a function)."""
    import ast

    tree = ast.parse((ROOT / path).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not {
        m for m in imported if m and m.startswith(("actors.session_actor", "actors.host_actor"))
    }
