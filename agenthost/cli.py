"""The `agenthost` command: `serve` runs the daemon; the other subcommands are its client
(human output by default, `--json` for scripts, a non-zero exit code with the error reason).

Exit codes: 0 success; 1 the daemon answered with an error, or the turn/fork did not succeed;
2 usage; 3 the daemon cannot be reached; 4 a fork's delivery is unknown (retry reuses its ids);
130 `say` stopped by Ctrl-C.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import sys
import time
from pathlib import Path

from agenthost import gc_policy, gil_policy
from agenthost.config import ConfigError, check_home_paths, check_listen, load_config
from agenthost.home import HomeInUse, HomeUnsafe
from client.cli.output import EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError, emit, fail
from client.cli.parser import SubParsers, build_parser, run_command
from domain.home_layout import default_home, run_dir

log = logging.getLogger(__name__)

# The client's part of this command (every subcommand but `serve` and `keys`, the endpoints,
# the reachability probe, the output and exit codes) is the `client.cli` package; this module,
# the daemon's composition root, adds what needs the daemon side: running it and minting its keys.


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # Only a process started as the command may re-execute itself (`serve`'s accept shim): a
    # caller passing `argv` in-process is not one.
    parser.set_defaults(from_command_line=argv is None)
    return run_command(parser, argv)


def _parser() -> argparse.ArgumentParser:
    from agenthost import __version__

    return build_parser(
        __version__, __doc__, before=[_add_serve], after=[_add_keys, _add_providers]
    )


def _add_serve(sub: SubParsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
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


def _add_keys(sub: SubParsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
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


def _add_providers(
    sub: SubParsers[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from agenthost.provider_install import INSTALLABLE

    p = sub.add_parser("providers", help="install the pinned Codex or Claude Code")
    psub = p.add_subparsers(dest="providers_command", required=True)
    pi = psub.add_parser(
        "install",
        parents=[common],
        help="install a provider's pinned version for this home's daemon (npm or pip)",
    )
    pi.add_argument("provider", choices=INSTALLABLE)
    pi.add_argument(
        "--dry-run", action="store_true", help="print the command line, install nothing"
    )
    p.set_defaults(run=_providers)


# -- serve --------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from transport import accept_shim

    if getattr(args, "from_command_line", False):
        # Before any thread or socket: this may replace the process by one with the shim.
        accept_shim.reexec_with_shim()
    from agenthost import log_queue

    # Through a bounded queue and a thread of its own: a stderr nobody reads never holds a
    # thread that logs (agenthost/log_queue.py).
    logs = log_queue.install(sys.stderr, logging.DEBUG if args.verbose > 1 else logging.INFO)
    try:
        return _serve_logged(args)
    finally:
        logs.stop(LOG_FLUSH_S)


LOG_FLUSH_S = 2.0
"""How long a stop waits for the queued log lines to be written (a stderr still unread keeps
the rest)."""


def _serve_logged(args: argparse.Namespace) -> int:
    from agenthost import activity
    from transport import accept_shim

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
    # Set before the daemon's threads start (CPython's 5 ms unless a measurement names one).
    switch_s = gil_policy.apply()
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
    accept_shim.log_status()
    gc_timings = gc_policy.GcTimings.from_env()
    print(json.dumps(daemon.ready_line()), flush=True)
    # Ready: the providers' workers start now, in the background (never before this line).
    daemon.start_workers_ahead()
    # Everything the start made (modules, classes, the store's statements, the actors) lives
    # as long as the process: kept out of the cyclic collector from now on, so a full
    # collection walks only what requests made since (this process is the daemon's alone;
    # an in-process one in a test is not frozen).
    gc_policy.freeze_start_up()
    log.info(
        "start-up heap frozen: %d objects kept out of the cyclic collector", gc.get_freeze_count()
    )
    # Logged once ready: a start that fails says only why on stderr.
    log.info("GIL switch interval %.2f ms", switch_s * 1000)
    while not signalled and not daemon.stop_requested.is_set():
        time.sleep(0.1)
    daemon.close()
    if gc_timings is not None:
        gc_timings.close()
    return EXIT_ERROR if daemon.stop_requested.is_set() and not signalled else 0


# -- keys -----------------------------------------------------------------------------------


def _keys(args: argparse.Namespace) -> int:
    """`agenthost keys add|revoke|list`: files under the home's run/keys/; the daemon reads
    run/keys/authorized/ at each new TCP connection, so no restart is needed."""
    from agenthost.keys import KeyError_, KeyStore

    store = KeyStore(run_dir((args.home or default_home()).expanduser().resolve()))
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
            emit(args, {"keys": names}, "\n".join(names) or "(no authorized client keys)")
    except KeyError_ as exc:
        return fail(args, CliError("bad_key", str(exc)))
    return EXIT_OK


def _providers(args: argparse.Namespace) -> int:
    """`agenthost providers install codex|claude-code`: runs npm or pip for the pinned version
    and records where it went (`<home>/providers/installed.json`), which the daemon reads when
    it starts."""
    from agenthost import provider_install as pi
    from domain.home_layout import probe_home

    home = (args.home or default_home()).expanduser().absolute()
    plan = pi.plan(args.provider, home)
    line = " ".join(plan.argv)
    if args.dry_run:
        emit(args, {"provider": plan.provider, "argv": plan.argv}, line)
        return EXIT_OK
    if not args.json:
        print(f"installing {plan.provider}: {line}", flush=True)
    try:
        entry = pi.install(plan, home)
    except pi.InstallError as exc:
        return fail(args, CliError("install_failed", str(exc)))
    where = entry.get("command") or entry.get("location") or entry.get("python")
    restart = "; restart the daemon to use it" if probe_home(home).served else ""
    emit(
        args,
        {"provider": plan.provider, "installed": entry, "record": str(pi.record_path(home))},
        f"{plan.provider} {entry['version']} installed: {where} "
        f"(recorded in {pi.record_path(home)}){restart}",
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
