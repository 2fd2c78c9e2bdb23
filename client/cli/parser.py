"""The `agenthost` command's parser, as far as the client's part goes: the global options (where
the daemon is, the workspace, `--timeout`, `--json`) and every client subcommand with its
flags, each run by its module (`sessions`, `turns`, `forks`, `manage`, `launch_gui`).

The daemon's composition root (`agenthost.cli`) builds the whole command with `build_parser`,
adding its own subcommands (`serve`, `keys`) before and after the client's, and runs it with
`run_command`. A command's module is imported when the command runs, and a parse may build
the named subcommand's parser alone (`only`): what every start pays is one subcommand's flags.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import importlib
import io
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TextIO, cast

from client.cli.output import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, ShownStream
from domain.providers import PROVIDERS

SubParsers = argparse._SubParsersAction  # noqa: SLF001 - argparse names no public type for it
AddCommand = Callable[["SubParsers[argparse.ArgumentParser]", argparse.ArgumentParser], None]
"""Adds one subcommand: `(subparsers, common)`, `common` being the parent of every subcommand
that takes `--json` after its name."""
Run = Callable[[argparse.Namespace], int]


class NotOneCommand(Exception):
    """A parse the one subcommand's parser (`build_parser(only=...)`) leaves to the whole
    command's: `--help`, `--version`, a usage error, another subcommand (each says or lists
    what only the whole parser knows)."""


class _OneCommandParser(argparse.ArgumentParser):
    """A parser that never prints nor exits: where argparse would, the parse is the whole
    command's (`NotOneCommand`), so what a user sees is the same with or without it."""

    def _print_message(self, message: str, file: Any = None) -> NoReturn:
        raise NotOneCommand

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise NotOneCommand

    def error(self, message: str) -> NoReturn:
        raise NotOneCommand


class _Unused:
    """Takes the calls that would add a subcommand left out of a one-subcommand parser."""

    def __getattr__(self, name: str) -> Callable[..., _Unused]:
        return lambda *args, **kwargs: self


class _OnlyOne:
    """The subparsers of a one-subcommand parser: any other name's parser is `_Unused`."""

    def __init__(self, sub: SubParsers[argparse.ArgumentParser], only: str) -> None:
        self._sub = sub
        self._only = only

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if name == self._only:
            return self._sub.add_parser(name, **kwargs)
        return cast(argparse.ArgumentParser, _Unused())


def _runs(module: str, function: str) -> Run:
    """`client.cli.<module>.<function>`, imported when the subcommand runs (a parse, `serve`'s
    or `--help`'s, loads none of the client's commands)."""

    def run(args: argparse.Namespace) -> int:
        found: Run = getattr(importlib.import_module(f"client.cli.{module}"), function)
        return found(args)

    return run


def seconds(text: str) -> float:
    """A wait in seconds: a number above 0 (0 or less would give up before any reply came and
    blame a daemon that is fine)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def byte_count(text: str) -> int:
    """A size in bytes: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of bytes: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more bytes, got {text!r}")
    return value


def home_path(text: str) -> Path:
    """`--home`: a path, never empty (`Path("")` is the current directory, which would become
    the home; `--home "$DIR"` with DIR unset means a mistake, as an empty AGENTHOST_HOME means
    the default home)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "empty (an unset variable?): give the home's path, or leave --home out for "
            "AGENTHOST_HOME or the default home"
        )
    return Path(text)


def workspace_id(text: str) -> str:
    """`--workspace`: never empty (`--workspace "$WS"` with WS unset is a mistake, as an empty
    `--home` is; the daemon would refuse it only after a connection, as its own error)."""
    if not text:
        raise argparse.ArgumentTypeError(
            "empty (an unset variable?): give a workspace id, or leave --workspace out for "
            "'default'"
        )
    return text


_ENDPOINT = re.compile(r"ipc://.+|tcp://(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):[0-9]{1,5}")


def endpoint(text: str) -> str:
    """An endpoint the client can connect to: `ipc://PATH` or `tcp://HOST:PORT` (ZeroMQ's own
    error for anything else is a traceback)."""
    if not _ENDPOINT.fullmatch(text) or (
        text.startswith("tcp://") and not 0 < int(text.rsplit(":", 1)[1]) < 65536
    ):
        raise argparse.ArgumentTypeError(
            f"not an endpoint: {text!r} (ipc://PATH or tcp://HOST:PORT, as the daemon's ready "
            "line or connection file gives them)"
        )
    return text


def parse(
    parser_for: Callable[[str | None], argparse.ArgumentParser],
    command: str | None,
    argv: list[str] | None = None,
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """`argv` parsed by `parser_for(command)` (the subcommand `command` alone, `argv`'s named
    one), else, wherever that one leaves it (`NotOneCommand`, or another command parsed), by the
    whole command's `parser_for(None)`: the same outcome, without building every subcommand."""
    if command is not None:
        try:
            parser = parser_for(command)
            args = parser.parse_args(argv)
            if getattr(args, "command", None) == command:
                return parser, args
        except NotOneCommand:
            pass
    parser = parser_for(None)
    return parser, parser.parse_args(argv)


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the subcommand `parser` parsed into `args`; its exit code (2 and the help without
    one)."""
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    undecodable = _not_utf8(vars(args).values())
    if undecodable is not None:
        # An argument of bytes that are not UTF-8 (the locale escaped them): the wire carries
        # only UTF-8 text, and its encoder's error would be a traceback.
        print(f"agenthost: invalid_argument: {undecodable!r} is not UTF-8 text", file=sys.stderr)
        return EXIT_USAGE
    _replace_what_the_terminal_cannot_show()
    # What others wrote goes to a terminal shown as text (`ShownStream`); a pipe or a file gets
    # it as it is (`diff > x.patch`). `serve` and `gui` write their own escape sequences.
    shield = args.command not in ("serve", "gui")
    stdout, stderr = sys.stdout, sys.stderr
    if shield:
        sys.stdout = _shown_on_a_terminal(stdout)
        sys.stderr = _shown_on_a_terminal(stderr)
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
    finally:
        if shield:
            sys.stdout, sys.stderr = stdout, stderr


def _shown_on_a_terminal(stream: TextIO) -> TextIO:
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # closed, or no file behind it
        terminal = False
    return cast(TextIO, ShownStream(stream)) if terminal else stream


def _replace_what_the_terminal_cannot_show() -> None:
    """A terminal whose encoding is not UTF-8 (a Latin-1 locale) cannot show a title's `★` or
    the transcript's `—`: it gets `?` for them, not a traceback after the turn was sent."""
    stdout = sys.stdout
    if isinstance(stdout, io.TextIOWrapper) and codecs.lookup(stdout.encoding).name != "utf-8":
        stdout.reconfigure(errors="replace")


