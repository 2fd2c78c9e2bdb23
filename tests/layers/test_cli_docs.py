"""The `agenthost` command's parser is what the docs say it is: docs/client.md's command table
has a row for every subcommand, naming each of its long options, and names no option the
command lacks; every `agenthost …` command line in README.md, docs/user-guide.md and
docs/client.md runs a subcommand that exists with options it has."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from agenthost.cli import _parser

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DOC = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
USER_DOCS = {
    name: (ROOT / name).read_text(encoding="utf-8")
    for name in (
        "README.md",
        "docs/user-guide.md",
        "docs/client.md",
        "docs/providers.md",
        "docs/protocol.md",
        "docs/tutti-agent.md",
        "docs/reliability.md",
    )
}
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z-]*)")
"""An option as the docs write it (`--turn-timeout`, `-o`, `-vv`)."""


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:  # noqa: SLF001 - argparse keeps its actions there only
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def _commands(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command that runs something: `("status",)`, `("keys", "add")`, …"""
    for name, sub in _subparsers(p).items():
        if _subparsers(sub):
            yield from _commands(sub, (*path, name))
        else:
            yield (*path, name), sub


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings}  # noqa: SLF001


def _long_options(p: argparse.ArgumentParser) -> set[str]:
    """The options a user is told about: each long one but `--help` and `--json` (every command
    has both: the table's `--json` column and the CLI section say so once)."""
    return {o for o in _options(p) if o.startswith("--")} - {"--help", "--json"}


PARSER = _parser()
COMMANDS = dict(_commands(PARSER))
GLOBAL = _options(PARSER)


def _table_rows() -> dict[tuple[str, ...], str]:
    """docs/client.md's command table: each command path to its first cell (`pin SESSION` /
    `unpin SESSION` is two rows' worth)."""
    section = CLIENT_DOC.split("\n## The CLI", 1)[1].split("\n### Errors", 1)[0]
    rows: dict[tuple[str, ...], str] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split(" | ", 1)[0]
        for span in re.findall(r"`([^`]+)`", cell):
            parser, path = PARSER, ()
            for word in span.split():
                if word not in _subparsers(parser):
                    break
                parser, path = _subparsers(parser)[word], (*path, word)
            rows[path] = span
    return rows


ROWS = _table_rows()


def test_the_command_table_has_a_row_for_every_command_and_no_other() -> None:
    assert set(COMMANDS) == set(ROWS), set(COMMANDS) ^ set(ROWS)


def test_every_row_names_each_long_option_of_its_command() -> None:
    missing = {
        " ".join(path): sorted(_long_options(sub) - set(OPTION.findall(ROWS.get(path, ""))))
        for path, sub in COMMANDS.items()
    }
    assert {k: v for k, v in missing.items() if v} == {}


def test_every_option_a_row_names_is_one_its_command_has() -> None:
    unknown = {
        " ".join(path): sorted(set(OPTION.findall(span)) - _options(COMMANDS[path]))
        for path, span in ROWS.items()
        if path in COMMANDS
    }
    assert {k: v for k, v in unknown.items() if v} == {}


def test_the_synopsis_names_every_global_option() -> None:
    synopsis = CLIENT_DOC.split("\n## The CLI", 1)[1].split("\n|", 1)[0].split("COMMAND", 1)[0]
    assert _long_options(PARSER) - {"--version"} <= set(OPTION.findall(synopsis))


def _command_lines() -> Iterator[tuple[str, str]]:
    """Every `agenthost …` command line the docs show: in a code block (up to its `#` comment)
    or in an inline code span; `(doc, text)`."""
    for name, text in USER_DOCS.items():
        in_block = False
        for line in text.splitlines():
            if line.startswith("```"):
                in_block = not in_block
                continue
            if in_block:
                code = line.split(" #", 1)[0]
                for m in re.finditer(r"(?:^|[\s/])agenthost (.*)", code):
                    yield name, m.group(1)
            else:
                for span in re.findall(r"`agenthost ([^`]*)`", line):
                    yield name, span


def _resolve(words: list[str]) -> tuple[tuple[str, ...], argparse.ArgumentParser] | None:
    """The command the words run (global options and their values skipped), and its parser."""
    parser, path = PARSER, ()
    rest = iter(words)
    for word in rest:
        if word.startswith("-"):
            if word in {"--home", "--connect", "--events", "--connection", "--workspace"}:
                next(rest, None)
            continue
        subs = _subparsers(parser)
        if word not in subs:
            break
        parser, path = subs[word], (*path, word)
        if not _subparsers(parser):
            break
    return (path, parser) if path else None


