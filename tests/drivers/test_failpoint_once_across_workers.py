"""A `once:` point armed through the supervisor fires once across all its workers, even when
a sibling worker receives the arming after another worker has already died of it.

The supervisor clears the shared markers once, when it arms the point. A worker that was
still starting is sent the arming when it says hello, which may be later. It must not clear
the marker again: the dead worker's successor would then die of the same point. The crash
cell `codex-worker.resolve.transient_loaded` saw this under load: the tutti-agent worker
said hello after the Codex worker had died, and the next inspection was killed as well.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from drv_helpers import wait_until

from drivers.errors import WorkerLost
from drivers.supervisor import WorkerSupervisor

P = "tutti-agent"
LATE = "codex"  # any other provider: only its worker's link and failpoints are used here
POINT = "test.once"


def _gated_python(tmp_path: Path, gate: Path) -> str:
    """A `python` for the supervisor: a `LATE` worker waits for `gate` before it starts, so it
    says hello (and is sent the armed points) only when the test opens the gate."""
    script = tmp_path / "gated-python"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *"--provider {LATE}"*)\n'
        f"  while [ ! -e '{gate}' ]; do sleep 0.02; done ;;\n"
        "esac\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.mark.timeout(60)
def test_a_late_worker_armed_after_a_sibling_died_of_a_once_point_does_not_rearm_it(
    tmp_path: Path, run_dir: Path
) -> None:
    gate = tmp_path / "gate"
    with WorkerSupervisor(run_dir, python=_gated_python(tmp_path, gate)) as sup:
        sup.request(P, "worker.ping", {}, 15).result(20)
        sup.start_ahead(LATE)  # spawned, held before its hello by the gate
        wait_until(lambda: any(w["provider"] == LATE for w in sup.status()), 10)
        sup.set_failpoints({POINT: "once:kill"})
        with pytest.raises(WorkerLost):
            sup.request(P, "debug.hit", {"name": POINT}, 15).result(20)
        marker = run_dir / "failpoints-state" / f"fired.{POINT}"
        assert marker.exists()
        # The late worker says hello now. The supervisor sends it the arming before the ping,
        # and its link applies the arming before it dispatches the ping.
        gate.touch()
        sup.request(LATE, "worker.ping", {}, 15).result(20)
        assert marker.exists(), "the late worker's arming cleared a claimed once: marker"
        # The dead worker's successor inherits the armed point, but the once has been spent.
        sup.request(P, "debug.hit", {"name": POINT}, 15).result(20)
        restarts = {w["provider"]: w["restarts"] for w in sup.status()}
        assert restarts == {P: 1, LATE: 0}, restarts
        # Re-arming through the supervisor still clears the marker (it does so itself, once):
        # the point fires one more time, and only once.
        sup.set_failpoints({POINT: "once:kill"})
        with pytest.raises(WorkerLost):
            sup.request(P, "debug.hit", {"name": POINT}, 15).result(20)
        sup.request(P, "debug.hit", {"name": POINT}, 15).result(20)
