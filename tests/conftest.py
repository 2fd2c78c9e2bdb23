"""Suite-wide collection rule: tests marked `long` (extra providers or trials of a property that a
shorter test already pins in `make test`) run only in `make soak` (AGENTHOST_SOAK=1) or when
selected with `-m`; `make test` deselects them so the whole suite stays within its 15 minutes.
The packages' bytecode is written once per run, so the daemons the tests start do not compile
them each time, and so is the test files' rewritten bytecode, so each xdist worker does not
rewrite them all again. The longest files go to the xdist workers first (`LONGEST_FILES`)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from tests.support import rewrite_cache

ROOT = Path(__file__).resolve().parent.parent
# Every daemon a test starts builds its accept shim (transport/accept_shim.py) once into the
# checkout's build folder, not into each test's private HOME.
os.environ.setdefault("AGENTHOST_NATIVE_DIR", str(ROOT / "build" / "native"))


LONGEST_FILES: dict[str, int] = {
    "tests/reliability/test_crash_soak.py": 150,
    "tests/reliability/test_crash_matrix.py": 148,
    "tests/reliability/test_crash_points.py": 135,
    "tests/daemon/test_config.py": 30,
    "tests/claude/test_claude_misbehaving.py": 50,
    "tests/resources/test_slow_clients.py": 88,
    "tests/daemon/test_daemon_sessions.py": 80,
    "tests/bench/test_bench_smoke.py": 79,
    "tests/reliability/test_store_contention.py": 78,
    "tests/claude/test_claude_daemon.py": 76,
    "tests/daemon/test_hung_provider.py": 47,
    "tests/client/test_client_gui_keyboard.py": 69,
    "tests/daemon/test_fork_saga.py": 63,
    "tests/reliability/test_contention_soak.py": 62,
    "tests/client/test_client_cli_everyday.py": 61,
    "tests/daemon/test_stop_signals.py": 30,
    "tests/storage/test_store_crash.py": 30,
    "tests/daemon/test_worktree_delete.py": 58,
    "tests/daemon/test_fork_resolve_crash.py": 55,
    "tests/models/test_models_tutti.py": 53,
}
"""The files that take longest, each with its seconds in a full run on a loaded machine (the
figures only order them): `make test` hands each file whole to one xdist worker
(`--dist loadfile`, in collection order: `--no-loadscope-reorder`), so these go first, longest
first, and no long file is left to run alone at the end while the other workers idle; the rest
follow by their number of tests, as xdist would order them. A file missing here only runs later;
a name here that is no file fails `tests/support_tests/test_longest_files.py`."""


def pytest_configure(config: pytest.Config) -> None:
    # The daemons, workers and providers the tests start are fresh interpreters: in a checkout
    # run with PYTHONDONTWRITEBYTECODE=1 each would compile every module it imports (~0.3 s of
    # CPU a daemon). Written once here, in the controller, as an install writes them.
    if hasattr(config, "workerinput") or os.environ.get(rewrite_cache.WRITING_ENV):
        return
    from bench.harness import byte_compile

    byte_compile(ROOT)
    # Every xdist worker collects every test file: their rewritten bytecode is written once,
    # here, before the workers start (tests/support/rewrite_cache.py).
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1:
        rewrite_cache.write_rewritten(ROOT, rewrite_cache.named_test_files(ROOT, config.args))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("AGENTHOST_SOAK") == "1" or config.getoption("markexpr"):
        return
    long = [item for item in items if item.get_closest_marker("long") is not None]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if item.get_closest_marker("long") is None]
    longest_first(items)


def longest_first(items: list[pytest.Item]) -> None:
    """`items` ordered file by file: `LONGEST_FILES` first, longest first, then the other files
    by their number of tests, most first; each file's tests in their own order."""
    files = [item.nodeid.split("::", 1)[0] for item in items]
    counts = Counter(files)
    first = {name: index for index, name in reversed(list(enumerate(files)))}
    order = {name: (-LONGEST_FILES.get(name, 0), -counts[name], first[name]) for name in counts}
    ranked = sorted(range(len(items)), key=lambda index: (order[files[index]], index))
    items[:] = [items[index] for index in ranked]
