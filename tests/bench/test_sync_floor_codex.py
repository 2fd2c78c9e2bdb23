"""Codex's own durability floor (`bench.sync_floor.measure_codex`): its forks' syncs counted
with strace through a real daemon on the real `codex app-server` (the model its only fake
part), and its bound child sized from the target homes the forks bound."""

from __future__ import annotations

import shutil

import pytest

pytestmark = [pytest.mark.codex, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def _codex_and_strace() -> None:
    from bench.providers import provider

    why = provider("codex").unavailable()
    assert why is None, why
    assert shutil.which("strace") is not None, "strace is needed to count the syncs"


def test_codex_forks_are_counted_through_a_codex_daemon_with_their_own_child() -> None:
    from bench.sync_floor import count_codex_syncs

    counted = count_codex_syncs(forks=3, turns=2, warmup=1)
    # The saga's two COMMITs and the acknowledgement's: the same as a tutti-agent fork's.
    assert counted.store_commits == 2.0, counted
    # The bind's temp files: the child and the source's rollout copied as its ancestor.
    assert counted.file_syncs == 2.0, counted
    # The new target home's chain created in round 1 (each parent fsynced), the names' one.
    assert counted.dir_syncs == counted.new_dirs + 1 and counted.new_dirs >= 1, counted
    # A Referenced child: its `session_meta` (~22 KB) and its own few lines; the ancestor is
    # the whole source rollout.
    assert 8192 < counted.child_bytes < counted.ancestor_bytes, counted
