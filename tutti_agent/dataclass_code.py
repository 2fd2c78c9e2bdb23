"""The functions `dataclasses` writes for tutti-agent's classes, taken from the file the host's
build keeps beside this package's bytecode (`python -m domain.dataclass_code`, run by `make
install` and the test and bench runs) instead of compiled at each app-server's start.

On Python 3.11 and 3.12 `@dataclass` compiles each function's source text with `exec` as the
class is made (~0.5 ms a class, ~30 classes). `install()` gives `dataclasses` an `exec` that
takes the code compiled from the same text out of that file; a text not in it is compiled as
before, so the classes are the same either way. Standard library only: this program imports
nothing of the host's (the host's own cache, `domain/dataclass_code.py`, writes this file)."""

from __future__ import annotations

import builtins
import dataclasses
import importlib.util
import marshal
import sys
from collections.abc import Mapping
from pathlib import Path
from types import CodeType
from typing import Any

CACHE = (
    Path(__file__).resolve().parent
    / "__pycache__"
    / f"dataclass_code.{sys.implementation.cache_tag}.bin"
)
"""The file the host's build writes: `(importlib.util.MAGIC_NUMBER, {text: code})`."""


class DataclassCode:
    """The code for each source text `dataclasses` compiles, and what was taken from it."""

    def __init__(self, codes: dict[str, CodeType]) -> None:
        self.codes = codes
        self.taken = 0
        self.compiled = 0

    def exec(
        self,
        source: str | CodeType,
        globals: dict[str, Any] | None = None,  # noqa: A002 - builtins.exec's own names
        locals: Mapping[str, object] | None = None,  # noqa: A002
        /,
    ) -> None:
        if isinstance(source, str):
            code = self.codes.get(source)
            if code is None:
                # As `exec(text)` in dataclasses.py compiles it (no future flags inherited).
                code = self.codes[source] = compile(source, "<string>", "exec", dont_inherit=True)
                self.compiled += 1
            else:
                self.taken += 1
            source = code
        builtins.exec(source, globals, locals)


_installed: DataclassCode | None = None


def install(path: Path = CACHE) -> DataclassCode | None:
    """Make `dataclasses` take its functions' code from `path` from now on (once a process).
    None where this Python compiles otherwise, or where the process's `dataclasses` takes its
    code from elsewhere already (the host's worker importing this package)."""
    global _installed
    supported = hasattr(dataclasses, "_create_fn") and sys.version_info[:2] in ((3, 11), (3, 12))
    own = getattr(dataclasses, "exec", builtins.exec) is builtins.exec
    if _installed is None and supported and own:
        _installed = DataclassCode(_load(path))
        dataclasses.exec = _installed.exec  # type: ignore[attr-defined]
    return _installed


def installed() -> DataclassCode | None:
    return _installed


def _load(path: Path) -> dict[str, CodeType]:
    """Nothing when the file is missing, unreadable or written by another interpreter."""
    try:
        magic, codes = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if magic != importlib.util.MAGIC_NUMBER or not isinstance(codes, dict):
        return {}
    return codes
