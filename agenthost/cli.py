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
from pathlib import Path
from typing import TYPE_CHECKING

from agenthost.launch import subcommand
from client.cli.output import EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError, emit, fail
from client.cli.parser import SubParsers, build_parser, parse, run_command
from domain import dataclass_code
from domain.home_layout import default_home, run_dir
from domain.stop_signals import StopSignals

if TYPE_CHECKING:
    from agenthost.config import Config

log = logging.getLogger(__name__)

# The client's part of this command (every subcommand but `serve` and `keys`, the endpoints,
# the reachability probe, the output and exit codes) is the `client.cli` package; this module,
# the daemon's composition root, adds what needs the daemon side: running it and minting its keys.


def main(argv: list[str] | None = None) -> int:
    def parser_for(only: str | None) -> argparse.ArgumentParser:
        parser = _parser(only)
        # Only a process started as the command may re-execute itself (`serve`'s accept shim):
        # a caller passing `argv` in-process is not one.
        parser.set_defaults(from_command_line=argv is None)
        return parser

    # The named subcommand's parser alone (a daemon's start builds no client subcommand); the
    # whole command's wherever that one would print or exit, so what a user sees is the same.
    parser, args = parse(parser_for, subcommand(sys.argv[1:] if argv is None else argv), argv)
    return run_command(parser, args)


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command's parser, or (`only`) the subcommand of that name alone
    (`client.cli.parser.build_parser`)."""
    from agenthost import __version__

    return build_parser(
        __version__,
        __doc__,
        before={"serve": _add_serve},
        after={"config": _add_config, "keys": _add_keys, "providers": _add_providers},
        only=only,
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


def _add_config(sub: SubParsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    c = sub.add_parser("config", help="check agenthost.toml without starting the daemon")
    csub = c.add_subparsers(dest="config_command", metavar="{check}", required=True)
    cc = csub.add_parser(
        "check",
        help="every mistake in the home's agenthost.toml, as `serve` would refuse it "
        "(exit 0 when it would start, 2 when not)",
    )
    cc.add_argument(
        "--config", type=Path, default=None, help="config file (default: HOME/agenthost.toml)"
    )
    c.set_defaults(run=_config_check)


def _add_keys(sub: SubParsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    k = sub.add_parser("keys", help="client keys for TCP access (CURVE)")
    # The metavar names the choices in a missing-subcommand error (argparse would say the dest).
    ksub = k.add_subparsers(dest="keys_command", metavar="{add,revoke,list}", required=True)
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
    psub = p.add_subparsers(dest="providers_command", metavar="{install}", required=True)
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


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Each stops `serve` cleanly: a service manager's stop, Ctrl-C, the terminal closed."""

LOG_FLUSH_S = 2.0
"""How long a stop waits for the queued log lines to be written (a stderr still unread keeps
the rest)."""


