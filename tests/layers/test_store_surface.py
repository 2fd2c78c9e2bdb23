"""`storage.Store` carries only what the daemon uses (issue 19): every public method of it is
called somewhere outside the tests. A read or write only tests make lives in the test port,
tests/support/store_reads.py, running the same SQL through the store's own helpers.
"""

from __future__ import annotations

import re
from pathlib import Path

from storage import Store

ROOT = Path(__file__).resolve().parents[2]
NON_TEST_PACKAGES = (
    "domain",
    "storage",
    "actors",
    "transport",
    "drivers",
    "tutti_agent",
    "agenthost",
    "model_fakes",
    "client",
    "bench",
)


def _non_test_source() -> str:
    return "\n".join(
        path.read_text()
        for package in NON_TEST_PACKAGES
        if (ROOT / package).is_dir()
        for path in sorted((ROOT / package).rglob("*.py"))
    )


def test_every_public_store_method_has_a_caller_outside_the_tests() -> None:
    source = _non_test_source()
    public = sorted(name for name in dir(Store) if not name.startswith("_"))
    unused = [name for name in public if not re.search(rf"\.{name}\b", source)]
    assert unused == [], f"Store methods only tests call (move them to tests/support): {unused}"
