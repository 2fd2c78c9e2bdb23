"""The `agenthost` command: `serve` runs the daemon; the other subcommands are its client
(human output by default, `--json` for scripts, a non-zero exit code with the error reason).

Exit codes: 0 success; 1 the daemon answered with an error, or the turn/fork did not succeed;
2 usage; 3 the daemon cannot be reached; 4 a fork's delivery is unknown (retry reuses its ids).
"""

from __future__ import annotations

import argparse
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

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_UNKNOWN = 4
EXIT_INTERRUPTED = 130

PROVIDERS = ("tutti-agent", "codex", "claude-code")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    return int(args.run(args))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agenthost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a reply")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # `--json` is accepted after the subcommand too; SUPPRESS keeps a global one intact.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command")

    s = sub.add_parser("serve", help="run the daemon in the foreground")
    s.add_argument("--config", type=Path, default=None)
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
    n.add_argument("--provider", default="tutti-agent", choices=PROVIDERS)
    n.add_argument("--title", default=None)
    n.add_argument("--cwd", default=None)
    n.set_defaults(run=_new)
    y = sub.add_parser("say", parents=[common], help="run a turn and stream it")
    y.add_argument("session", help="session id or unique prefix")
    y.add_argument("text")
    y.add_argument("--answer", default=None, help="reply to a question the turn asks")
    y.add_argument(
        "--approve", action="store_const", const="approve", dest="decision", default=None
    )
    y.add_argument("--decline", action="store_const", const="decline", dest="decision")
    y.add_argument("--turn-timeout", type=float, default=600.0)
    y.set_defaults(run=_say)
    w = sub.add_parser("show", parents=[common], help="show a session's transcript")
    w.add_argument("session", help="session id or unique prefix")
    w.set_defaults(run=_show)
    f = sub.add_parser("fork", parents=[common], help="fork a session through a settled turn")
    f.add_argument("session", help="session id or unique prefix")
    f.add_argument(
        "--through", required=True, metavar="TURN", help="turn id, unique prefix or sequence"
    )
    f.add_argument("--fork-timeout", type=float, default=120.0)
    f.set_defaults(run=_fork)
    o = sub.add_parser("op", parents=[common], help="show a fork operation")
    o.add_argument("operation")
    o.add_argument("--ack", action="store_true", help="acknowledge it (committed only)")
    o.set_defaults(run=_op)
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
        for endpoint in [*args.listen, *args.events_listen]:
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
    daemon = Daemon(config, listen=tuple(args.listen), events_listen=tuple(args.events_listen))
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
    _, events = endpoints(args)
    if not events or (events.startswith("ipc://") and not Path(events[len("ipc://") :]).exists()):
        return None
    return events


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
        from agenthost.session_client import ReferenceError_
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
        f"up {result['uptimeMs'] / 1000:.0f} s\nworkers: {workers or 'none started'}",
    )
    return EXIT_OK


@_with_client
def _sessions(args: argparse.Namespace, client: Any) -> int:
    from agenthost.session_client import list_sessions, session_tree

    sessions = list_sessions(client, args.workspace)
    lines = []
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


@_with_client
def _new(args: argparse.Namespace, client: Any) -> int:
    params: dict[str, Any] = {"provider": args.provider}
    if args.title:
        params["title"] = args.title
    if args.cwd:
        params["cwd"] = args.cwd
    session = _call(args, client, "session.create", **params)["session"]
    _emit(
        args,
        {"session": session},
        f"{session['agentSessionId']}  {session['provider']}  {session['title']}",
    )
    return EXIT_OK


