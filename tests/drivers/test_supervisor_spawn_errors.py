"""A worker spawn that fails with "Too many open files" must not kill the
supervisor's loop thread — that thread is also every request's timeout clock. Waiters get a
typed error, `status()` names the error, and the supervisor retries with backoff until the
spawn succeeds.

Run in a child process, so lowering RLIMIT_NOFILE there cannot starve the test runner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, resource, sys, time
    from drivers.errors import WorkerUnavailable
    from drivers.supervisor import WorkerSupervisor

    out = {}
    sup = WorkerSupervisor(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Fill the descriptor table up to a limit that leaves no room for a worker spawn.
    hog = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        while True:
            hog.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    fut = sup.request("tutti-agent", "worker.ping", {}, 2.0)
    try:
        fut.result(20)
        out["first"] = "ok"
    except WorkerUnavailable as exc:
        out["first"] = "unavailable"
        out["firstMessage"] = str(exc)
    except Exception as exc:
        out["first"] = type(exc).__name__
    out["statusDuringErrors"] = sup.status()
    # A request with a deadline is failed by the (still running) clock even while spawns fail.
    t0 = time.monotonic()
    fut2 = sup.request("tutti-agent", "worker.ping", {}, 0.5)
    try:
        fut2.result(20)
        out["second"] = "ok"
    except Exception as exc:
        out["second"] = type(exc).__name__
    out["secondWaitedS"] = time.monotonic() - t0
    for fd in hog:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    out["loopAlive"] = sup._loop_thread.is_alive()
    # Descriptors are back: the supervisor's own backoff retry (or this request) spawns.
    out["third"] = sup.request("tutti-agent", "worker.ping", {}, 20).result(30).get("provider")
    out["statusAfter"] = sup.status()
    sup.close()
    print(json.dumps(out))
    """
)


@pytest.mark.timeout(90)
def test_spawn_failing_with_emfile_keeps_supervisor_alive_and_retries(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=80,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["first"] == "unavailable", out
    assert "Too many open files" in out["firstMessage"], out
    [row] = out["statusDuringErrors"]
    assert row["state"] == "backoff"
    assert "Too many open files" in (row["lastError"] or ""), row
    assert out["second"] == "WorkerUnavailable", out
    assert out["loopAlive"] is True
    assert out["third"] == "tutti-agent"
    [after] = out["statusAfter"]
    assert after["state"] == "ready" and after["restarts"] >= 1, after
