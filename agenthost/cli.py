"""The `agenthost` command: `serve` runs the daemon; the other subcommands are its client
(human output by default, `--json` for scripts, a non-zero exit code with the error reason).

Exit codes: 0 success; 1 the daemon answered with an error, or the turn/fork did not succeed;
2 usage; 3 the daemon cannot be reached; 4 a fork's delivery is unknown (retry reuses its ids);
130 `say` stopped by Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agenthost.config import (
    ConfigError,
    check_home_paths,
    check_listen,
    default_home,
    load_config,
)
from agenthost.home import HomeInUse, HomeUnsafe, probe_home
from domain.providers import PROVIDERS

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_UNKNOWN = 4
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(args.run(args))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # `agenthost show … | head`: the reader left. Say nothing, and stop Python's own
        # flush at exit from raising again on the closed pipe.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _parser() -> argparse.ArgumentParser:
    from agenthost import __version__

    p = argparse.ArgumentParser(
        prog="agenthost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"agenthost {__version__}")
    p.add_argument("--home", type=Path, default=None, help="AGENTHOST_HOME (data dir)")
    p.add_argument("--connect", default=None, help="API endpoint (default: the home's ipc socket)")
    p.add_argument(
        "--events", default=None, help="events endpoint (default: the home's ipc events socket)"
    )
    p.add_argument(
        "--connection",
        type=Path,
        default=None,
        help="connection file for TCP (CURVE keys; default: $AGENTHOST_CONNECTION)",
    )
    p.add_argument("--workspace", default="default", help="workspace id (default: default)")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for a reply (default: 10)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # `--json` is accepted after the subcommand too; SUPPRESS keeps a global one intact.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    session_help = "session id or unique id prefix"

    s = sub.add_parser("serve", help="run the daemon in the foreground")
    s.add_argument(
        "--config", type=Path, default=None, help="config file (default: HOME/agenthost.toml)"
    )
    s.add_argument(
        "--listen", action="append", default=[], help="extra endpoint, e.g. tcp://127.0.0.1:7777"
    )
    s.add_argument(
        "--events-listen",
        action="append",
        default=[],
        help="extra events endpoint, e.g. tcp://127.0.0.1:7778 (CURVE, like --listen)",
    )
    s.add_argument(
        "--events-exact-listen",
        action="append",
        default=[],
        help="extra endpoint of the events socket whose topic is the workspace id + NUL "
        "(CURVE on tcp)",
    )
    s.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --listen address"
    )
    s.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="-v: one log line per request, turn and fork transition; -vv: debug logs",
    )
    s.set_defaults(run=_serve)

    sub.add_parser("status", parents=[common], help="daemon status").set_defaults(run=_status)
    sub.add_parser(
        "sessions", parents=[common], help="list sessions as a fork lineage tree"
    ).set_defaults(run=_sessions)
    n = sub.add_parser("new", parents=[common], help="create a session")
    n.add_argument(
        "--provider", default="tutti-agent", choices=PROVIDERS, help="default: tutti-agent"
    )
    n.add_argument("--title", default=None, help="default: New session")
    n.add_argument(
        "--cwd",
        default=None,
        help="the session's working directory (default: the current one; made absolute)",
    )
    n.add_argument("--model", default=None, help="the provider's model for this session")
    n.add_argument(
        "--settings",
        action="append",
        default=[],
        metavar="K=V",
        help="a session setting (repeatable; V is parsed as JSON when it can be)",
    )
    n.set_defaults(run=_new)
    y = sub.add_parser("say", parents=[common], help="run a turn and stream it")
    y.add_argument("session", help=session_help)
    y.add_argument("text", help="the user message")
    y.add_argument("--answer", default=None, help="reply to a question the turn asks")
    y.add_argument(
        "--approve",
        action="store_const",
        const="approve",
        dest="decision",
        default=None,
        help="approve an approval the turn asks for",
    )
    y.add_argument(
        "--decline",
        action="store_const",
        const="decline",
        dest="decision",
        help="decline an approval the turn asks for",
    )
    y.add_argument(
        "--turn-timeout",
        type=float,
        default=600.0,
        help="seconds to follow the turn (default: 600); it keeps running after",
    )
    y.set_defaults(run=_say)
    w = sub.add_parser("show", parents=[common], help="show a session's transcript")
    w.add_argument("session", help=session_help)
    w.set_defaults(run=_show)
    f = sub.add_parser(
        "fork",
        parents=[common],
        help="fork a session through a settled turn, or from its latest settled turn",
    )
    f.add_argument("session", help=session_help)
    where = f.add_mutually_exclusive_group(required=True)
    where.add_argument("--through", metavar="TURN", help="turn id, unique prefix or sequence")
    where.add_argument(
        "--latest",
        action="store_true",
        help="fork the whole session from where it is now: its newest settled turn "
        "(needs lifecycleCapabilities.forkFullSession)",
    )
    f.add_argument(
        "--fork-timeout", type=float, default=120.0, help="seconds to wait (default: 120)"
    )
    f.set_defaults(run=_fork)
    t = sub.add_parser("tree", parents=[common], help="a session's fork tree (ancestors, forks)")
    t.add_argument("session", help="session id or unique prefix")
    t.set_defaults(run=_tree)
    r = sub.add_parser(
        "resolve", parents=[common], help="inspect, adopt or abandon an unknown fork operation"
    )
    r.add_argument("operation")
    how = r.add_mutually_exclusive_group()
    how.add_argument(
        "--adopt",
        action="store_const",
        const="adopt",
        dest="action",
        help="bind and commit the one verified provider child (verdict adoptable)",
    )
    how.add_argument(
        "--abandon",
        action="store_const",
        const="abandon",
        dest="action",
        help="quarantine any provider child and release the boundary (status abandoned)",
    )
    r.add_argument("--request-id", default=None, help="idempotency key (default: a new one)")
    r.set_defaults(run=_resolve, action="inspect")
    o = sub.add_parser("op", parents=[common], help="show a fork operation")
    o.add_argument("operation", help="operation id or unique prefix (of a committed fork)")
    o.add_argument("--ack", action="store_true", help="acknowledge it (committed only)")
    o.set_defaults(run=_op)
    i = sub.add_parser("interrupt", parents=[common], help="interrupt the session's running turn")
    i.add_argument("session", help=session_help)
    i.set_defaults(run=_interrupt)
    a = sub.add_parser(
        "answer", parents=[common], help="answer the session's pending approval or question"
    )
    a.add_argument("session", help=session_help)
    choice = a.add_mutually_exclusive_group(required=True)
    choice.add_argument(
        "--approve",
        action="store_const",
        const="approve",
        dest="decision",
        help="approve the pending approval",
    )
    choice.add_argument(
        "--decline",
        action="store_const",
        const="decline",
        dest="decision",
        help="decline the pending approval",
    )
    choice.add_argument("--text", default=None, help="the reply to the pending question")
    a.set_defaults(run=_answer)
    d = sub.add_parser("delete", parents=[common], help="delete a session (asks first)")
    d.add_argument("session", help=session_help)
    d.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    d.set_defaults(run=_delete)
    r = sub.add_parser("rename", parents=[common], help="change a session's title")
    r.add_argument("session", help=session_help)
    r.add_argument("title", help="the new title")
    r.set_defaults(run=_rename)
    for name, pinned in (("pin", True), ("unpin", False)):
        q = sub.add_parser(name, parents=[common], help=f"{name} a session")
        q.add_argument("session", help=session_help)
        q.set_defaults(run=_pin, pinned=pinned)
    t = sub.add_parser(
        "settings", parents=[common], help="show or change a session's settings (merged)"
    )
    t.add_argument("session", help=session_help)
    t.add_argument(
        "pairs",
        nargs="*",
        metavar="K=V",
        help="settings to set (V parsed as JSON when it can be; V=null removes K)",
    )
    t.set_defaults(run=_settings)
    g = sub.add_parser("gui", help="the terminal GUI")
    g.set_defaults(run=_gui)
    k = sub.add_parser("keys", help="client keys for TCP access (CURVE)")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    ka = ksub.add_parser("add", help="mint a client key and print its connection file")
    ka.add_argument("name")
    ka.add_argument(
        "-o", "--output", type=Path, default=None, help="write the connection file here (0600)"
    )
    ksub.add_parser("revoke", help="remove a client key").add_argument("name")
    ksub.add_parser("list", parents=[common], help="the authorized client keys")
    k.set_defaults(run=_keys)
    return p


# -- serve --------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose > 1 else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from agenthost import activity

    activity.enable(args.verbose > 0)
    try:
        config = load_config(args.home, args.config)
        for endpoint in [*args.listen, *args.events_listen, *args.events_exact_listen]:
            check_listen(endpoint, args.allow_remote or config.allow_remote)
        check_home_paths(config)
    except ConfigError as exc:
        # Every configuration mistake: one line naming what is wrong, exit 2, no traceback.
        print(f"agenthost: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # Imported only now: a configuration error is reported without loading the daemon.
    from agenthost.daemon import Daemon

    # Every TCP endpoint is a CURVE server (run/keys/, run/connection.json): the daemon always
    # gives its server the keys, so `allow_remote` never exposes an unauthenticated socket.
    daemon = Daemon(
        config,
        listen=tuple(args.listen),
        events_listen=tuple(args.events_listen),
        events_exact_listen=tuple(args.events_exact_listen),
    )
    # The handlers only flip a flag: a handler taking a lock (Event.set) can deadlock with the
    # main thread interrupted inside that same lock.
    signalled: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: signalled.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: signalled.append(signum))
    try:
        daemon.start()
    except HomeInUse as exc:
        # The live daemon's lock: nothing of this home was touched (no store open, no write).
        print(f"agenthost: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (HomeUnsafe, ConfigError) as exc:
        print(f"agenthost: cannot start: {exc}", file=sys.stderr)
        daemon.close()
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - report start-up failures plainly
        print(f"agenthost: cannot start: {exc}", file=sys.stderr)
        daemon.close()
        return EXIT_ERROR
    print(json.dumps(daemon.ready_line()), flush=True)
    while not signalled:
        time.sleep(0.1)
    daemon.close()
    return 0


# -- client plumbing -----------------------------------------------------------------------


class CliError(Exception):
    """A failure reported to the user: its reason, message, exit code and wire error if any."""

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        code: int = EXIT_ERROR,
        error: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.code = code
        self.error = dict(error) if error else {"reason": reason, "message": message}


def connection(args: argparse.Namespace) -> Any:
    """The parsed `--connection` file (or $AGENTHOST_CONNECTION), None without one."""
    from agenthost.keys import CONNECTION_ENV, KeyError_, load_connection

    path = getattr(args, "connection", None) or os.environ.get(CONNECTION_ENV) or None
    if path is None:
        return None
    cached = getattr(args, "_connection_loaded", None)
    if cached is None:
        try:
            cached = load_connection(Path(path))
        except KeyError_ as exc:
            raise CliError("bad_connection_file", str(exc), code=EXIT_USAGE) from None
        args._connection_loaded = cached
    return cached


def endpoints(args: argparse.Namespace) -> tuple[str, str]:
    """(api, events); events is "" when a connection file names no events endpoint."""
    run = (args.home or default_home()).expanduser() / "run"
    conn = connection(args)
    if conn is not None:
        return args.connect or conn.api, args.events or conn.events or ""
    api = args.connect or f"ipc://{run / 'api.sock'}"
    events = args.events or f"ipc://{run / 'events.sock'}"
    return api, events


def events_endpoint(args: argparse.Namespace) -> str | None:
    """The events endpoint to subscribe to, or None (none named, or no ipc socket there)."""
    return events_source(args)[0]


def events_source(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(endpoint, exact): the events endpoint to subscribe to (None: none) and whether it is
    the terminated-topic one (`eventsExact`, issue 15 #9), preferred wherever the daemon
    advertises it — its connection file's `eventsExact`, or the home's `events-exact.sock` —
    unless `--events` names an endpoint."""
    if not args.events:
        conn = connection(args)
        if conn is not None and conn.events_exact:
            return conn.events_exact, True
        if conn is None:
            run = (args.home or default_home()).expanduser() / "run"
            if (run / "events-exact.sock").exists():
                return f"ipc://{run / 'events-exact.sock'}", True
    _, events = endpoints(args)
    if not events or (events.startswith("ipc://") and not Path(events[len("ipc://") :]).exists()):
        return None, False
    return events, False


