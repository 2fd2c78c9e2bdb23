"""The layering of ARCHITECTURE.md, checked at run time: importing the client, the wire spec or a
driver never loads SQLite (`apsw`), and the domain package loads nothing but the standard library.

Each import runs in a fresh interpreter's state, so what another test already imported cannot
hide a dependency: a child forked, one per import, from one interpreter that has imported what a
fresh `python -c 'import json, sys'` has (tests/support/fresh_imports.py; a test below holds it
to fresh interpreters'). (The static contracts are import-linter's, in `make lint`.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fresh_imports import Imports, fresh_import, import_each

ROOT = Path(__file__).resolve().parents[2]

# The client (Engine, CLI, GUI, demo), the wire spec and every driver module.
APSW_FREE = (
    "agenthost.cli",
    "client.cli.parser",
    "client.engine",
    "client.session_client",
    "client.gui.app",
    "client.demo",
    "transport.wire",
    "transport.client",
    "drivers.tutti_agent",
    "drivers.codex.driver",
    "drivers.claude.driver",
    "drivers.worker",
)

OUR_PACKAGES = (
    "storage",
    "actors",
    "transport",
    "drivers",
    "tutti_agent",
    "agenthost",
    "client",
    "model_fakes",
    "workspace",
    "protocol",
)

DAEMON_SIDE = ("agenthost", "actors", "storage", "drivers", "tutti_agent")


DAEMON = "agenthost.cli, agenthost.daemon"
"""What `agenthost serve` imports."""

DOMAIN = (
    "domain",
    "domain.errors",
    "domain.enums",
    "domain.fork_states",
    "domain.home_layout",
    "domain.providers",
    "domain.worker_messages",
    "domain.turn_events",
)


def _modules_of(package: str) -> list[str]:
    """Every module of `package`, found on disk (importing them here would hide what they load)."""
    root = ROOT / package
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


# Every module of the client package (Engine, session helpers, the `agenthost` command's client
# part, GUI, demo), found on disk so a module added later is checked too.
CLIENT = _modules_of("client")
WORKER_SIDE = _modules_of("drivers") + _modules_of("tutti_agent")


@pytest.fixture(scope="module")
def imports() -> Imports:
    """Every import this file checks, each in a fresh interpreter's state (forked, side by side:
    one fresh interpreter each would cost ~100 interpreter starts)."""
    return import_each(
        ["json", *APSW_FREE, "transport.wire", DAEMON, "agenthost.cli", *DOMAIN]
        + CLIENT
        + WORKER_SIDE
    )


def test_the_forked_imports_report_what_a_fresh_interpreter_loads(imports: Imports) -> None:
    """The children's starting state is a fresh interpreter's, and so is what each reports: for
    the daemon (which loads SQLite), the client's Engine and the domain, the same `sys.modules`
    as `import X` in an interpreter of its own; a failed import is a child's exit code and
    traceback."""
    assert imports.baseline == fresh_import("json").loaded()
    for module in (DAEMON, "client.engine", "domain"):
        assert imports.each[module].loaded() == fresh_import(module).loaded(), module
    assert "apsw" in imports.each[DAEMON].loaded()
    failed = import_each(["json", "no_such_module_of_ours"]).each["no_such_module_of_ours"]
    assert failed.rc == 1 and "ModuleNotFoundError" in failed.err


@pytest.mark.parametrize("module", APSW_FREE)
def test_importing_client_wire_or_driver_does_not_load_sqlite(
    module: str, imports: Imports
) -> None:
    loaded = imports.each[module].loaded()
    assert "apsw" not in loaded, f"importing {module} loads apsw"
    assert not any(m == "storage" or m.startswith("storage.") for m in loaded), (
        f"importing {module} loads the store: {[m for m in loaded if m.split('.')[0] == 'storage']}"
    )


def test_the_wire_spec_loads_no_sockets(imports: Imports) -> None:
    """The envelope, params and errors shared by client and server (`transport.wire`) are
    plain data: importing them loads neither ZeroMQ nor SQLite."""
    loaded = imports.each["transport.wire"].loaded()
    assert not [m for m in loaded if m.split(".")[0] in ("zmq", "apsw")]


def test_the_daemon_loads_no_provider_driver_nor_asyncio(imports: Imports) -> None:
    """The daemon runs no provider driver in its own process (its workers do): importing what
    `agenthost serve` runs loads none of the provider packages nor asyncio (which they and
    CURVE's ZAP thread bring in), each a part of every start's time to ready."""
    loaded = imports.each[DAEMON].loaded()
    providers = ("drivers.codex", "drivers.claude", "drivers.app_server", "drivers.tutti_agent")
    drivers = [
        m for m in loaded if m in providers or m.startswith(tuple(f"{p}." for p in providers))
    ]
    assert drivers == []
    assert "asyncio" not in loaded


def test_the_daemon_loads_none_of_the_worker_main_it_only_spawns(imports: Imports) -> None:
    """The daemon starts workers; it does not run one: importing what `agenthost serve` runs
    loads neither the worker's main (`drivers.worker`) nor what only a worker uses (the driver
    port, its request bookkeeping, `ctypes` for its parent-death signal)."""
    loaded = imports.each[DAEMON].loaded()
    worker_only = ("drivers.worker", "drivers.base", "drivers.turn_starts", "drivers.worker_gc")
    assert [m for m in (*worker_only, "ctypes") if m in loaded] == []


def test_serve_loads_neither_package_metadata_nor_a_toml_parser_before_ready(
    imports: Imports,
) -> None:
    """What `agenthost serve` imports before its ready line leaves out the package-metadata
    reader (and the email parser it brings), used only by a claude-code version probe, and the
    TOML parser, used only when the home has a configuration file: each is start time."""
    loaded = imports.each[DAEMON].loaded()
    assert [m for m in ("importlib.metadata", "email", "tomllib") if m in loaded] == []


def test_serve_builds_its_own_subcommand_alone_and_loads_none_of_the_clients_commands(
    tmp_path: Path,
) -> None:
    """`agenthost serve` parses its command line with `serve`'s parser alone: no client
    subcommand is built (~25 parsers) and none of the client's command modules, its words of
    failure or its socket client is imported, each a part of every daemon's start."""
    code = (
        "import argparse, json, sys\n"
        "built = []\n"
        "add = argparse._SubParsersAction.add_parser\n"
        "def counted(self, name, **kw):\n"
        "    built.append(name)\n"
        "    return add(self, name, **kw)\n"
        "argparse._SubParsersAction.add_parser = counted\n"
        "from agenthost import cli\n"
        "rc = cli.main(['--home', sys.argv[1], 'serve', '--config', sys.argv[2]])\n"
        "print(json.dumps([rc, built, sorted(sys.modules)]))"
    )
    missing = tmp_path / "missing.toml"  # a configuration error: `serve` stops before its start
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "home"), str(missing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rc, built, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert rc == 2 and "no such configuration file" in done.stderr
    assert built == ["serve"]
    client_side = ("client.cli.", "client.failure_words", "client.workspace_text")
    assert [m for m in loaded if m.startswith(client_side) and m != "client.cli.output"] == [
        "client.cli.parser"
    ]
    assert "transport.client" not in loaded


def test_the_agenthost_commands_client_part_loads_none_of_the_daemons_configuration(
    imports: Imports,
) -> None:
    """Every subcommand but `serve`, `keys` and `config` is a client of a running daemon:
    importing the command (`agenthost.cli`) loads neither the daemon's configuration (its
    schema, the workspace's shadow checkpoints and git runner it names) nor the home's lock,
    each a part of every client command's start."""
    loaded = imports.each["agenthost.cli"].loaded()
    daemon_side = ("agenthost.config", "agenthost.home", "workspace", "subprocess")
    assert [m for m in loaded if m.startswith(daemon_side)] == []


def test_the_accept_shims_reexecution_loads_no_more_than_it_needs() -> None:
    """`serve`'s first interpreter only decides and re-executes itself with the shim, so all it
    imports is paid twice: importing `agenthost.launch` and the shim, and finding the library
    already built, load none of the modules only a build or the daemon needs."""
    from transport import accept_shim

    accept_shim.build()  # built once here (the session's AGENTHOST_NATIVE_DIR) if missing
    code = (
        "import json, sys\nimport agenthost.launch\nfrom transport import accept_shim\n"
        "accept_shim.build()\nprint(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    heavy = ("logging", "subprocess", "tempfile", "shutil", "threading", "zmq", "apsw")
    assert [m for m in heavy if m in loaded] == []
    ours = sorted(m for m in loaded if m.split(".")[0] in (*OUR_PACKAGES, "domain"))
    assert ours == ["agenthost", "agenthost.launch", "transport", "transport.accept_shim"]


@pytest.mark.parametrize("module", DOMAIN)
def test_domain_loads_only_the_standard_library(module: str, imports: Imports) -> None:
    loaded = imports.each[module].loaded()
    ours = sorted(m for m in loaded if m.split(".")[0] in OUR_PACKAGES)
    assert ours == []
    stdlib = set(sys.stdlib_module_names) | {"domain", "__main__", "_distutils_hack"}
    foreign = sorted({m.split(".")[0] for m in loaded} - stdlib)
    # `_virtualenv`/site hooks may be preloaded by the interpreter itself: check against a
    # baseline interpreter that imports nothing of ours.
    baseline = {m.split(".")[0] for m in imports.each["json"].loaded()}
    assert [m for m in foreign if m not in baseline] == []


FORK_MODULES = (
    "actors/fork_saga.py",
    "actors/fork_resolve.py",
    "actors/fork_host.py",
)


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


# --------------------------------------------------------------------------------- the client


@pytest.mark.parametrize("module", CLIENT)
def test_importing_the_client_loads_nothing_of_the_daemon_side(
    module: str, imports: Imports
) -> None:
    """The client never loads the daemon's composition root, actors, store, drivers
    or the tutti-agent program, nor SQLite."""
    loaded = imports.each[module].loaded()
    daemon = sorted(m for m in loaded if m.split(".")[0] in DAEMON_SIDE)
    assert daemon == [], f"importing {module} loads the daemon side: {daemon}"
    assert "apsw" not in loaded, f"importing {module} loads apsw"


def test_the_client_list_holds_every_client_part() -> None:
    # The discovery above must see the client and its command modules (an empty or partial
    # list would pass vacuously).
    for module in (
        "client",
        "client.engine",
        "client.session_client",
        "client.gui.app",
        "client.demo",
        "client.cli",
        "client.cli.parser",
        "client.cli.endpoints",
        "client.cli.reach",
        "client.cli.command",
        "client.cli.output",
        "client.cli.sessions",
        "client.cli.turns",
        "client.cli.forks",
        "client.cli.manage",
        "client.cli.launch_gui",
    ):
        assert module in CLIENT


# ---------------------------------------------------------------- the daemon's command entry


def test_the_agenthost_command_builds_the_client_parser_and_adds_only_the_daemon_side() -> None:
    """`agenthost.cli` (the composition root's entry) keeps only the subcommands that need the
    daemon side (`serve`, `config check`, `keys`, `providers install` into the home); every
    other one is the client's parser, importable without the daemon."""
    from agenthost.cli import _parser
    from client.cli.parser import build_parser

    def commands(parser: argparse.ArgumentParser) -> list[str]:
        action = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001
        return list(action.choices or ())

    full = commands(_parser())
    client = commands(build_parser("0", None))
    assert full == ["serve", *client, "config", "keys", "providers"]
    assert not {"serve", "config", "keys", "providers"} & set(client)
    assert "status" in client and "say" in client and "fork" in client and "gui" in client


HOST_SIDE = ("apsw", "storage", "actors")


@pytest.mark.parametrize("module", WORKER_SIDE)
def test_a_driver_or_tutti_agent_module_loads_no_sqlite_store_or_actors(
    module: str, imports: Imports
) -> None:
    """A worker process (drivers) and the tutti-agent program never load the host's SQLite, its
    store or its actors (ARCHITECTURE.md's import table)."""
    loaded = imports.each[module].loaded()
    host = sorted(m for m in loaded if m.split(".")[0] in HOST_SIDE)
    assert host == [], f"importing {module} loads {host}"


def test_the_worker_side_list_holds_every_provider_module() -> None:
    # The discovery above must see the split packages (an empty list would pass vacuously).
    for module in (
        "drivers.app_server.driver",
        "drivers.tutti_agent",
        "drivers.codex.driver",
        "drivers.claude",
        "drivers.worker",
        "tutti_agent.server",
    ):
        assert module in WORKER_SIDE


def _home_in_subprocess(platform: str, env: dict[str, str]) -> str:
    code = (
        "import sys; sys.platform = sys.argv[1]\n"
        "from domain.home_layout import default_home\n"
        "print(default_home())\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("AGENTHOST_HOME", "XDG_DATA_HOME")}
    out = subprocess.run(
        [sys.executable, "-c", code, platform],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_the_default_home_is_the_platforms_data_directory(tmp_path: Path) -> None:
    """Linux: XDG's data directory; macOS: Application Support; `$AGENTHOST_HOME` wins."""
    home = {"HOME": str(tmp_path)}
    assert _home_in_subprocess("linux", home) == f"{tmp_path}/.local/share/agenthost"
    xdg = {**home, "XDG_DATA_HOME": str(tmp_path / "data")}
    assert _home_in_subprocess("linux", xdg) == f"{tmp_path}/data/agenthost"
    mac = _home_in_subprocess("darwin", home)
    assert mac == f"{tmp_path}/Library/Application Support/agenthost"
    chosen = {**home, "AGENTHOST_HOME": str(tmp_path / "mine")}
    assert _home_in_subprocess("darwin", chosen) == f"{tmp_path}/mine"