def test_every_documented_command_line_runs_a_command_with_options_it_has() -> None:
    seen: set[tuple[str, ...]] = set()
    wrong: list[str] = []
    for doc, line in _command_lines():
        found = _resolve(re.sub(r"[\[\]()|{}]", " ", line).split())
        if found is None:
            if re.match(r"[a-z]", line) and not line.startswith(("is ", "on ", "itself")):
                wrong.append(f"{doc}: agenthost {line}: no such command")
            continue
        path, sub = found
        if _subparsers(sub):
            wrong.append(f"{doc}: agenthost {line}: {' '.join(path)} needs a subcommand")
            continue
        seen.add(path)
        have = _options(sub) | GLOBAL
        for option in OPTION.findall(line.split("…", 1)[0]):
            option = re.sub(r"^-([a-z])\1+$", r"-\1", option)  # -vv: -v given twice
            if option not in have:
                wrong.append(f"{doc}: agenthost {line}: {' '.join(path)} has no {option}")
    assert wrong == []
    assert len(seen) > 15, seen


def test_the_code_layout_table_names_every_module_of_the_cli() -> None:
    layout = CLIENT_DOC.split("\n### Code layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `client/cli/([a-z_]+\.py)` \|", layout, re.M))
    modules = {p.name for p in (ROOT / "client" / "cli").glob("*.py")} - {"__init__.py"}
    assert modules == named


def test_every_reason_the_cli_gives_of_its_own_is_documented() -> None:
    """A reason the CLI makes up (not a daemon's error passed on) is in docs/client.md's
    "Errors and exit codes" or, when it is the daemon's too, in docs/protocol.md's errors."""
    errors = CLIENT_DOC.split("\n### Errors and exit codes", 1)[1].split("\n### ", 1)[0]
    protocol = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`([a-z_]+)`", errors + protocol.split("\n## Errors", 1)[1]))
    pattern = re.compile(r'(?:CliError|ReferenceError_)\(\s*"([a-z_]+)"|reason, code = "([a-z_]+)"')
    sources = [*(ROOT / "client").rglob("*.py"), ROOT / "agenthost" / "cli.py"]
    given = {
        a or b for path in sources for a, b in pattern.findall(path.read_text(encoding="utf-8"))
    }
    assert {"daemon_unreachable", "ambiguous_reference", "fork_timeout"} <= given, given
    assert given <= documented, given - documented


def test_the_exit_code_table_is_the_cli_s_exit_codes() -> None:
    from client.cli import output

    codes = {v for k, v in vars(output).items() if k.startswith("EXIT_") and isinstance(v, int)}
    errors = CLIENT_DOC.split("\n### Errors and exit codes", 1)[1].split("\n### ", 1)[0]
    assert set(map(int, re.findall(r"^\| (\d+) \|", errors, re.M))) == codes
    # `agenthost --help` says them too.
    help_codes = ":" + PARSER.description.split("Exit codes:", 1)[1]  # type: ignore[union-attr]
    assert set(map(int, re.findall(r"(?:^|[;:] )(\d+) ", help_codes, re.M))) == codes


def test_every_default_of_an_option_is_the_one_the_docs_give() -> None:
    section = " ".join(CLIENT_DOC.split("\n## The CLI", 1)[1].split("\n|", 1)[0].split())
    wrong = []
    for path, sub in [((), PARSER), *COMMANDS.items()]:
        for action in sub._actions:  # noqa: SLF001
            default = action.default
            if not action.option_strings or isinstance(action, argparse._StoreConstAction):  # noqa: SLF001
                continue
            if isinstance(default, bool) or not isinstance(default, str | int | float):
                continue
            if default == argparse.SUPPRESS or (default == 0 and action.nargs == 0):
                continue
            value = f"{default:g}" if isinstance(default, float) else str(default)
            shown = " ".join((*path, max(action.option_strings, key=len), value))
            if f"`{shown}`" not in section:
                wrong.append(shown)
    assert wrong == []


def test_the_console_scripts_the_docs_name_are_pyproject_s() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]
    named = dict(re.findall(r'`([a-z-]+) = "([a-z_.]+:[a-z_]+)"`', "\n".join(USER_DOCS.values())))
    assert named and named.items() <= scripts.items()


def test_the_events_option_s_help_names_the_sockets_the_client_prefers() -> None:
    """`--events`'s default is the home's exact-topic socket when the daemon bound it, else its
    plain one (client.cli.endpoints.events_source; docs/client.md's CLI section): its help
    says both, in that order."""
    from domain.home_layout import EVENTS_EXACT_SOCKET, EVENTS_SOCKET

    (action,) = [a for a in _parser()._actions if "--events" in a.option_strings]
    text = action.help or ""
    assert EVENTS_EXACT_SOCKET in text and EVENTS_SOCKET in text, text
    assert text.index(EVENTS_EXACT_SOCKET) < text.index(f" {EVENTS_SOCKET}"), text