def curve(args: argparse.Namespace) -> Any:
    """The CURVE keys of the connection file (None without one)."""
    conn = connection(args)
    return None if conn is None else conn.curve


def _client(args: argparse.Namespace) -> Any:
    from transport.client import Client

    api, _ = endpoints(args)
    check_reachable(args, api)
    return Client(api, timeout=args.timeout, curve=curve(args))


def _home(args: argparse.Namespace) -> Path:
    return Path(os.path.abspath((args.home or default_home()).expanduser()))


def _unreachable(message: str) -> CliError:
    return CliError("daemon_unreachable", message, code=EXIT_UNREACHABLE)


def check_reachable(args: argparse.Namespace, api: str) -> None:
    """Tell a dead daemon from a slow one before sending anything: ZeroMQ would queue a
    request to a dead endpoint until `--timeout`. The home's lock is held exactly while a
    daemon lives (the kernel drops it with the process), so a free lock means dead, now."""
    home = _home_of(args, api)
    if home is not None:
        probe = probe_home(home)
        if not probe.served:
            if _accepts(api[len("ipc://") :]):
                return  # served without the lock (a daemon older than the lock file)
            raise _unreachable(f"no agenthost is serving {home} (is `agenthost serve` running?)")
        # Served: the socket appears once the daemon has finished its start-up recovery.
        sock = Path(api[len("ipc://") :])
        deadline = time.monotonic() + args.timeout
        while not sock.exists():
            if not probe_home(home).served:
                raise _unreachable(f"the agenthost serving {home} has exited")
            if time.monotonic() > deadline:
                raise _unreachable(
                    f"agenthost (pid {probe.pid}) holds {home} but has not opened {sock} "
                    f"within {args.timeout:g} s (still starting?)"
                )
            time.sleep(0.05)
        return
    if not api.startswith("ipc://") or api.startswith("ipc://@"):
        return
    path = api[len("ipc://") :]
    if not Path(path).exists():
        raise _unreachable(f"no daemon socket at {api} (is `agenthost serve` running?)")
    if _accepts(path) is False:
        raise _unreachable(f"nothing listens on {api} (a daemon that died left it)")


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


