"""How the supervisor starts one worker process: where its ipc socket lives (a short private
directory when the run dir's path is too long for `sun_path`), the environment it inherits
(the package on `PYTHONPATH`, none of the Tutti Agent's settings, failpoints and their state
dir, the provider's config, the parent's pid for the orphan check) and the command line, in a
process group of its own."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drivers.failpoints import ENV_POINTS, ENV_STATE_DIR, format_points
from drivers.worker_env import ENV_PARENT_PID, ENV_PROVIDER_CONFIG

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
SOCKET_DIR_PREFIX = "ahw-"
SOCKET_DIR_MARKER = "run-dir"
"""The file in a socket directory outside the home that names the run dir it serves."""

log = logging.getLogger(__name__)


def fallback_socket_dir(run_dir: Path) -> Path:
    """`<tmp>/ahw-<uid>-<16 hex of sha256(run dir)>`: the short directory of a run dir whose own
    path is too long for an ipc path. A name of the run dir, not a fresh one, so a daemon
    SIGKILLed (no close to remove it) leaves one that its next start takes again. One per run
    dir is enough: two daemons of one home never run at once (the home lock)."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(run_dir))).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"{SOCKET_DIR_PREFIX}{os.getuid()}-{digest}"


def private_dir_problem(path: Path) -> str | None:
    """Make `path` 0700, or take the one there when it is a real directory (not a link) of our
    uid that no group or other may enter; else why not. The temp dir is shared, and its sticky
    bit keeps another user from replacing a directory of ours once we hold it."""
    try:
        os.mkdir(path, 0o700)
        return None
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot make it: {exc}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot read it: {exc}"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory (a link or a file)"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):04o}"
    return None


def claim_socket_dir(run_dir: Path) -> Path:
    """The run dir's socket directory outside it, made or taken again (`fallback_socket_dir`),
    its stale worker sockets (a killed daemon's) removed and its marker naming the run dir
    written; a fresh `mkdtemp` one when that name is not safely ours."""
    path = fallback_socket_dir(run_dir)
    problem = private_dir_problem(path)
    if problem is None:
        for stale in path.glob("w-*.sock"):
            stale.unlink(missing_ok=True)
    else:
        log.warning("worker sockets: %s is not ours (%s); using a fresh directory", path, problem)
        path = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))
    (path / SOCKET_DIR_MARKER).write_text(os.path.abspath(run_dir))
    return path


def reclaim_socket_dir(path: Path, run_dir: Path) -> Path:
    """`path` (the run dir's socket directory in use) made again if a cleaner removed it, and
    kept only while still safely ours: its predictable name may have been taken meanwhile (a
    link: `is_dir` would follow it), so `private_dir_problem` decides, else `claim_socket_dir`."""
    problem = private_dir_problem(path)
    if problem is not None:
        log.warning("worker sockets: %s is no longer ours (%s)", path, problem)
        return claim_socket_dir(run_dir)
    (path / SOCKET_DIR_MARKER).write_text(os.path.abspath(run_dir))
    return path


def socket_dir(run_dir: Path) -> tuple[Path, bool]:
    """ipc paths are limited to ~107 bytes; fall back to a private short temp dir named for the
    run dir (`claim_socket_dir`). Returns the directory and whether the supervisor owns it
    (removes it on close)."""
    probe = run_dir / "w-claude-code-99999.sock"
    if len(str(probe)) <= IPC_PATH_MAX:
        return run_dir, False
    return claim_socket_dir(run_dir), True


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
