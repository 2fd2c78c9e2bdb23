"""The Codex provider: the thin Codex driver over the generic app-server driver.

- `command`: which `codex` program an app-server runs (pinned install, npm shim → native).
- `config`: a Codex home's generated `config.toml` and the Session settings it carries.
- `lineage`: a fork child's recorded source and its Referenced rollout ancestors.
- `driver`: `CodexProvider`, the Codex side of the app-server driver (`create_driver` is what
  the worker loads).

The names other code imports are re-exported here.
"""

from drivers.app_server.launch import ExecutableIdentity, executable_identity, launch_fingerprint
from drivers.codex.command import (
    _NATIVE_PACKAGES,
    PINNED_PREFIX,
    REPO_ROOT,
    default_command,
    native_behind_npm_shim,
    native_binary,
    resolve_command,
)
from drivers.codex.config import ApprovalPolicy, SandboxMode, render_config_toml
from drivers.codex.driver import CodexProvider, create_driver
from drivers.codex.lineage import CONTEXT_KEY, ForkLineage, fork_lineage_of, rollout_lineage

__all__ = [
    "CONTEXT_KEY",
    "PINNED_PREFIX",
    "REPO_ROOT",
    "_NATIVE_PACKAGES",
    "ApprovalPolicy",
    "CodexProvider",
    "ExecutableIdentity",
    "ForkLineage",
    "SandboxMode",
    "create_driver",
    "default_command",
    "executable_identity",
    "fork_lineage_of",
    "launch_fingerprint",
    "native_behind_npm_shim",
    "native_binary",
    "render_config_toml",
    "resolve_command",
    "rollout_lineage",
]