def _home_of(args: argparse.Namespace, api: str) -> Path | None:
    """The home whose own ipc socket `api` is (its lock then tells if a daemon lives)."""
    home = _home(args)
    if api.startswith("ipc://") and Path(os.path.abspath(api[len("ipc://") :])) == (
        home / "run" / "api.sock"
    ):
        return home
    return None


def _no_reply(args: argparse.Namespace) -> CliError:
    api = endpoints(args)[0]
    if not api.startswith("ipc://"):
        # A CURVE endpoint drops an unauthorized client silently: say what to check.
        return _unreachable(
            f"no reply from {api} within {args.timeout:g} s (a TCP endpoint answers only a "
            "client with an authorized key: --connection FILE or $AGENTHOST_CONNECTION)"
        )
    who = "the daemon"
    home = _home_of(args, api)
    if home is not None:
        probe = probe_home(home)
        if not probe.served:
            return _unreachable(f"the agenthost serving {home} exited without replying")
        who = f"agenthost (pid {probe.pid})"
    # No request id here: it means nothing to the user (the daemon logs it with `-v`).
    return _unreachable(
        f"no reply within {args.timeout:g} s; {who} is running but busy or hung "
        "(--timeout waits longer)"
    )


def _api_error(exc: Any) -> CliError:
    return CliError(
        exc.reason or exc.code,
        exc.message,
        error={
            "status": exc.status,
            "code": exc.code,
            "reason": exc.reason,
            "message": exc.message,
            "retryable": exc.retryable,
            "params": exc.params,
        },
    )


