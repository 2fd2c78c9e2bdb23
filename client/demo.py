"""`make demo`: start a real daemon on its embedded defaults (SQLite + the built-in Tutti Agent),
run a session of three turns, fork it through its second Turn, run a turn on the child, and
print what happened — then stop the daemon cleanly.

`make demo PROVIDER=codex` runs the same script on the pinned real Codex app-server against a
local echo model (`model_fakes.responses`, the same fake the tests use), and checks the child's
model input in that model's request log (Codex has no `/history` directive).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from client.lineage_view import status_words
from client.references import timeline
from client.session_client import fork_and_wait, format_transcript, run_turn
from model_fakes.responses import ResponsesServer, model_input_texts
from protocol.methods import (
    HOST_STATUS,
    SESSION_CREATE,
    SESSION_GET,
    HostStatusParams,
    SessionCreateParams,
    SessionParams,
)
from transport.client import Client

WS = "demo"


def _banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def _start_daemon(home: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    env = dict(os.environ, AGENTHOST_HOME=str(home))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost", "--home", str(home), "serve"],
        stdout=subprocess.PIPE,
        stderr=open(home / "daemon.log", "ab"),  # noqa: SIM115 - the child owns it
        env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited early; see {home / 'daemon.log'}")
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            return proc, json.loads(proc.stdout.readline())
    proc.kill()
    raise SystemExit("daemon did not become ready within 30 s")


def _show(client: Client, sid: str) -> dict[str, Any]:
    session = client.call(SESSION_GET, SessionParams(workspaceId=WS, agentSessionId=sid))["session"]
    turns = timeline(client, WS, sid)  # paged: a page may end at its byte bound
    lineage = session.get("forkedFrom")
    source = None
    if lineage:
        source = client.call(
            SESSION_GET,
            SessionParams(workspaceId=WS, agentSessionId=lineage["sourceAgentSessionId"]),
        )["session"]["title"]
    print(format_transcript(session, turns, source))
    return {"session": session, "turns": turns}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agenthost-demo")
    parser.add_argument("--provider", default="tutti-agent")
    parser.add_argument("--home", type=Path, default=None, help="default: a fresh temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the demo home afterwards")
    args = parser.parse_args(argv)
    if args.provider not in ("tutti-agent", "codex"):
        print(f"demo: provider {args.provider!r} needs its model endpoint; see docs/providers.md")
    home = args.home or Path(tempfile.mkdtemp(prefix="agenthost-demo-"))
    home.mkdir(parents=True, exist_ok=True)
    model: ResponsesServer | None = None
    if args.provider == "codex":
        # Codex needs a model endpoint: a local echo model, never the network.
        model = ResponsesServer()
        (home / "agenthost.toml").write_text(
            f'[providers.codex]\nmodel = "mock-model"\nmodel_base_url = "{model.base_url}"\n'
        )
        print(f"local echo model for Codex at {model.base_url}")

    _banner(f"starting the daemon (AGENTHOST_HOME={home})")
    proc, ready = _start_daemon(home)
    print(f"daemon {ready['pid']} ready: API {ready['api']}, events {ready['events']}")
    client = Client(ready["api"], timeout=60)
    try:
        status = client.call(HOST_STATUS, HostStatusParams())
        print(f"agenthost {status['version']}, protocol {status['protocol']}")
        wanted = [p for p in status.get("providers") or [] if p.get("provider") == args.provider]
        if wanted and not wanted[0].get("installed"):
            # The daemon knows where each provider's program lives; the client only asks.
            print(f"demo: {args.provider} is not installed; run `make providers` first")
            return 1

        _banner(f"a session on {args.provider}: three turns")
        session = client.call(
            SESSION_CREATE,
            SessionCreateParams(workspaceId=WS, provider=args.provider, title="Trip planning"),
        )["session"]
        sid = session["agentSessionId"]
        texts = ["Plan a weekend in Lisbon", "/tool search_flights LIS", "Book a hotel in Alfama"]
        if model is not None:
            texts[1] = "Search flights to LIS"  # directives are Tutti Agent's built-in model
        turns = []
        for text in texts:
            print(f"> {text}")
            turns.append(run_turn(client, WS, sid, text, echo=True))
        source_before = _show(client, sid)

        _banner("fork through Turn 2")
        op = fork_and_wait(client, WS, sid, turns[1]["turnId"], progress=lambda p: print(f"… {p}"))
        print(f"operation {op['operationId']}: {status_words(op)}")
        if op["status"] != "committed":
            print(f"fork did not commit: {op['error']}")
            return 1
        made, lineage = op["session"], op["lineage"]
        assert made is not None and lineage is not None, "a committed fork has both"
        child = made["agentSessionId"]
        print(f'child session {child}: "{made["title"]}"')
        print(
            f"lineage: forked from {lineage['sourceAgentSessionId']} through turn "
            f"{lineage['sourceTurnId']}; the child's copy of it is turn {lineage['targetTurnId']}"
        )

        _banner("a turn on the child: what the model sees")
        text = "/history" if model is None else "What have I asked so far?"
        print(f"> {text}")
        before = len(model.requests) if model is not None else 0
        child_turn = run_turn(client, WS, child, text, echo=True)
        reply = next((m["text"] for m in child_turn["messages"] if m["kind"] == "assistant"), "")
        expected = [texts[0], texts[1]]
        if model is None:
            seen_ok = all(t in (reply or "") for t in expected) and texts[2] not in (reply or "")
            seen = repr(reply)
        else:
            # The model's own request log: the user messages of the child's turn.
            asked = [
                t
                for r in model.requests[before:]
                for role, t in model_input_texts(r)
                if role == "user" and t in texts
            ]
            seen_ok = asked[:2] == expected and texts[2] not in asked
            seen = repr(asked)
        print(
            "child's model input holds Turns 1–2 only: "
            + ("yes" if seen_ok else f"NO (model saw: {seen})")
        )
        _show(client, child)

        _banner("the source is unchanged")
        source_after = _show(client, sid)
        unchanged = [t["turnId"] for t in source_after["turns"]] == [
            t["turnId"] for t in source_before["turns"]
        ]
        print(f"source unchanged: {'yes' if unchanged else 'NO'}")
        ok = seen_ok and unchanged
    finally:
        client.close()
        _banner("stopping the daemon")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        print(f"daemon exited with {code}")
        if model is not None:
            model.close()
        if not args.keep and args.home is None:
            shutil.rmtree(home, ignore_errors=True)
    return 0 if ok and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
