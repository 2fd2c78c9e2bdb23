"""A meta-path finder the probe sites (`bench/stages_site`, `bench/turn_stamp_site`) install in
the daemon to wrap functions of the modules they stamp as soon as each module has run: before
any of its classes has an instance (the stores keep `db.submit_write` bound at construction, so
a wrap that came later, as a thread polling `sys.modules` could on a loaded machine, would never
see their writes). Nothing of the daemon's code changes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from types import ModuleType
from typing import Any


class WrapOnImport:
    """Finds each named module with the other finders and calls `wrap(name, module)` once the
    module's code has run."""

    def __init__(self, names: Collection[str], wrap: Callable[[str, ModuleType], None]) -> None:
        self._names = names
        self._wrap = wrap

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self._names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec
        wrap = self._wrap

        def exec_and_wrap(module: ModuleType) -> None:
            exec_module(module)
            wrap(name, module)

        spec.loader.exec_module = exec_and_wrap
        return spec


def wrap_on_import(names: Collection[str], wrap: Callable[[str, ModuleType], None]) -> None:
    """Wraps the named modules already imported now and each of the others as it is imported."""
    for name in names:
        if name in sys.modules:
            wrap(name, sys.modules[name])
    sys.meta_path.insert(0, WrapOnImport(names, wrap))  # type: ignore[arg-type]