def _with_client(
    fn: Callable[[argparse.Namespace, Any], int],
) -> Callable[[argparse.Namespace], int]:
    """Run a command with a client; map every failure to a CliError with its exit code."""

    def run(args: argparse.Namespace) -> int:
        from client.session_client import ReferenceError_
        from transport.client import ApiError, ClientTimeout

        client = None
        try:
            client = _client(args)
            return int(fn(args, client) or 0)
        except CliError as exc:
            return _fail(args, exc)
        except ApiError as exc:
            return _fail(args, _api_error(exc))
        except ReferenceError_ as exc:
            return _fail(args, CliError(exc.reason, exc.message))
        except (ClientTimeout, TimeoutError):
            return _fail(args, _no_reply(args))
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        finally:
            if client is not None:
                client.close()

    return run


def _fail(args: argparse.Namespace, exc: CliError) -> int:
    if args.json:
        print(json.dumps({"error": exc.error}))
    else:
        print(f"agenthost: {exc.reason}: {exc.message}", file=sys.stderr)
    return exc.code


def _emit(args: argparse.Namespace, data: Any, human: str) -> None:
    if args.json:
        print(json.dumps(data))
    elif human:
        print(human)


def _call(args: argparse.Namespace, client: Any, method: str, **params: Any) -> dict[str, Any]:
    body = {} if method == "host.status" else {"workspaceId": args.workspace, **params}
    return dict(client.call(method, body))


# -- commands ------------------------------------------------------------------------------


@_with_client
def _status(args: argparse.Namespace, client: Any) -> int:
    result = _call(args, client, "host.status")
    workers = ", ".join(
        f"{w['provider']} {w['state']} (pid {w['pid']}, {w['restarts']} restarts)"
        for w in result["workers"]
    )
    _emit(
        args,
        result,
        f"agenthost {result['version']} (protocol {result['protocol']}) at {result['home']}, "
        f"up {result['uptimeMs'] / 1000:.0f} s\nworkers: {workers or 'none started'}"
        + "".join(f"\n{_provider_line(p)}" for p in result.get("providers") or []),
    )
    return EXIT_OK


def _provider_line(p: Mapping[str, Any]) -> str:
    """One provider in words: program and version, endpoint, model, credential source (the
    variable's name and whether it is set, never its value)."""
    if not p.get("installed"):
        return f"  {p['provider']}: NOT INSTALLED ({p.get('program')})"
    cred = p.get("credential") or {}
    source = cred.get("source")
    if source == "env":
        credential = f"${cred.get('variable')} ({'set' if cred.get('set') else 'NOT SET'})"
    elif source == "file":
        credential = "api_key in agenthost.toml"
    elif source == "login":
        credential = "the user's own login"
    else:
        credential = "none"
    endpoint = p.get("endpoint") or "default"
    wire = f" [{p['wireApi']}]" if p.get("wireApi") else ""
    return (
        f"  {p['provider']} {p.get('version') or '?'}: endpoint {endpoint}{wire}, "
        f"model {p.get('model') or 'default'}, credential {credential}"
    )


