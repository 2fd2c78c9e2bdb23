"""Is the daemon there? Before sending anything, the client commands look at the home's lock
(`domain.home_layout.probe_home`) and its socket, so a dead daemon is reported at once (exit 3)
instead of after `--timeout`; and when no reply comes, they say whether the daemon has exited
or is running but busy.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from client.cli.endpoints import endpoints, home_path
from client.cli.output import EXIT_UNREACHABLE, CliError
from domain.home_layout import API_SOCKET, probe_home, read_state, run_dir


def unreachable(message: str) -> CliError:
    return CliError("daemon_unreachable", message, code=EXIT_UNREACHABLE)


def check_reachable(args: argparse.Namespace, api: str) -> None:
    """Tell a dead daemon from a slow one before sending anything: ZeroMQ would queue a
    request to a dead endpoint until `--timeout`. The home's lock is held exactly while a
    daemon lives (the kernel drops it with the process), so a free lock means dead, now."""
    home = home_of(args, api)
    if home is not None:
        probe = probe_home(home)
        if not probe.served:
            if _accepts(api[len("ipc://") :]):
                return  # served without the lock (a daemon older than the lock file)
            raise unreachable(_not_served(home))
        # Served: the socket appears once the daemon has finished its start-up recovery.
        sock = Path(api[len("ipc://") :])
        deadline = time.monotonic() + args.timeout
        while not sock.exists():
            if not probe_home(home).served:
                raise unreachable(f"the agenthost serving {home} has exited")
            state = read_state(home)
            if state == "stopping":
                raise unreachable(_stopping(home, probe.pid))
            if time.monotonic() > deadline:
                doing = f"is {_words(state)}" if state else "has not opened it (still starting?)"
                raise unreachable(
                    f"agenthost (pid {probe.pid}) holds {home} but has not opened {sock} "
                    f"within {args.timeout:g} s: it {doing}"
                )
            time.sleep(0.05)
        return
    if not api.startswith("ipc://") or api.startswith("ipc://@"):
        return
    path = api[len("ipc://") :]
    if not Path(path).exists():
        raise unreachable(f"no daemon socket at {api} (is `agenthost serve` running?)")
    if _accepts(path) is False:
        raise unreachable(f"nothing listens on {api} (a daemon that died left it)")


def _not_served(home: Path) -> str:
    """Why nothing serves `home`, in words that point at the fix: a home that does not exist or
    is not a directory is most often a mistyped --home or AGENTHOST_HOME."""
    if not home.exists():
        return (
            f"no agenthost is serving {home}: it does not exist (a mistyped --home or "
            "AGENTHOST_HOME? `agenthost serve` makes it)"
        )
    if not home.is_dir():
        return (
            f"no agenthost is serving {home}: it is not a directory, so it cannot be an "
            "agenthost home (check --home or AGENTHOST_HOME)"
        )
    return f"no agenthost is serving {home} (is `agenthost serve` running?)"


def _accepts(path: str) -> bool | None:
    """Does a process accept connections on this Unix socket? None: cannot tell (e.g. no
    permission; the real connection will report it)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return None
    finally:
        probe.close()
    return True


def home_of(args: argparse.Namespace, api: str) -> Path | None:
    """The home whose own ipc socket `api` is (its lock then tells if a daemon lives)."""
    home = home_path(args)
    if (
        api.startswith("ipc://")
        and Path(os.path.abspath(api[len("ipc://") :])) == run_dir(home) / API_SOCKET
    ):
        return home
    return None


def _words(state: str) -> str:
    """A published daemon state (`run/daemon.state`) as the words after "it is"."""
    return state.replace("starting: waiting", "starting and waiting", 1)


def _stopping(home: Path, pid: int | None) -> str:
    who = f" (pid {pid})" if pid else ""
    return (
        f"the agenthost serving {home}{who} is stopping and will not reply; whether it ran "
        "the request is unknown (`agenthost serve` again, then look)"
    )


def gone_check(args: argparse.Namespace, api: str) -> Callable[[], str | None] | None:
    """For a client of the home's own socket: words when its daemon has exited or is stopping
    (a call waiting for a reply then ends at once, `transport.client.ServerGone`), else None;
    None for another endpoint (nothing to look at)."""
    home = home_of(args, api)
    if home is None:
        return None

    def check() -> str | None:
        probe = probe_home(home)
        if not probe.served:
            return f"the agenthost serving {home} exited without replying"
        if read_state(home) == "stopping":
            return _stopping(home, probe.pid)
        return None

    return check


def no_reply(args: argparse.Namespace) -> CliError:
    api = endpoints(args)[0]
    if not api.startswith("ipc://"):
        # A CURVE endpoint drops an unauthorized client silently: say what to check.
        return unreachable(
            f"no reply from {api} within {args.timeout:g} s (a TCP endpoint answers only a "
            "client with an authorized key: --connection FILE or $AGENTHOST_CONNECTION)"
        )
    who = "the daemon"
    home = home_of(args, api)
    if home is not None:
        probe = probe_home(home)
        if not probe.served:
            return unreachable(f"the agenthost serving {home} exited without replying")
        state = read_state(home)
        if state == "stopping":
            return unreachable(_stopping(home, probe.pid))
        if state:
            return unreachable(
                f"no reply within {args.timeout:g} s; agenthost (pid {probe.pid}) is "
                f"{_words(state)} (--timeout waits longer)"
            )
        who = f"agenthost (pid {probe.pid})"
    # No request id here: it means nothing to the user (the daemon logs it with `-v`).
    return unreachable(
        f"no reply within {args.timeout:g} s; {who} is running but busy or hung "
        "(--timeout waits longer)"
    )
