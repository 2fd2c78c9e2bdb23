"""The `agenthost` command: `serve` runs the daemon; the other subcommands are a small client
(human output by default, `--json` for scripts, a non-zero exit code with the error reason).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import signal
import sys
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agenthost.config import ConfigError, default_home, load_config

EXIT_USAGE = 2
EXIT_ERROR = 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    return int(args.run(args))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agenthost", description=__doc__)
    p.add_argument("--home", type=Path, default=None, help="AGENTHOST_HOME (data dir)")
    p.add_argument("--connect", default=None, help="API endpoint (default: the home's ipc socket)")
    p.add_argument("--workspace", default="default", help="workspace id (default: default)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command")

    s = sub.add_parser("serve", help="run the daemon in the foreground")
    s.add_argument("--config", type=Path, default=None)
    s.add_argument(
        "--listen", action="append", default=[], help="extra endpoint, e.g. tcp://127.0.0.1:7777"
    )
    s.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --listen address"
    )
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(run=_serve)

    sub.add_parser("status", help="daemon status").set_defaults(run=_status)
    sub.add_parser("sessions", help="list sessions").set_defaults(run=_sessions)
    n = sub.add_parser("new", help="create a session")
    n.add_argument("--provider", default="tutti-agent")
    n.add_argument("--title", default=None)
    n.add_argument("--cwd", default=None)
    n.set_defaults(run=_new)
    y = sub.add_parser("say", help="run a turn and stream it")
    y.add_argument("session")
    y.add_argument("text")
    y.set_defaults(run=_say)
    w = sub.add_parser("show", help="show a session's transcript")
    w.add_argument("session")
    w.set_defaults(run=_show)
    f = sub.add_parser("fork", help="fork a session through a settled turn")
    f.add_argument("session")
    f.add_argument("--through", required=True, metavar="TURN")
    f.set_defaults(run=_fork)
    o = sub.add_parser("op", help="show a fork operation")
    o.add_argument("operation")
    o.set_defaults(run=_op)
    return p


# -- serve --------------------------------------------------------------------------------


def check_listen(endpoint: str, allow_remote: bool) -> None:
    """TCP listens on loopback only unless explicitly allowed."""
    if not endpoint.startswith("tcp://"):
        return
    host = urlparse(endpoint).hostname or ""
    if host == "localhost" or allow_remote:
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ConfigError(f"--listen {endpoint}: not a loopback address (use --allow-remote)")


def _serve(args: argparse.Namespace) -> int:
    from agenthost.daemon import Daemon

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.home, args.config)
        for endpoint in args.listen:
            check_listen(endpoint, args.allow_remote)
    except ConfigError as exc:
        print(f"agenthost: {exc}", file=sys.stderr)
        return EXIT_USAGE
    daemon = Daemon(config, listen=tuple(args.listen))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        daemon.start()
    except Exception as exc:  # noqa: BLE001 - report start-up failures plainly
        print(f"agenthost: cannot start: {exc}", file=sys.stderr)
        daemon.close()
        return EXIT_ERROR
    print(json.dumps(daemon.ready_line()), flush=True)
    stop.wait()
    daemon.close()
    return 0


# -- client commands ----------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Any:
    from transport.client import Client

    endpoint = args.connect or f"ipc://{(args.home or default_home()) / 'run' / 'api.sock'}"
    return Client(endpoint, timeout=30.0)


def _call(args: argparse.Namespace, method: str, params: dict[str, Any] | None = None) -> Any:
    from transport.client import ApiError, ClientTimeout

    client = _client(args)
    try:
        body = {"workspaceId": args.workspace, **(params or {})} if method != "host.status" else {}
        return client.call(method, body)
    except ApiError as exc:
        raise CliError(f"{exc.reason}: {exc}") from exc
    except ClientTimeout as exc:
        raise CliError(
            "timeout: the daemon did not answer (is `agenthost serve` running?)"
        ) from exc
    finally:
        client.close()


class CliError(Exception):
    pass


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args) or 0)
        except CliError as exc:
            if args.json:
                print(json.dumps({"error": str(exc)}))
            else:
                print(f"agenthost: {exc}", file=sys.stderr)
            return EXIT_ERROR

    return run


def _emit(args: argparse.Namespace, data: Any, human: str) -> None:
    print(json.dumps(data, indent=None if args.json else 2) if args.json else human)


@_guard
def _status(args: argparse.Namespace) -> int:
    result = _call(args, "host.status")
    workers = ", ".join(f"{w['provider']}({w['state']}, pid {w['pid']})" for w in result["workers"])
    _emit(
        args,
        result,
        f"agenthost {result['version']} at {result['home']}; workers: {workers or 'none'}",
    )
    return 0


@_guard
def _sessions(args: argparse.Namespace) -> int:
    result = _call(args, "session.list", {"limit": 200})
    lines = [
        f"{s['agentSessionId']}  {s['provider']:<12} {s['title']}"
        + (f"  (forked from {s['forkedFrom']['sourceAgentSessionId']})" if s["forkedFrom"] else "")
        for s in result["sessions"]
    ]
    _emit(args, result, "\n".join(lines) or "(no sessions)")
    return 0


@_guard
def _new(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"provider": args.provider}
    if args.title:
        params["title"] = args.title
    if args.cwd:
        params["cwd"] = args.cwd
    session = _call(args, "session.create", params)["session"]
    _emit(args, {"session": session}, session["agentSessionId"])
    return 0


@_guard
def _say(args: argparse.Namespace) -> int:
    from agenthost.session_client import run_turn

    client = _client(args)
    try:
        turn = run_turn(client, args.workspace, args.session, args.text, echo=not args.json)
    finally:
        client.close()
    _emit(args, {"turn": turn}, "")
    return 0 if turn["outcome"] == "completed" else EXIT_ERROR


@_guard
def _show(args: argparse.Namespace) -> int:
    from agenthost.session_client import format_transcript

    session = _call(args, "session.get", {"agentSessionId": args.session})["session"]
    turns = _call(args, "session.timeline", {"agentSessionId": args.session, "limit": 1000})[
        "turns"
    ]
    _emit(args, {"session": session, "turns": turns}, format_transcript(session, turns))
    return 0


@_guard
def _fork(args: argparse.Namespace) -> int:
    from agenthost.session_client import fork_and_wait

    client = _client(args)
    try:
        op = fork_and_wait(
            client,
            args.workspace,
            args.session,
            args.through,
            progress=None if args.json else lambda s: print(f"… fork {s}", file=sys.stderr),
        )
    finally:
        client.close()
    human = f"{op['status']}: {op['targetAgentSessionId']}" + (
        f" ({op['error']})" if op["error"] else ""
    )
    _emit(args, {"operation": op}, human)
    return 0 if op["status"] == "committed" else EXIT_ERROR


@_guard
def _op(args: argparse.Namespace) -> int:
    op = _call(args, "fork.get", {"operationId": args.operation})["operation"]
    _emit(args, {"operation": op}, f"{op['operationId']}: {op['status']} ({op['phase']})")
    return 0


def new_request_id() -> str:
    return str(uuid.uuid4())


if __name__ == "__main__":
    sys.exit(main())
