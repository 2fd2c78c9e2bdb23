"""The exact launch of a provider program, fingerprinted (seed 000 §6.3): a historical
capability verdict may be reused only for the same argv, cwd, environment and executable
identity. A `#!` wrapper picks its program at run time, so it proves nothing and is never
cached. Generic to every driver that spawns a provider program.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExecutableIdentity:
    """What identifies the program a launch really runs: the resolved file's inode, size,
    mtime and ctime (ctime cannot be set back, so a replaced or touched binary changes it)."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def executable_identity(argv0: str, env: Mapping[str, str]) -> ExecutableIdentity | None:
    """The identity of a native executable, or None when it cannot be proven: not found, or a
    `#!` script (a shell/package-manager wrapper such as npm's `.bin/codex` node shim picks
    the program it runs at run time, so its own bytes prove nothing about that program)."""
    found = shutil.which(argv0, path=env.get("PATH")) if os.sep not in argv0 else argv0
    if not found:
        return None
    real = os.path.realpath(found)
    try:
        with open(real, "rb") as fh:
            if fh.read(2) == b"#!":
                return None
            st = os.fstat(fh.fileno())
    except OSError:
        return None
    return ExecutableIdentity(
        real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
    )


def launch_fingerprint(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str | None:
    """SHA-256 over the exact launch (argv, cwd, env, executable identity), or None when the
    launch must not be cached (seed 000 §6.3: wrappers are always re-probed)."""
    if not argv:
        return None
    identity = executable_identity(argv[0], env)
    if identity is None:
        return None
    document = {
        "argv": list(argv),
        "cwd": cwd,
        "env": sorted(env.items()),
        "executable": [
            identity.path,
            identity.device,
            identity.inode,
            identity.size,
            identity.mtime_ns,
            identity.ctime_ns,
        ],
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
