"""What the `agenthost` client commands print and how they exit: the exit codes, `CliError`
(a failure reported to the user: reason, message, exit code, wire error) and the two ways of
writing a result (human words by default, one JSON object with `--json`).

Exit codes: 0 success; 1 the daemon answered with an error, or the turn/fork did not succeed;
2 usage; 3 the daemon cannot be reached; 4 a fork's delivery is unknown (retry reuses its ids);
130 `say` stopped by Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from client.control_chars import shown

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_UNKNOWN = 4
EXIT_INTERRUPTED = 130


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


def fail(args: argparse.Namespace, exc: CliError) -> int:
    if args.json:
        print(json.dumps({"error": exc.error}))
    else:
        print(f"agenthost: {exc.reason}: {exc.message}", file=sys.stderr)
    return exc.code


def emit(args: argparse.Namespace, data: Any, human: str) -> None:
    if args.json:
        print(json.dumps(data))
    elif human:
        print(human)


class ShownStream:
    """A text stream that writes through `shown`: what the model, a tool or another client
    wrote (a reply, a title, an approval's command) reaches a person's terminal as text."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(shown(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
