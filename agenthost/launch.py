"""The `agenthost` program's first step: for `serve`, load the accept shim before anything else
is imported (`transport.accept_shim`: a re-execution of this same command, which costs a
second interpreter start and nothing more when it comes before the command's imports); then
run the command (`agenthost.cli`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

VALUE_OPTIONS = frozenset(
    {"--home", "--connect", "--events", "--connection", "--workspace", "--timeout"}
)
"""The global options that take a value as the next argument (client.cli.parser)."""


def subcommand(argv: Sequence[str]) -> str | None:
    """The first argument that is neither a global option nor an option's value."""
    args = iter(argv)
    for arg in args:
        if arg in VALUE_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def main() -> int:
    if subcommand(sys.argv[1:]) == "serve":
        from transport import accept_shim

        accept_shim.reexec_with_shim()
    # Before the command's imports make their dataclasses: the code of their functions is
    # taken from the packages' cache (domain/dataclass_code.py), not compiled again.
    from domain import dataclass_code

    dataclass_code.install()
    from agenthost.cli import main as run

    return run()
