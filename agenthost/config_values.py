"""The value types of the configuration schema: what a key accepts (`Bool`, `Int`, `Number`,
`Str`, `Url`, `Command`, `Endpoints`, each with its range), how a wrong value is described in
TOML's words (`describe`), the `Key` that declares one schema entry, and `ConfigError`."""

from __future__ import annotations

import abc
import datetime
import json
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from domain.redaction import redact_userinfo


class ConfigError(ValueError):
    """The configuration is unreadable, names a key we do not know, or has a wrong value:
    one line per mistake in `problems` (a whole file is checked before it is refused, so a bad
    value never hides an unknown key after it)."""

    def __init__(self, problem: str, *more: str) -> None:
        self.problems: tuple[str, ...] = (problem, *more)
        super().__init__("\n".join(self.problems))


# -- value types ---------------------------------------------------------------------------


def describe(value: Any) -> str:
    """What the user wrote, in TOML's words: `the string "false"`, `the integer -5`."""
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, str):
        # A URL's user and password are never echoed (`https://***@host/v1`).
        return f"the string {json.dumps(redact_userinfo(value))}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, list):
        return f"the array {json.dumps(value, default=str)[:80]}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return f"the date/time {value.isoformat()}"
    return f"a {type(value).__name__}"


class ValueType(abc.ABC):
    """The port every value type implements, a key's type and range: `check` returns the
    value to use or raises `ValueError` whose text is what was expected (the caller adds the
    file, table, key and what was given)."""

    @abc.abstractmethod
    def expected(self) -> str:
        """What a value of this type is, in the user's words ("an integer from 1 to 64")."""

    @abc.abstractmethod
    def check(self, value: Any) -> Any:
        """The value to use for `value` (normalised: a float, a tuple), or `ValueError`."""


@dataclass(frozen=True)
class Bool(ValueType):
    def expected(self) -> str:
        return "a boolean (true/false)"

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(self.expected())
        return value


@dataclass(frozen=True)
class Int(ValueType):
    """An integer in [min, max] (TOML integer; `true` and `2.0` are not integers)."""

    min: int
    max: int
    unit: str = ""

    def expected(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"an integer from {self.min} to {self.max}{unit}"

    def check(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(self.expected())
        if not self.min <= value <= self.max:
            raise ValueError(self.expected())
        return int(value)


@dataclass(frozen=True)
class Number(ValueType):
    """An integer or a float in [min, max]; returned as a float."""

    min: float
    max: float
    unit: str = ""

    def expected(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"a number from {self.min:g} to {self.max:g}{unit}"

    def check(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(self.expected())
        if not math.isfinite(value) or not self.min <= value <= self.max:
            raise ValueError(self.expected())
        return float(value)


@dataclass(frozen=True)
class Str(ValueType):
    """A non-empty string (at most `max_len` characters), optionally one of `choices`."""

    choices: tuple[str, ...] = ()
    max_len: int = 4096
    pattern: str = ""
    """A regular expression the whole string must match (described by `what`)."""
    what: str = ""

    def expected(self) -> str:
        if self.choices:
            return "one of " + ", ".join(json.dumps(c) for c in self.choices)
        if self.what:
            return self.what
        return "a non-empty string"

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not value or len(value) > self.max_len:
            raise ValueError(self.expected())
        if self.choices and value not in self.choices:
            raise ValueError(self.expected())
        if self.pattern and not re.fullmatch(self.pattern, value):
            raise ValueError(self.expected())
        return value


@dataclass(frozen=True)
class Url(ValueType):
    """An absolute http(s) URL."""

    def expected(self) -> str:
        return 'an http(s) URL such as "http://127.0.0.1:8080/v1"'

    def check(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(self.expected())
        try:
            parsed = urlparse(value)
            parsed.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ValueError(self.expected()) from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(self.expected())
        return value


@dataclass(frozen=True)
class Command(ValueType):
    """A command line: a string (split like a shell would) or a non-empty argv array."""

    def expected(self) -> str:
        return "a command: a non-empty string or a non-empty array of strings"

    def check(self, value: Any) -> str | list[str]:
        if isinstance(value, str) and value.strip():
            # Split here as the drivers will: a quote left open fails `serve` in words, not
            # the first status or Turn that reads the command (an internal error).
            try:
                words = shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"{self.expected()} ({exc})") from None
            if not words or not words[0]:
                raise ValueError(self.expected())
            return value
        if (
            isinstance(value, list)
            and value
            and all(isinstance(part, str) and part for part in value)
        ):
            return list(value)
        raise ValueError(self.expected())


@dataclass(frozen=True)
class Endpoints(ValueType):
    """ZeroMQ endpoints: one string or an array of them, each `tcp://…` or `ipc://…`."""

    def expected(self) -> str:
        return 'an endpoint or an array of endpoints ("tcp://HOST:PORT" or "ipc://PATH")'

    def check(self, value: Any) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(
            isinstance(x, str) and x.startswith(("tcp://", "ipc://")) and len(x) > 6 for x in items
        ):
            raise ValueError(self.expected())
        return tuple(items)


@dataclass(frozen=True)
class Strings(ValueType):
    """An array of non-empty strings (gitignore patterns, …); `[]` is allowed."""

    def expected(self) -> str:
        return "an array of non-empty strings"

    def check(self, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            raise ValueError(self.expected())
        return tuple(value)


@dataclass(frozen=True)
class Key:
    table: str
    """`daemon`, `providers.codex`, …: the TOML table the key lives in."""
    name: str
    type: ValueType
    default: Any
    """Used when the key is absent (`None`: absent means "not configured")."""
    doc: str
    secret: bool = False
    """Never echo the value in an error (a key pasted into the wrong place stays unprinted)."""
