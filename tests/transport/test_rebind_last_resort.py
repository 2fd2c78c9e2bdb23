"""The re-bind's last resort (`transport.endpoints.Binder.rebind`, docs/design/connections.md
"Listeners a re-bind replaces"): in a process whose kernel refuses every hard link and every
rename (a seccomp filter, EPERM), the spare name can be put in place neither way, so the new
listener is bound at the endpoint's own path spelled with a doubled slash. The socket file is
removed again and again: each round a fresh client is answered at the usual path, a client of
the first listener keeps being answered, and each replaced listener can be unbound alone, so
the listeners stay bounded (before the alias, each round added one at the path itself that
nothing could unbind)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import REPO
from tests.support.seccomp import LINKS, RENAMES, refusing

ROUNDS = 12

_SCENARIO = r"""
import json, logging, os, sys
import zmq
from tests.support.run_dir import listeners_in
from transport.endpoints import Binder, rebind_missing

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
run = sys.argv[1]
endpoint = f"ipc://{run}/api.sock"
ctx = zmq.Context()
server = ctx.socket(zmq.ROUTER)
server.setsockopt(zmq.LINGER, 0)
binder = Binder(None)
binder.bind_each(server, [endpoint])


def ask(client, text):
    client.send(text.encode())
    assert server.poll(10_000), "no request reached the server"
    ident, body = server.recv_multipart()
    server.send_multipart([ident, body.upper()])
    assert client.poll(10_000), "no reply reached the client"
    return client.recv().decode()


old = ctx.socket(zmq.DEALER)
old.setsockopt(zmq.LINGER, 0)
old.connect(endpoint)
assert ask(old, "hello") == "HELLO"  # connected through the first listener before its file goes
rounds = []
for i in range(int(sys.argv[2])):
    os.unlink(f"{run}/api.sock")
    again = rebind_missing(binder, [(server, [endpoint])])
    unbound = []
    for address, _ in binder.take_replaced():
        if address != endpoint:  # the first listener holds the old client: it stays
            unbound.append(binder.unbind(address))
    fresh = ctx.socket(zmq.DEALER)
    fresh.setsockopt(zmq.LINGER, 0)
    fresh.connect(endpoint)
    rounds.append({
        "again": again,
        "fresh": ask(fresh, f"fresh {i}"),
        "old": ask(old, f"old {i}"),
        "unbound": unbound,
        "listeners": listeners_in(os.getpid(), run),
        "files": sorted(os.listdir(run)),
    })
    fresh.close()
print(json.dumps(rounds))
"""


def test_a_rebind_that_can_neither_link_nor_rename_keeps_its_listeners_bounded(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    out = subprocess.run(
        [sys.executable, "-c", _SCENARIO, str(run), str(ROUNDS)],
        preexec_fn=refusing(*LINKS, *RENAMES),
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    # Every round took the last resort: the kernel refused the link and the rename.
    assert out.stderr.count("cannot be linked or renamed") == ROUNDS, out.stderr
    rounds = json.loads(out.stdout)
    assert len(rounds) == ROUNDS
    for i, r in enumerate(rounds):
        assert r["again"] == [f"ipc://{run}/api.sock"]
        assert r["fresh"] == f"FRESH {i}"  # at the usual path
        assert r["old"] == f"OLD {i}"  # through the first listener, its file long gone
        assert all(r["unbound"]), r  # each replaced alias was unbound alone
        # The first listener (it holds the old client) and the current one, whatever the round.
        assert len(r["listeners"]) == 2, r["listeners"]
        assert r["files"] == ["api.sock"], r["files"]  # no spare name left behind
