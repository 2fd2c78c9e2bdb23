"""The functions `dataclasses` writes for each class (`__init__`, `__repr__`, `__eq__`, a frozen
class's `__setattr__`, ...), compiled once and kept beside the packages' bytecode, as Python
keeps a module's.

On Python 3.11 `@dataclass` writes each of those functions as source text and compiles it with
`exec` when the class is made: ~0.5 ms a class. The daemon makes ~150 dataclasses as it
imports, so that compiling was ~80 ms of each start's ~190 ms of imports, paid again by every
daemon, worker and command (`bench/start_cpu.py`). `install()` gives `dataclasses` an `exec`
that takes the code compiled from the same text out of a file written by `build()` (`python -m
domain.dataclass_code`, run by `make install` and the test and bench runs); a text not in it
(a class changed since, or not ours) is compiled as before. The code is the same either way:
the same text compiled as `exec` compiles it (no future flags inherited, `<string>`), run with
the same globals and locals. Where `dataclasses` compiles otherwise (Python 3.13 and later),
`install` leaves it alone.

Standard library only, as the rest of `domain`."""

from __future__ import annotations

import builtins
import dataclasses
import importlib
import importlib.util
import marshal
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import CodeType
from typing import Any

CACHE = (
    Path(__file__).resolve().parent
    / "__pycache__"
    / f"dataclass_code.{sys.implementation.cache_tag}.bin"
)
"""Where `build` writes the code and `install` reads it: beside `domain`'s bytecode, tagged by
the interpreter as a `.pyc` is."""

PACKAGES = (
    "domain",
    "protocol",
    "storage",
    "transport",
    "workspace",
    "actors",
    "drivers",
    "agenthost",
)
"""The packages whose modules `build` imports: every process of the daemon side's."""

OWN_PROGRAMS = ("tutti_agent",)
"""Packages that are programs of their own and import nothing of ours (the Tutti Agent
app-server): `build` imports them too and writes, beside each one's bytecode, a file of the
code of its own classes alone, which that program's `dataclass_code.install` takes."""

_MAGIC = importlib.util.MAGIC_NUMBER


def _compile(source: str) -> CodeType:
    # As `exec(source, ...)` in dataclasses.py compiles it: that module has no future imports,
    # so nothing of this one's (`annotations`) may be inherited.
    return compile(source, "<string>", "exec", dont_inherit=True)


class DataclassCode:
    """The code for each source text `dataclasses` compiles, and what was taken from it."""

    def __init__(self, codes: Mapping[str, CodeType] | None = None) -> None:
        self.codes: dict[str, CodeType] = dict(codes or {})
        self.taken = 0
        """Texts found in `codes`."""
        self.compiled = 0
        """Texts compiled here (not in `codes`): kept in it from then on."""
        self.made_in: dict[str, set[str]] | None = None
        """While `build` records: each text's modules (the classes' globals' `__name__`)."""

    def exec(
        self,
        source: str | CodeType,
        globals: dict[str, Any] | None = None,  # noqa: A002 - builtins.exec's own names
        locals: Mapping[str, object] | None = None,  # noqa: A002
        /,
    ) -> None:
        if isinstance(source, str):
            if self.made_in is not None:
                self.made_in.setdefault(source, set()).add(str((globals or {}).get("__name__")))
            code = self.codes.get(source)
            if code is None:
                code = self.codes[source] = _compile(source)
                self.compiled += 1
            else:
                self.taken += 1
            source = code
        builtins.exec(source, globals, locals)


def load(path: Path = CACHE) -> dict[str, CodeType]:
    """The code `build` wrote to `path`; nothing when it is missing, unreadable or written by
    another interpreter."""
    try:
        magic, codes = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if magic != _MAGIC or not isinstance(codes, dict):
        return {}
    return codes


def supported() -> bool:
    """Whether this Python's `dataclasses` compiles each function by `exec` of its text
    (`_create_fn`: 3.11 and 3.12)."""
    return hasattr(dataclasses, "_create_fn") and sys.version_info[:2] in ((3, 11), (3, 12))


_installed: DataclassCode | None = None


def install(path: Path = CACHE) -> DataclassCode | None:
    """Make `dataclasses` take its functions' code from `path` from now on (once a process:
    later calls return the first one's). None where this Python compiles otherwise."""
    global _installed
    if _installed is None and supported():
        _installed = DataclassCode(load(path))
        dataclasses.exec = _installed.exec  # type: ignore[attr-defined]
    return _installed


def installed() -> DataclassCode | None:
    return _installed


def modules(packages: Iterable[str]) -> list[str]:
    """Every module of `packages` under the current path, but each `__main__`."""
    import pkgutil  # here: `install`, in every process, needs none of what `build` does

    out: list[str] = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        out.append(package)
        for info in pkgutil.walk_packages(spec.submodule_search_locations, f"{package}."):
            if not info.name.endswith(".__main__"):
                out.append(info.name)
    return out


def own_cache(package: str) -> Path | None:
    """Where the program `package` (OWN_PROGRAMS) takes its code from: beside its bytecode, as
    `CACHE` is beside `domain`'s; None where it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "__pycache__" / CACHE.name


def build(
    path: Path = CACHE, packages: Iterable[str] = PACKAGES, programs: Iterable[str] = OWN_PROGRAMS
) -> int:
    """Import every module of `packages` and `programs` with the code recorded, then write it all
    to `path` and each program's classes' code to its `own_cache` (each replaced whole,
    atomically). Run in a process of its own (`python -m domain.dataclass_code`): a module
    imported already made its classes before the recording. The number of texts in `path`."""
    programs = tuple(programs)
    code = install(Path(os.devnull)) or DataclassCode()
    code.made_in = {}
    for name in modules((*packages, *programs)):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - an optional dependency missing: its classes compile
            continue
    for program in programs:
        own = own_cache(program)
        if own is not None:
            _write(
                own,
                {
                    text: compiled
                    for text, compiled in code.codes.items()
                    if any(m.split(".")[0] == program for m in code.made_in.get(text, ()))
                },
            )
    _write(path, code.codes)
    return len(code.codes)


def _write(path: Path, codes: Mapping[str, CodeType]) -> None:
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # readable as the bytecode beside it
        with os.fdopen(fd, "wb") as f:
            f.write(marshal.dumps((_MAGIC, dict(codes))))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main() -> None:
    if supported():
        print(f"dataclass code: {build()} functions written to {CACHE}")


if __name__ == "__main__":
    # Through the module's own name: the packages' `install` calls reach that copy, not this
    # `__main__` one, and the recording must be theirs.
    importlib.import_module("domain.dataclass_code").main()
