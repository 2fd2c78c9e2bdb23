"""How the supervisor starts one worker process: where its ipc socket lives (a short private
directory when the run dir's path is too long for `sun_path`), the environment it inherits
(the package on `PYTHONPATH`, none of the Tutti Agent's settings, failpoints and their state
dir, the provider's config, the parent's pid for the orphan check) and the command line, in a
process group of its own."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drivers.failpoints import ENV_POINTS, ENV_STATE_DIR, format_points
from drivers.worker import ENV_PARENT_PID, ENV_PROVIDER_CONFIG

TUTTI_AGENT_SETTINGS = (
    "TUTTI_AGENT_MODEL_BASE_URL",
    "TUTTI_AGENT_MODEL",
    "TUTTI_AGENT_WIRE_API",
    "TUTTI_AGENT_API_KEY_ENV",
    "TUTTI_AGENT_INSTRUCTIONS",
    "TUTTI_AGENT_FIRST_BYTE_SECONDS",
    "TUTTI_AGENT_STREAM_IDLE_SECONDS",
    "TUTTI_AGENT_MODEL_RETRIES",
)
"""What `tutti-agent app-server` reads as its options' defaults: the daemon's own environment
does not pass them on (a URL a user set in their shell for another use would point every Tutti
Agent at that server); the configuration gives them (`drivers.tutti_agent`)."""
IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep margin for the file name


def socket_dir(run_dir: Path) -> tuple[Path, bool]:
    """ipc paths are limited to ~107 bytes; fall back to a private short temp dir. Returns the
    directory and whether the supervisor owns it (removes it on close)."""
    probe = run_dir / "w-claude-code-99999.sock"
    if len(str(probe)) <= IPC_PATH_MAX:
        return run_dir, False
    return Path(tempfile.mkdtemp(prefix="ahw-")), True


def worker_env(
    overrides: Mapping[str, str],
    points: Mapping[str, str],
    state_dir: Path,
    provider_config: Mapping[str, Any],
) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in TUTTI_AGENT_SETTINGS}
    env.update(overrides)
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env[ENV_POINTS] = format_points(dict(points))
    env[ENV_STATE_DIR] = str(state_dir)
    env[ENV_PROVIDER_CONFIG] = json.dumps(dict(provider_config))
    env[ENV_PARENT_PID] = str(os.getpid())
    return env


def start_worker(
    python: str, provider: str, endpoint: str, env: Mapping[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """`python -m drivers.worker --provider P --connect ENDPOINT`, output to its log file."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [python, "-m", "drivers.worker", "--provider", provider, "--connect", endpoint],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=dict(env),
            # Own process group: a terminal's Ctrl-C reaches the daemon, which closes us.
            start_new_session=True,
        )