@_with_client
def _sessions(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import list_sessions, session_tree

    sessions = list_sessions(client, args.workspace)
    lines = [f"{'SESSION':<36}  {'PROVIDER':<11} {'FORK':<7} TITLE"] if sessions else []
    for row in session_tree(sessions):
        s = row.session
        indent = "  " * row.depth + ("└─ " if row.depth else "")
        fork = "fork" if s["lifecycleCapabilities"]["forkThroughTurn"] else "no-fork"
        active = "  (turn active)" if s.get("activeTurnId") else ""
        lines.append(
            f"{indent}{s['agentSessionId']}  {s['provider']:<11} {fork:<7} {s['title']}{active}"
        )
    _emit(args, {"sessions": sessions}, "\n".join(lines) or "(no sessions)")
    return EXIT_OK


def _parse_pairs(pairs: list[str], what: str) -> dict[str, Any]:
    """`k=v` pairs; `v` is JSON when it parses (`n=3`, `flag=true`), else the plain string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CliError("invalid_argument", f"{what} {pair!r} is not KEY=VALUE", code=EXIT_USAGE)
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _absolute_cwd(value: str | None) -> str:
    path = Path(value).expanduser() if value else Path.cwd()
    path = path.resolve()
    if not path.is_dir():
        raise CliError(
            "invalid_cwd", f"--cwd {value!r}: no such directory ({path})", code=EXIT_USAGE
        )
    return str(path)


@_with_client
def _new(args: argparse.Namespace, client: Any) -> int:
    params: dict[str, Any] = {"provider": args.provider, "cwd": _absolute_cwd(args.cwd)}
    if args.title:
        params["title"] = args.title
    if args.settings:
        params["settings"] = _parse_pairs(args.settings, "--settings")
    if args.model:
        params["model"] = args.model  # only when given: a daemon without it keeps its default
    session = _call(args, client, "session.create", **params)["session"]
    _emit(
        args,
        {"session": session},
        f"{session['agentSessionId']}  {session['provider']}  {session['title']}",
    )
    return EXIT_OK


class _Followed:
    """What `say` knows about its turn so far (for Ctrl-C: which turn to interrupt)."""

    def __init__(self) -> None:
        self.turn: dict[str, Any] | None = None


class _JsonLines:
    """`say --json`: one JSON object per event — each message once it can no longer grow,
    each Interaction when it appears and when it is answered, then the settled turn."""

    def __init__(self) -> None:
        self.messages: set[str] = set()
        self.interactions: dict[str, str] = {}

    def update(self, turn: Mapping[str, Any]) -> None:
        messages = list(turn.get("messages") or [])
        settled = turn.get("phase") == "settled"
        for index, message in enumerate(messages):
            if message["messageId"] in self.messages:
                continue
            if not settled and index == len(messages) - 1 and message.get("kind") == "assistant":
                continue  # may still be streaming
            self.messages.add(message["messageId"])
            _jsonl({"type": "message", "message": message})
        for interaction in turn.get("interactions") or []:
            if self.interactions.get(interaction["requestId"]) != interaction["status"]:
                self.interactions[interaction["requestId"]] = interaction["status"]
                _jsonl({"type": "interaction", "interaction": interaction})

    @staticmethod
    def delta(event: Mapping[str, Any]) -> None:
        """A streamed piece of a reply (not durable: the settled `message` line is the record)."""
        _jsonl({**event, "type": "message.delta"})


def _jsonl(obj: Mapping[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


@_with_client
def _say(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import (
        TurnPrinter,
        TurnWaitTimeout,
        resolve_session,
        stream_turn,
    )

    sid = resolve_session(client, args.workspace, args.session)
    events, exact = events_source(args)
    printer: Any = _JsonLines() if args.json else TurnPrinter(print, _write)
    followed = _Followed()
    pending: list[Mapping[str, Any]] = []

    def on_update(turn: dict[str, Any]) -> None:
        followed.turn = turn
        printer.update(turn)

    def on_interaction(interaction: Mapping[str, Any]) -> dict[str, Any] | None:
        response = _interaction_response(args, interaction)
        if response is None:
            pending.append(interaction)
            raise _InteractionPending()
        return response

    try:
        turn = stream_turn(
            client,
            args.workspace,
            sid,
            args.text,
            events_endpoint=events,
            events_curve=curve(args),
            events_exact=exact,
            on_update=on_update,
            on_interaction=on_interaction,
            timeout=args.turn_timeout,
            on_delta=printer.delta,
        )
    except TurnWaitTimeout as exc:
        # The daemon is reachable (not exit 3): the Turn is just still running there.
        raise CliError(
            "turn_timeout",
            f"{exc} (--turn-timeout); it keeps running in the daemon: "
            f"`agenthost show {sid}` shows where it is, `agenthost interrupt {sid}` stops it",
        ) from None
    except _InteractionPending:
        interaction = pending[-1]
        # Nobody can answer here: do not leave the session blocked on a turn nobody will finish.
        turn = _stop_turn(args, client, sid, str(interaction["turnId"]), printer)
        raise CliError(
            "interaction_pending",
            f"the turn asked for a {interaction['kind']} ({_describe(interaction)}) and was "
            "interrupted; run it again with --answer TEXT, --approve or --decline "
            "(or answer from another terminal with `agenthost answer`)",
        ) from None
    except KeyboardInterrupt:
        # First Ctrl-C (or Ctrl-C at a prompt): interrupt the turn and wait for it to settle.
        turn_id = (followed.turn or {}).get("turnId") or _active_turn(args, client, sid)
        if not turn_id:
            print("\nagenthost: interrupted before the turn started", file=sys.stderr)
            return EXIT_INTERRUPTED
        try:
            # Inside the try: a second Ctrl-C right after this line is already "stop waiting".
            if not args.json:
                print("\n… interrupting the turn (Ctrl-C again leaves it running)", file=sys.stderr)
            turn = _stop_turn(args, client, sid, str(turn_id), printer)
        except KeyboardInterrupt:
            print(
                "\nagenthost: stopped waiting; the turn may still be running: "
                f"`agenthost interrupt {sid}` stops it, `agenthost show {sid}` shows it",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        code = _report_turn(args, turn)
        return code if code == EXIT_OK else EXIT_INTERRUPTED
    return _report_turn(args, turn)


def _report_turn(args: argparse.Namespace, turn: Mapping[str, Any]) -> int:
    ok = turn.get("outcome") == "completed"
    if args.json:
        data: dict[str, Any] = {"type": "turn", "turn": turn}
        if not ok:
            data["error"] = {
                "reason": f"turn_{turn.get('outcome') or 'unsettled'}",
                "message": turn.get("error") or "",
            }
        _jsonl(data)
    elif not ok:
        print(
            f"agenthost: turn_{turn.get('outcome') or 'unsettled'}: {turn.get('error') or ''}",
            file=sys.stderr,
        )
    return EXIT_OK if ok else EXIT_ERROR


def _active_turn(args: argparse.Namespace, client: Any, sid: str) -> str | None:
    session = _call(args, client, "session.get", agentSessionId=sid)["session"]
    active = session.get("activeTurnId")
    return str(active) if active else None


def _stop_turn(
    args: argparse.Namespace, client: Any, sid: str, turn_id: str, printer: Any | None = None
) -> dict[str, Any]:
    """turn.interrupt, then follow the turn until it settles (printing what is new)."""
    from client.session_client import get_turn
    from transport.client import ApiError

    try:
        turn = _call(args, client, "turn.interrupt", agentSessionId=sid, turnId=turn_id)["turn"]
    except ApiError as exc:
        if exc.status >= 500:
            raise
        turn = get_turn(client, args.workspace, sid, turn_id)  # e.g. it settled meanwhile
    deadline = time.monotonic() + max(args.timeout, 5.0)
    while turn.get("phase") != "settled" and time.monotonic() < deadline:
        time.sleep(0.05)
        turn = get_turn(client, args.workspace, sid, turn_id, int(turn["sequence"]))
    if printer is not None:
        printer.update(turn)
    return dict(turn)


def _write(text: str) -> None:
    """Partial output (a streamed reply): written and flushed at once."""
    sys.stdout.write(text)
    sys.stdout.flush()


class _InteractionPending(Exception):
    pass


def _describe(interaction: Mapping[str, Any]) -> str:
    from client.session_client import describe_interaction

    return describe_interaction(interaction)


def _interaction_response(
    args: argparse.Namespace, interaction: Mapping[str, Any]
) -> dict[str, Any] | None:
    kind = interaction.get("kind")
    if kind == "approval" and args.decision:
        return {"decision": args.decision}
    if kind != "approval" and args.answer is not None:
        return {"text": args.answer}
    if sys.stdin.isatty() and not args.json:
        prompt = _describe(interaction)
        try:
            if kind == "approval":
                reply = input(f"approve {prompt}? [y/N] ").strip().lower()
                return {"decision": "approve" if reply in ("y", "yes") else "decline"}
            return {"text": input(f"{kind}: {prompt} > ")}
        except EOFError:
            # End of input is not an answer: an approval is declined, a question can only be
            # given up by interrupting the turn. Either way nothing stays pending.
            print(file=sys.stderr)
            if kind == "approval":
                print("agenthost: end of input: declined", file=sys.stderr)
                return {"decision": "decline"}
            print("agenthost: end of input: interrupting the turn", file=sys.stderr)
            raise KeyboardInterrupt from None
    return None


@_with_client
def _show(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import (
        ancestry,
        format_transcript,
        resolve_session,
        source_title,
        timeline,
    )

    sid = resolve_session(client, args.workspace, args.session)
    session = _call(args, client, "session.get", agentSessionId=sid)["session"]
    turns = timeline(client, args.workspace, sid)
    source = source_title(client, args.workspace, session)
    chain = ancestry(client, args.workspace, session)
    _emit(
        args,
        {"session": session, "turns": turns},
        format_transcript(session, turns, source, chain),
    )
    return EXIT_OK


@_with_client
def _tree(args: argparse.Namespace, client: Any) -> int:
    from client.lineage_view import format_tree
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    tree = _call(args, client, "session.lineage", agentSessionId=sid)
    _emit(args, tree, format_tree(tree))
    return EXIT_OK


@_with_client
def _resolve(args: argparse.Namespace, client: Any) -> int:
    from client.lineage_view import format_resolution

    result = _call(
        args,
        client,
        "fork.resolve",
        operationId=args.operation,
        requestId=args.request_id or str(uuid.uuid4()),
        action=args.action,
    )
    human = format_resolution(result).replace("OP", args.operation)
    if args.action == "adopt" and result["operation"]["status"] == "committed":
        # Adopted like any fork commit: the boundary stays held until a client ACKs it.
        human += f"\n  next: agenthost op {args.operation} --ack (releases the turn for new forks)"
    _emit(args, result, human)
    return EXIT_OK


@_with_client
def _fork(args: argparse.Namespace, client: Any) -> int:
    from client.engine import LATEST_SETTLED, AckState, Engine, MutationStatus
    from client.session_client import resolve_session, resolve_turn, timeline

    sid = resolve_session(client, args.workspace, args.session)
    if args.latest:
        turn_id = LATEST_SETTLED  # the daemon resolves the boundary; the Engine's key for it
    else:
        turn_id = resolve_turn(timeline(client, args.workspace, sid), args.through)
    events, exact = events_source(args)
    engine = Engine(client, args.workspace)
    try:
        if events is not None:
            engine.attach_events(events, curve=curve(args), exact=exact)
        record = engine.fork_latest(sid) if args.latest else engine.fork(sid, turn_id)
        shown: str | None = None

        def changed() -> bool:
            return engine.mutation(sid, turn_id) != record

        deadline = time.monotonic() + args.fork_timeout
        while record.status is MutationStatus.IN_FLIGHT and time.monotonic() < deadline:
            if not args.json and record.operation_id and record.phase != shown:
                shown = record.phase
                print(
                    f"… fork accepted ({shown}), operation {record.operation_id}", file=sys.stderr
                )
            engine.wait_for(changed, 0.5)
            record = engine.mutation(sid, turn_id) or record
        if record.status is MutationStatus.SUCCEEDED:
            # Give the client-observed ACK its deadline (and first retry) before we exit.
            engine.wait_for(
                lambda: getattr(engine.mutation(sid, turn_id), "ack", None) is AckState.OBSERVED,
                engine.ack_deadline + 2,
            )
            record = engine.mutation(sid, turn_id) or record
        operation = None
        if record.operation_id:
            operation = engine.request(
                "fork.get", {"operationId": record.operation_id}, timeout=args.timeout
            )["operation"]
        session: Mapping[str, Any] | None = None
        turns: list[dict[str, Any]] = []
        if record.error_detail is not None:
            # A refusal before any operation: read the source so the sentence can name turns.
            with contextlib.suppress(Exception):
                session = _call(args, client, "session.get", agentSessionId=sid)["session"]
                turns = timeline(client, args.workspace, sid)
    finally:
        engine.close()
    return _report_fork(args, record, operation, session=session, turns=turns)


def _report_fork(
    args: argparse.Namespace,
    record: Any,
    operation: Any,
    *,
    session: Mapping[str, Any] | None = None,
    turns: list[dict[str, Any]] | None = None,
) -> int:
    from client.engine import AckState, MutationStatus
    from client.session_client import fork_refusal

    data = {"mutation": record.to_dict(), "operation": operation}
    status = record.status
    if status is MutationStatus.SUCCEEDED:
        child = (operation or {}).get("session") or {}
        how = "from its latest settled turn, " if record.point != "throughTurn" else ""
        human = (
            f"forked {record.source_session_id} {how}through turn {record.boundary}\n"
            f"child {record.child_session_id}  {child.get('title', '')}\n"
            f"operation {record.operation_id} committed"
        )
        if record.ack is not AckState.OBSERVED:
            human += (
                "\nwarning: acknowledgement still pending; the boundary stays held until a "
                "client acknowledges it (`agenthost op --ack`)"
            )
        _emit(args, data, human)
        return EXIT_OK
    if status is MutationStatus.IN_FLIGHT:
        reason, code = "fork_timeout", EXIT_UNKNOWN
        message = f"operation {record.operation_id} still accepted; see `agenthost op`"
    elif status is MutationStatus.UNKNOWN:
        reason, code = "agent_session_fork_delivery_unknown", EXIT_UNKNOWN
        message = f"{record.error}; a retry reuses the same identity and never forks twice"
        if record.operation_id:
            message += f"; or settle it: agenthost resolve {record.operation_id}"
    elif record.error_detail is not None:
        # Refused before any operation existed: the daemon's error reply, in words.
        detail = dict(record.error_detail)
        reason, code = str(detail.get("reason") or "agent_session_fork_failed"), EXIT_ERROR
        message = fork_refusal(
            reason,
            detail.get("params"),
            turn_id=record.turn_id,
            latest=record.point != "throughTurn",
            turns=turns or [],
            session=session,
            message=detail.get("message"),
        )
        error = {**detail, "reason": reason, "message": message}
        error.setdefault("retryable", False)
        if args.json:
            print(json.dumps({**data, "error": error}))
        else:
            print(f"agenthost: {message}", file=sys.stderr)
        return code
    else:
        reason, code = record.error or "agent_session_fork_failed", EXIT_ERROR
        message = f"fork failed: {(operation or {}).get('error') or record.error}"
    if args.json:
        print(json.dumps({**data, "error": {"reason": reason, "message": message}}))
    else:
        print(f"agenthost: {reason}: {message}", file=sys.stderr)
    return code


@_with_client
def _op(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_operation

    method = "fork.acknowledge" if args.ack else "fork.get"
    operation_id = resolve_operation(client, args.workspace, args.operation)
    op = _call(args, client, method, operationId=operation_id)["operation"]
    point = op["point"]
    lines = [
        f"operation {op['operationId']}: {op['status']} ({op['phase']})",
        f"  source {op['sourceAgentSessionId']}"
        + (" from its latest settled turn," if point.get("type") == "latestSettled" else "")
        + f" through turn {point['turnId']}",
        f"  target {op['targetAgentSessionId']}  request {op['requestId']}",
    ]
    if op.get("error"):
        lines.append(f"  error: {op['error']}")
    if op.get("session"):
        lines.append(f"  child: {op['session']['title']}")
    _emit(args, {"operation": op}, "\n".join(lines))
    return EXIT_OK


@_with_client
def _interrupt(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    turn_id = _active_turn(args, client, sid)
    if turn_id is None:
        _emit(args, {"turn": None}, "nothing to interrupt: no turn is running")
        return EXIT_OK
    turn = _stop_turn(args, client, sid, turn_id)
    why = f": {turn['error']}" if turn.get("error") else ""
    _emit(
        args,
        {"turn": turn},
        f"Turn {turn['sequence']} {turn.get('outcome') or turn['phase']}{why}",
    )
    return EXIT_OK


@_with_client
def _answer(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import get_turn, resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    turn_id = _active_turn(args, client, sid)
    turn = get_turn(client, args.workspace, sid, turn_id) if turn_id else {}
    waiting = [i for i in turn.get("interactions") or [] if i.get("status") == "pending"]
    if not waiting:
        raise CliError("no_pending_interaction", "the session is not waiting for an answer")
    interaction = waiting[0]
    kind = interaction.get("kind")
    if kind == "approval" and args.decision is None:
        raise CliError(
            "wrong_answer_kind",
            f"the turn asks for an approval ({_describe(interaction)}): use --approve or --decline",
        )
    if kind != "approval" and args.decision is not None:
        raise CliError(
            "wrong_answer_kind",
            f"the turn asks a {kind} ({_describe(interaction)}): use --text",
        )
    response = {"decision": args.decision} if args.decision else {"text": args.text}
    result = _call(
        args,
        client,
        "interaction.respond",
        agentSessionId=sid,
        turnId=interaction["turnId"],
        requestId=interaction["requestId"],
        response=response,
    )
    what = {"approve": "approved", "decline": "declined"}.get(
        str(args.decision), f"answered {json.dumps(args.text)}"
    )
    _emit(args, result, f"{kind}: {_describe(interaction)} → {what}")
    return EXIT_OK


@_with_client
def _delete(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = _call(args, client, "session.get", agentSessionId=sid)["session"]
    if not args.yes:
        if args.json or not sys.stdin.isatty():
            raise CliError(
                "confirmation_required", "not a terminal: pass --yes to delete without asking"
            )
        try:
            reply = input(f"delete session {session['title']!r} ({sid})? [y/N] ")
        except EOFError:
            reply = ""
        if reply.strip().lower() not in ("y", "yes"):
            print("not deleted", file=sys.stderr)
            return EXIT_ERROR
    result = _call(args, client, "session.delete", agentSessionId=sid)
    _emit(args, {**result, "agentSessionId": sid}, f"deleted {sid}  {session['title']}")
    return EXIT_OK


@_with_client
def _rename(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = _call(args, client, "session.updateTitle", agentSessionId=sid, title=args.title)[
        "session"
    ]
    _emit(args, {"session": session}, f"{sid}  {session['title']}")
    return EXIT_OK


@_with_client
def _pin(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = _call(args, client, "session.pin", agentSessionId=sid, pinned=args.pinned)["session"]
    _emit(
        args,
        {"session": session},
        f"{sid}  {'pinned' if session['pinned'] else 'unpinned'}",
    )
    return EXIT_OK


@_with_client
def _settings(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = _call(args, client, "session.get", agentSessionId=sid)["session"]
    if args.pairs:
        # session.updateSettings replaces the map: merge here so `k=v` changes only k.
        merged = dict(session.get("settings") or {})
        for key, value in _parse_pairs(args.pairs, "setting").items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        session = _call(
            args, client, "session.updateSettings", agentSessionId=sid, settings=merged
        )["session"]
    settings = session.get("settings") or {}
    _emit(
        args,
        {"session": session},
        "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(settings.items())) or "(no settings)",
    )
    return EXIT_OK


def _gui(args: argparse.Namespace) -> int:
    try:
        api, _ = endpoints(args)
        events, exact = events_source(args)
        check_reachable(args, api)
    except CliError as exc:
        return _fail(args, exc)
    try:
        from client.gui.app import run_gui
    except ImportError as exc:  # textual is the optional `gui` extra
        return _fail(args, CliError("gui_unavailable", f"{exc} (pip install 'agenthost[gui]')"))
    return run_gui(api, events, args.workspace, curve=curve(args), events_exact=exact)


# -- keys -----------------------------------------------------------------------------------


def _keys(args: argparse.Namespace) -> int:
    """`agenthost keys add|revoke|list`: files under the home's run/keys/; the daemon reads
    run/keys/authorized/ at each new TCP connection, so no restart is needed."""
    from agenthost.keys import KeyError_, KeyStore

    store = KeyStore((args.home or default_home()).expanduser().resolve() / "run")
    try:
        if args.keys_command == "add":
            text = store.add(args.name)
            if args.output is not None:
                from agenthost.keys import write_private

                write_private(args.output, text)
                print(f"connection file for {args.name!r} written to {args.output}")
            else:
                sys.stdout.write(text)
        elif args.keys_command == "revoke":
            store.revoke(args.name)
            print(f"revoked {args.name!r} (new connections with it are refused)")
        else:
            names = sorted(store.authorized())
            _emit(args, {"keys": names}, "\n".join(names) or "(no authorized client keys)")
    except KeyError_ as exc:
        return _fail(args, CliError("bad_key", str(exc)))
    return EXIT_OK


def new_request_id() -> str:
    return str(uuid.uuid4())


if __name__ == "__main__":
    sys.exit(main())
