"""`bench.turn_overhead`'s bare side runs its app-server thread in an empty folder, as the
host's Sessions work in one (`BenchDaemon.workdir`), not in the repository the bench runs from:
Codex reads a git work tree's state at each Turn, which the host's Sessions never pay."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.turn_overhead import side_by_side


@pytest.mark.timeout(120)
def test_the_bare_app_server_thread_works_in_an_empty_folder(tmp_path: Path) -> None:
    with side_by_side("tutti-agent", tmp_path) as (_server, _config, bare):
        read = bare.proc.request("thread/read", {"threadId": bare.thread_id})
    folder = tmp_path / "bare-work"
    assert read["thread"]["cwd"] == str(folder)
    assert folder.is_dir() and not any(folder.iterdir())