def _not_utf8(values: Iterable[object]) -> str | None:
    """The first string among `values` (or in a list of them) UTF-8 cannot encode. Paths of
    this machine (`--home`, `-o`) are not sent, so any bytes the file system takes will do."""
    for value in values:
        for text in value if isinstance(value, list | tuple) else [value]:
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    return text
    return None


def build_parser(
    version: str,
    description: str | None,
    *,
    before: Mapping[str, AddCommand] | None = None,
    after: Mapping[str, AddCommand] | None = None,
    only: str | None = None,
) -> argparse.ArgumentParser:
    """The `agenthost` parser: the global options, the subcommands `before` adds (by name), the
    client's, then those `after` adds (the order `--help` lists them in). With `only`, the
    subcommand of that name alone, in a parser that raises `NotOneCommand` where the whole one
    would print or exit (`parse`)."""
    p = (argparse.ArgumentParser if only is None else _OneCommandParser)(
        prog="agenthost",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"agenthost {version}")
    p.add_argument("--home", type=home_path, default=None, help="AGENTHOST_HOME (data dir)")
    p.add_argument(
        "--connect",
        type=endpoint,
        default=None,
        help="API endpoint (default: the home's ipc socket)",
    )
    p.add_argument(
        "--events",
        type=endpoint,
        default=None,
        help=(
            "events endpoint (default: the home's events-exact.sock when the daemon bound it,"
            " else its events.sock; a connection file's eventsExact, else its events)"
        ),
    )
    p.add_argument(
        "--connection",
        type=Path,
        default=None,
        help="connection file for TCP (CURVE keys; default: $AGENTHOST_CONNECTION)",
    )
    p.add_argument(
        "--workspace", type=workspace_id, default="default", help="workspace id (default: default)"
    )
    p.add_argument(
        "--timeout", type=seconds, default=10.0, help="seconds to wait for a reply (default: 10)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # `--json` is accepted after the subcommand too; SUPPRESS keeps a global one intact.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    before, after = before or {}, after or {}
    adding = (
        sub if only is None else cast("SubParsers[argparse.ArgumentParser]", _OnlyOne(sub, only))
    )
    for name, add in before.items():
        if only in (None, name):
            add(sub, common)
    if only is None or only not in (*before, *after):
        add_client_commands(adding, common)
    for name, add in after.items():
        if only in (None, name):
            add(sub, common)
    return p


def add_client_commands(
    sub: SubParsers[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Every client subcommand, in the order `--help` lists them."""
    session_help = "session id or unique id prefix"

    sub.add_parser("status", parents=[common], help="daemon status").set_defaults(
        run=_runs("sessions", "run_status")
    )
    sub.add_parser(
        "sessions", parents=[common], help="list sessions as a fork lineage tree"
    ).set_defaults(run=_runs("sessions", "run_sessions"))
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
    n.set_defaults(run=_runs("sessions", "run_new"))
    y = sub.add_parser("say", parents=[common], help="run a turn and stream it")
    y.add_argument("session", help=session_help)
    y.add_argument(
        "text",
        help="the user message (`-`: read it from standard input; one that starts with `-`: "
        "put `--` before it)",
    )
    y.add_argument("--answer", default=None, help="reply to a question the turn asks")
    decide = y.add_mutually_exclusive_group()
    decide.add_argument(
        "--approve",
        action="store_const",
        const="approve",
        dest="decision",
        default=None,
        help="approve an approval the turn asks for",
    )
    decide.add_argument(
        "--decline",
        action="store_const",
        const="decline",
        dest="decision",
        help="decline an approval the turn asks for",
    )
    y.add_argument(
        "--turn-timeout",
        type=seconds,
        default=600.0,
        help="seconds to follow the turn (default: 600); it keeps running after",
    )
    y.set_defaults(run=_runs("turns", "run_say"))
    w = sub.add_parser("show", parents=[common], help="show a session's transcript")
    w.add_argument("session", help=session_help)
    w.set_defaults(run=_runs("sessions", "run_show"))
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
        "--worktree",
        action="store_true",
        help="give the fork a new worktree holding the files as they were at that turn "
        "(default: the fork works in the same folder)",
    )
    f.add_argument(
        "--fork-timeout", type=seconds, default=120.0, help="seconds to wait (default: 120)"
    )
    f.set_defaults(run=_runs("forks", "run_fork"))
    t = sub.add_parser("tree", parents=[common], help="a session's fork tree (ancestors, forks)")
    t.add_argument("session", help="session id or unique prefix")
    t.set_defaults(run=_runs("forks", "run_tree"))
    r = sub.add_parser(
        "resolve", parents=[common], help="inspect, adopt or abandon an unknown fork operation"
    )
    r.add_argument("operation", help="the fork's operation id (`agenthost fork` prints it)")
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
    r.set_defaults(run=_runs("forks", "run_resolve"), action="inspect")
    o = sub.add_parser("op", parents=[common], help="show a fork operation")
    o.add_argument("operation", help="operation id or unique prefix (of a committed fork)")
    o.add_argument("--ack", action="store_true", help="acknowledge it (committed only)")
    o.set_defaults(run=_runs("forks", "run_op"))
    df = sub.add_parser(
        "diff", parents=[common], help="the files a turn changed in the session's folder"
    )
    df.add_argument("session", help=session_help)
    df.add_argument(
        "--turn", metavar="TURN", help="turn id, unique prefix or sequence (default: the newest)"
    )
    df.add_argument(
        "--from", dest="from_turn", metavar="TURN", help="diff from this turn's end instead"
    )
    df.add_argument("--max-bytes", type=byte_count, default=None, help="cut the diff here (256000)")
    df.set_defaults(run=_runs("workspace", "run_diff"))
    rs = sub.add_parser(
        "restore", parents=[common], help="put the session's folder back to a turn's files"
    )
    rs.add_argument("session", help=session_help)
    target = rs.add_mutually_exclusive_group(required=True)
    target.add_argument("--turn", metavar="TURN", help="turn id, unique prefix or sequence")
    target.add_argument("--undo", metavar="CHECKPOINT", help="a previous restore's undo id")
    rs.add_argument(
        "--before", action="store_true", help="the files as the turn found them (default: left)"
    )
    rs.add_argument(
        "--force", action="store_true", help="even if other live sessions work in that folder"
    )
    rs.set_defaults(run=_runs("workspace", "run_restore"))
    i = sub.add_parser("interrupt", parents=[common], help="interrupt the session's running turn")
    i.add_argument("session", help=session_help)
    i.add_argument("--reason", default=None, help="why (recorded on the turn and shown by `show`)")
    i.set_defaults(run=_runs("turns", "run_interrupt"))
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
    a.set_defaults(run=_runs("turns", "run_answer"))
    d = sub.add_parser("delete", parents=[common], help="delete a session (asks first)")
    d.add_argument("session", help=session_help)
    d.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    d.add_argument(
        "--worktree",
        choices=("keep", "remove"),
        default=None,
        help="a worktree fork's child: keep its worktree (the default with --yes) or"
        " remove it (refused if it holds work not checkpointed or commits on no other branch)",
    )
    d.add_argument(
        "--force",
        action="store_true",
        help="with --worktree remove: remove it even so (a branch with its own commits is kept)",
    )
    d.set_defaults(run=_runs("manage", "run_delete"))
    r = sub.add_parser("rename", parents=[common], help="change a session's title")
    r.add_argument("session", help=session_help)
    r.add_argument("title", help="the new title")
    r.set_defaults(run=_runs("manage", "run_rename"))
    for name, pinned in (("pin", True), ("unpin", False)):
        q = sub.add_parser(name, parents=[common], help=f"{name} a session")
        q.add_argument("session", help=session_help)
        q.set_defaults(run=_runs("manage", "run_pin"), pinned=pinned)
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
    t.set_defaults(run=_runs("manage", "run_settings"))
    g = sub.add_parser("gui", help="the terminal GUI")
    g.set_defaults(run=_runs("launch_gui", "run_gui_command"))
