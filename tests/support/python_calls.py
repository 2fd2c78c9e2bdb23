"""The Python functions a call enters on its own thread, by a profile hook: what a test pins
where a hot path must not enter a function (a wrapper, a per-call builder)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def python_calls(fn: Callable[[], Any]) -> list[str]:
    """The qualified names of the Python functions `fn()` entered on this thread, in order
    (`fn` itself first when it is a Python function)."""
    entered: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            entered.append(frame.f_code.co_qualname)

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return entered