@_with_client
def _say(args: argparse.Namespace, client: Any) -> int:
    from agenthost.session_client import (
        TurnPrinter,
        TurnWaitTimeout,
        resolve_session,
        stream_turn,
    )

    sid = resolve_session(client, args.workspace, args.session)
    events = events_endpoint(args)
    printer = TurnPrinter(print)
    pending: list[Mapping[str, Any]] = []

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
            on_update=None if args.json else printer.update,
            on_interaction=on_interaction,
            timeout=args.turn_timeout,
        )
    except TurnWaitTimeout as exc:
        # The daemon is reachable (not exit 3): the Turn is just still running there.
        raise CliError(
            "turn_timeout",
            f"{exc} (--turn-timeout); it keeps running in the daemon: "
            f"`agenthost show {sid}` shows where it is",
        ) from None
    except _InteractionPending:
        interaction = pending[-1]
        # Nobody can answer here: do not leave the session blocked on a turn nobody will finish.
        _call(
            args,
            client,
            "turn.interrupt",
            agentSessionId=sid,
            turnId=interaction["turnId"],
        )
        raise CliError(
            "interaction_pending",
            f"the turn asked for a {interaction['kind']} ({_describe(interaction)}) and was "
            "interrupted; run it again with --answer TEXT, --approve or --decline",
        ) from None
    ok = turn["outcome"] == "completed"
    if args.json:
        data: dict[str, Any] = {"turn": turn}
        if not ok:
            data["error"] = {
                "reason": f"turn_{turn['outcome']}",
                "message": turn.get("error") or "",
            }
        _emit(args, data, "")
    elif not ok:
        print(
            f"agenthost: turn_{turn['outcome']}: {turn.get('error') or ''}",
            file=sys.stderr,
        )
    return EXIT_OK if ok else EXIT_ERROR


class _InteractionPending(Exception):
    pass


def _describe(interaction: Mapping[str, Any]) -> str:
    value = interaction.get("input") or {}
    return str(value.get("text") or value.get("command") or value)


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
        if kind == "approval":
            reply = input(f"approve {prompt}? [y/N] ").strip().lower()
            return {"decision": "approve" if reply in ("y", "yes") else "decline"}
        return {"text": input(f"{kind}: {prompt} > ")}
    return None


@_with_client
def _show(args: argparse.Namespace, client: Any) -> int:
    from agenthost.session_client import (
        format_transcript,
        resolve_session,
        source_title,
        timeline,
    )

    sid = resolve_session(client, args.workspace, args.session)
    session = _call(args, client, "session.get", agentSessionId=sid)["session"]
    turns = timeline(client, args.workspace, sid)
    source = source_title(client, args.workspace, session)
    _emit(
        args,
        {"session": session, "turns": turns},
        format_transcript(session, turns, source),
    )
    return EXIT_OK


@_with_client
def _fork(args: argparse.Namespace, client: Any) -> int:
    from agenthost.engine import AckState, Engine, MutationStatus
    from agenthost.session_client import resolve_session, resolve_turn, timeline

    sid = resolve_session(client, args.workspace, args.session)
    turn_id = resolve_turn(timeline(client, args.workspace, sid), args.through)
    events = events_endpoint(args)
    engine = Engine(client, args.workspace)
    try:
        if events is not None:
            engine.attach_events(events, curve=curve(args))
        record = engine.fork(sid, turn_id)
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
    finally:
        engine.close()
    return _report_fork(args, record, operation)


def _report_fork(args: argparse.Namespace, record: Any, operation: Any) -> int:
    from agenthost.engine import AckState, MutationStatus

    data = {"mutation": record.to_dict(), "operation": operation}
    status = record.status
    if status is MutationStatus.SUCCEEDED:
        child = (operation or {}).get("session") or {}
        human = (
            f"forked {record.source_session_id} through turn {record.turn_id}\n"
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
    method = "fork.acknowledge" if args.ack else "fork.get"
    op = _call(args, client, method, operationId=args.operation)["operation"]
    point = op["point"]
    lines = [
        f"operation {op['operationId']}: {op['status']} ({op['phase']})",
        f"  source {op['sourceAgentSessionId']} through turn {point['turnId']}",
        f"  target {op['targetAgentSessionId']}  request {op['requestId']}",
    ]
    if op.get("error"):
        lines.append(f"  error: {op['error']}")
    if op.get("session"):
        lines.append(f"  child: {op['session']['title']}")
    _emit(args, {"operation": op}, "\n".join(lines))
    return EXIT_OK


def _gui(args: argparse.Namespace) -> int:
    try:
        api, _ = endpoints(args)
        events = events_endpoint(args)
        check_reachable(args, api)
    except CliError as exc:
        return _fail(args, exc)
    try:
        from agenthost.gui.app import run_gui
    except ImportError as exc:  # textual is the optional `gui` extra
        return _fail(args, CliError("gui_unavailable", f"{exc} (pip install 'agenthost[gui]')"))
    return run_gui(api, events, args.workspace, curve=curve(args))


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