def _serve_logged(args: argparse.Namespace) -> int:
    from agenthost import activity, gc_policy, gil_policy
    from agenthost.config import ConfigError
    from agenthost.home import HomeInUse, HomeUnsafe
    from transport import accept_shim

    activity.enable(args.verbose > 0)
    config, problems = _checked_config(
        args, [*args.listen, *args.events_listen, *args.events_exact_listen]
    )
    if config is None or problems:
        # Every configuration mistake: one line each naming what is wrong, exit 2, no traceback.
        for problem in problems:
            print(f"agenthost: {problem}", file=sys.stderr)
        return EXIT_USAGE
    # Imported only now: a configuration error is reported without loading the daemon.
    from actors import recovery
    from agenthost.daemon import Daemon

    # Every TCP endpoint is a CURVE server (run/keys/, run/connection.json): the daemon always
    # gives its server the keys, so `allow_remote` never exposes an unauthenticated socket.
    daemon = Daemon(
        config,
        listen=tuple(args.listen),
        events_listen=tuple(args.events_listen),
        events_exact_listen=tuple(args.events_exact_listen),
    )
    stops = StopSignals(STOP_SIGNALS, keep_ignored=(signal.SIGHUP,))
    # Set before the daemon's threads start (CPython's 5 ms unless a measurement names one).
    switch_s = gil_policy.apply()
    # A start that waits for a store another process keeps busy ends at a stop signal.
    recovery.stop_start_when(lambda: bool(stops))
    # A client that gets no answer meanwhile says the start waits for the store, not "hung".
    recovery.tell_store_wait(
        lambda what: daemon.publish_state(
            "starting" if what is None else f"starting: waiting for the store ({what})"
        )
    )
    try:
        daemon.start()
    except recovery.StartStopped as exc:
        log.info("stopping on %s: %s", stops.first_name(), exc)
        daemon.close()
        log.info("stopped")
        return EXIT_OK
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
    finally:
        # Ready (or not started): a write retried later is a running daemon's, stopped by
        # `close()`, never by this.
        recovery.stop_start_when(lambda: False)
        recovery.tell_store_wait(lambda _what: None)
    daemon.publish_state(None)  # serving: nothing to tell
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
    code = dataclass_code.installed()
    if code is not None:
        log.info("dataclass functions: %d from the cache, %d compiled", code.taken, code.compiled)
    # A fatal fault's `stop_requested` is looked at every 0.1 s; a stop signal wakes it at once.
    stops.wait(daemon.stop_requested.is_set, 0.1)
    # Said before and after the stop (an operator's log shows why the daemon went, and that a
    # slow stop was under way rather than hung).
    why = stops.first_name() if stops else "a fatal fault (logged above)"
    log.info("stopping on %s", why)
    daemon.close()
    log.info("stopped")
    if gc_timings is not None:
        gc_timings.close()
    return EXIT_ERROR if daemon.stop_requested.is_set() and not stops else 0


def _checked_config(
    args: argparse.Namespace, endpoints: list[str]
) -> tuple[Config | None, list[str]]:
    """The configuration `serve` would run with and every mistake that would stop it: the file,
    the command line's `endpoints`, the home's socket paths (nothing of the home is touched)."""
    # The daemon's configuration is imported by the commands that read it, not by the client's.
    from agenthost.config import ConfigError, check_home_paths, check_listen, load_config

    problems: list[str] = []
    try:
        config = load_config(args.home, args.config)
    except ConfigError as exc:
        return None, list(exc.problems)
    for endpoint in endpoints:
        try:
            check_listen(endpoint, getattr(args, "allow_remote", False) or config.allow_remote)
        except ConfigError as exc:
            problems.extend(exc.problems)
    try:
        check_home_paths(config)
    except ConfigError as exc:
        problems.extend(exc.problems)
    return config, problems


def _config_check(args: argparse.Namespace) -> int:
    """`agenthost config check`: the checks `serve` makes before it touches the home, every
    mistake at once, in `serve`'s words; exit 0 when it would start, 2 when not."""
    config, problems = _checked_config(args, [])
    for problem in problems:
        print(f"agenthost: {problem}", file=sys.stderr)
    if config is None or problems:
        return EXIT_USAGE
    path = args.config or config.home / "agenthost.toml"
    said = f"{path}: ok" if path.exists() else f"{path}: no such file, every key at its default: ok"
    print(said)
    return EXIT_OK


# -- keys -----------------------------------------------------------------------------------


NO_TCP_WARNING = (
    'agenthost: warning: the daemon listens on no TCP endpoint, so this file\'s "api" is null '
    'and it connects nowhere: give the daemon one (`listen = ["tcp://127.0.0.1:7777"]` under '
    "[daemon] in agenthost.toml, or `serve --listen tcp://127.0.0.1:7777`), restart it, then "
    'set "api" (and "events") in this file to those endpoints or mint the key again'
)
"""`keys add` on a daemon without TCP: the file it prints holds a key and no address."""


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

                try:
                    write_private(args.output, text)
                except OSError as exc:
                    # The secret key is in no file: its public key must not stay authorized
                    # (nobody could use it, and the name would be taken for good).
                    store.revoke(args.name)
                    return fail(
                        args,
                        CliError(
                            "bad_output",
                            f"cannot write {args.output}: {exc.strerror or exc}; "
                            f"key {args.name!r} not added",
                            code=EXIT_USAGE,
                        ),
                    )
            if json.loads(text).get("api") is None:
                print(NO_TCP_WARNING, file=sys.stderr)
            if args.output is not None:
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
