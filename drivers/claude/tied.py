"""The Claude Code CLI tied to the worker that starts it: the `cli_path` the SDK is given is a
two-line shell script, written once per worker into a private directory of its own, that execs
the real CLI through `setpriv --pdeathsig KILL --` (`drivers.app_server.process.
pdeathsig_wrapper`, as the app-servers are started). The SDK spawns every CLI on the driver's
loop thread (asyncio's `subprocess.Popen`, in `anyio.open_process`), which lives as long as the
driver, so a CLI is SIGKILLed when its worker dies even when it reads no EOF on its stdin
(stopped, busy in a tool, wedged): the SDK's own spawn has no `preexec_fn` to set the signal.

The script execs in place (`sh`, then `setpriv`, then the CLI: one pid throughout), so the
process the SDK waits on and signals is the CLI itself. Without a `setpriv` that knows
`--pdeathsig`, or for a CLI that cannot be run (the SDK reports it as before), the SDK is
given what it was given before: the CLI then follows its worker only by its stdin's EOF.
The one thing the SDK decides by the `cli_path` itself, an app label it derives only for its
bundled CLI at version 999 and later (`_derive_client_app`), applies to no CLI it pins today.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from domain.procfs import pid_exists
from drivers.app_server.process import pdeathsig_wrapper

DIR_PREFIX = "agenthost-claude-cli-"
"""The prefix of a worker's private directory (`<prefix><worker pid>-<random>` in the temp
directory); one a killed worker left is removed by the next Claude worker's start."""
SCRIPT_NAME = "claude"


def wrapper_script(argv_prefix: tuple[str, ...], real_cli: str) -> str:
    """The script's text: `exec <setpriv --pdeathsig KILL --> <real CLI> "$@"`."""
    words = " ".join(shlex.quote(word) for word in (*argv_prefix, real_cli))
    return f'#!/bin/sh\nexec {words} "$@"\n'


def remove_stale_dirs(parent: Path) -> None:
    """Removes the private directories of this user's Claude workers that are gone (their pid
    in the name no longer runs); a live one's, or another user's, is left alone."""
    uid = os.getuid()
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if not entry.name.startswith(DIR_PREFIX):
                continue
            pid_text = entry.name[len(DIR_PREFIX) :].partition("-")[0]
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if not entry.is_dir(follow_symlinks=False) or st.st_uid != uid:
                    continue
                if pid_text.isdigit() and not pid_exists(int(pid_text)):
                    shutil.rmtree(entry.path, ignore_errors=True)


class TiedCli:
    """The `cli_path` that ties each CLI to this worker (one per driver)."""

    def __init__(self, real_cli: Callable[[], str], configured: str | None) -> None:
        self._real_cli = real_cli
        """The CLI the driver runs: the configured `cli_path` or the SDK's bundled one (asked
        when the script is written: it imports the SDK)."""
        self._configured = configured
        """What the SDK was given before (None: it finds its bundled CLI itself)."""
        self._lock = threading.Lock()
        self._path: str | None = None
        self._decided = False
        self._dir: str | None = None

    def real_cli(self) -> str:
        """The CLI itself, as a person configured it (or the SDK's bundled one): what an
        error names, not the wrapper script."""
        return self._real_cli()

    def cli_path(self) -> str | None:
        """The `cli_path` for the SDK: the wrapper script, or (no `setpriv --pdeathsig`, a CLI
        that cannot be run, no private directory) the configured one as before. Decided once;
        the first caller writes the script (the worker's `warm_up`, else its first spawn)."""
        with self._lock:
            if not self._decided:
                self._path = self._write()
                self._decided = True
            return self._path if self._path is not None else self._configured

    @property
    def tied(self) -> bool:
        """Whether the CLIs get the parent-death signal (after `cli_path` was decided)."""
        return self._path is not None

    def _write(self) -> str | None:
        prefix = pdeathsig_wrapper()
        real = self._real_cli()
        if prefix is None or not (os.path.isfile(real) and os.access(real, os.X_OK)):
            return None
        parent = Path(tempfile.gettempdir())
        remove_stale_dirs(parent)
        try:
            directory = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=parent)
        except OSError:
            return None
        self._dir = directory
        script = os.path.join(directory, SCRIPT_NAME)
        try:
            fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(wrapper_script(prefix, os.path.abspath(real)))
        except OSError:
            return None
        return script

    def close(self) -> None:
        """Removes the private directory (the driver closes: no CLI starts after this)."""
        with self._lock:
            directory, self._dir = self._dir, None
            self._path = None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
