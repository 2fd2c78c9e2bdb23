"""Which program a Codex app-server runs: the configured command, else the pinned install under
the repo's build/ dir, else `codex` on PATH; an npm `node` wrapper replaced by the native binary
it would run (saves a Node.js start per app-server)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
PINNED_PREFIX = REPO_ROOT / "build" / "providers" / "codex"

# npm installs the real binary in a per-platform optional package next to the JS shim.
_NATIVE_PACKAGES: dict[tuple[str, str], tuple[str, str]] = {
    ("Linux", "x86_64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("Linux", "aarch64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
    ("Darwin", "x86_64"): ("codex-darwin-x64", "x86_64-apple-darwin"),
    ("Darwin", "arm64"): ("codex-darwin-arm64", "aarch64-apple-darwin"),
}


def native_binary(node_modules: Path) -> Path | None:
    """The platform's native `codex` inside an npm install (about 70 ms faster to start than
    the node shim, and an executable whose identity can be fingerprinted)."""
    key = _NATIVE_PACKAGES.get((platform.system(), platform.machine()))
    if key is None:
        return None
    package, triple = key
    path = node_modules / "@openai" / package / "vendor" / triple / "bin" / "codex"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def default_command() -> list[str]:
    """The pinned install under the repo's build/ dir (native binary, else its npm shim), else
    `codex` on PATH."""
    node_modules = PINNED_PREFIX / "node_modules"
    native = native_binary(node_modules)
    if native is not None:
        return [str(native)]
    shim = node_modules / ".bin" / "codex"
    if shim.exists():
        return [str(shim)]
    return [shutil.which("codex") or "codex"]


def native_behind_npm_shim(program: str) -> Path | None:
    """The native `codex` that npm's `node` wrapper would run, or None when `program` is not
    that wrapper (or its platform binary is missing).

    The wrapper is `@openai/codex`'s `bin/codex.js` (usually reached through the
    `node_modules/.bin/codex` symlink); it resolves `@openai/codex-<platform>` the way
    `require.resolve` does — the package's own `node_modules`, then each enclosing
    `node_modules` — falling back to the package's own `vendor/` dir, and then `execve`s
    `vendor/<triple>/bin/codex` with the same arguments. Spawning that binary directly saves a
    Node.js start per app-server. The wrapper also exports `CODEX_MANAGED_BY_NPM` /
    `CODEX_MANAGED_PACKAGE_ROOT`, which only `codex doctor` reads; they are not set here.
    """
    found = shutil.which(program) if os.sep not in program else program
    if not found:
        return None
    real = Path(os.path.realpath(found))
    if real.name != "codex.js" or real.parent.name != "bin":
        return None
    package = real.parent.parent
    try:
        manifest = json.loads((package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("name") != "@openai/codex":
        return None
    for node_modules in [
        package / "node_modules",
        *(d for d in package.parents if d.name == "node_modules"),
    ]:
        native = native_binary(node_modules)
        if native is not None:
            return native
    key = _NATIVE_PACKAGES.get((platform.system(), platform.machine()))
    if key is not None:
        vendored = package / "vendor" / key[1] / "bin" / "codex"
        if vendored.is_file() and os.access(vendored, os.X_OK):
            return vendored
    return None


def resolve_command(configured: Any, *, native: bool = True) -> list[str]:
    """`[providers.codex] command` (a string is split like a shell would, a list is taken as
    is), else `default_command()`. A configured npm `node` wrapper is replaced by the native
    binary it would run (same arguments) unless `native` is false; without one, the wrapper is
    kept. The `app-server` argument is added by the driver."""
    if isinstance(configured, str) and configured.strip():
        argv = shlex.split(configured)
    elif isinstance(configured, Sequence) and not isinstance(configured, str) and configured:
        argv = [str(part) for part in configured]
    else:
        return default_command()
    if native:
        binary = native_behind_npm_shim(argv[0])
        if binary is not None:
            return [str(binary), *argv[1:]]
    return argv
