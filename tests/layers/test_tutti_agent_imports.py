"""The built-in tutti-agent is its own program: it imports the standard library, and of third
parties only httpx (its model's HTTP) and orjson (its JSON) — nothing of ours (import-linter's
contract) and no other package, so it runs from the same venv on what the daemon already
installs (docs/design/overview.md, "Layers")."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tutti_agent"
THIRD_PARTIES = {"httpx", "orjson"}


def _imported(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _outside(names: set[str]) -> set[str]:
    allowed = set(sys.stdlib_module_names) | THIRD_PARTIES | {"tutti_agent", "__future__"}
    return names - allowed


def test_tutti_agent_imports_the_standard_library_httpx_and_orjson_only() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) > 10
    found: dict[str, set[str]] = {}
    for path in files:
        if extra := _outside(_imported(path.read_text(encoding="utf-8"))):
            found[path.name] = extra
    assert found == {}


def test_the_check_sees_another_package_imported_anywhere_in_a_module() -> None:
    source = "import os\n\ndef f():\n    import yaml.loader\n    from zmq import Context\n"
    assert _outside(_imported(source)) == {"yaml", "zmq"}


def test_an_app_servers_start_loads_no_socket_logging_or_futures(tmp_path: Path) -> None:
    """An app-server started and answering `initialize` has not imported `socket` (an HTTP
    model's, which httpx brings), `concurrent.futures` or the `logging` it brings (a detached
    fork's): many app-servers only fork or read, and each import is every start's time."""
    code = (
        "import json, sys\n"
        "sys.argv = ['tutti-agent', 'app-server']\n"
        "from tutti_agent.cli import main\n"
        "main()\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    initialize = {
        "id": 1,
        "method": "initialize",
        "params": {"clientInfo": {"name": "t", "title": "t", "version": "0"}, "capabilities": {}},
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(initialize) + "\n",
        env={**os.environ, "TUTTI_AGENT_HOME": str(tmp_path / "home")},
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"id":1,"result"' in done.stdout
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert "tutti_agent.server" in loaded
    assert [m for m in ("socket", "logging", "concurrent.futures") if m in loaded] == []
