"""The client side of real models, as real subprocesses against a real daemon: `agenthost say`
prints a reply while the model is still producing it (the fake model holds the rest of its stream),
`agenthost new --model` stores the Session's model, and `agenthost status` names each
provider's endpoint and credential variable (and whether it is set), never the key."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from model_fakes.responses import ResponsesServer
from tests.support.daemon import WS, DaemonProcess

pytestmark = pytest.mark.timeout(120)

KEY = "sk-cli-test-2b7c4d9e"
VAR = "AGENTHOST_TEST_CLI_KEY"


def cli(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "agenthost.cli", "--home", str(home), "--workspace", WS, *args]


def test_say_prints_the_reply_as_it_streams_and_status_names_the_credential(
    tmp_path: Path,
) -> None:
    gate = threading.Event()
    with ResponsesServer(api_key=KEY, gate=gate) as model:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            "[providers.tutti-agent]\n"
            f'model_base_url = "{model.base_url}"\n'
            f'api_key_env = "{VAR}"\n'
            'model = "default-model"\n'
        )
        d = DaemonProcess(home, env={VAR: KEY}).start()
        proc: subprocess.Popen[bytes] | None = None
        try:
            new = subprocess.run(
                cli(home, "--json", "new", "--model", "session-model"),
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )

            session = json.loads(new.stdout)["session"]
            assert session["model"] == "session-model"
            sid = session["agentSessionId"]

            proc = subprocess.Popen(
                cli(home, "say", sid, "a streamed reply"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
            )
            assert proc.stdout is not None
            out = b""
            deadline = time.monotonic() + 60
            # The model has sent only its first delta ("echo") and holds the rest.
            while b"assistant: echo" not in out and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], 0.5)
                if ready:
                    out += os.read(proc.stdout.fileno(), 4096)
            assert b"assistant: echo" in out, out
            assert proc.poll() is None  # still waiting for the rest of the reply
            assert b"a streamed reply" not in out.split(b"assistant:", 1)[1]
            gate.set()
            rest, err = proc.communicate(timeout=60)
            out += rest
            assert proc.returncode == 0, (out, err)
            text = out.decode()
            assert text.count("assistant: echo: a streamed reply\n") == 1, text
            assert model.requests[-1]["model"] == "session-model"

            status = subprocess.run(
                cli(home, "status"), capture_output=True, text=True, timeout=60, check=True
            )
            assert f"endpoint {model.base_url} [responses]" in status.stdout, status.stdout
            assert f"credential ${VAR} (set)" in status.stdout
            assert "model default-model" in status.stdout
            assert KEY not in status.stdout
        finally:
            gate.set()
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            d.stop()


def test_say_json_writes_the_streamed_deltas_as_json_lines(tmp_path: Path) -> None:
    with ResponsesServer(api_key=KEY) as model:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.tutti-agent]\nmodel_base_url = "{model.base_url}"\napi_key_env = "{VAR}"\n'
        )
        d = DaemonProcess(home, env={VAR: KEY}).start()
        try:
            new = subprocess.run(
                cli(home, "--json", "new"), capture_output=True, text=True, timeout=60, check=True
            )
            sid = json.loads(new.stdout)["session"]["agentSessionId"]
            done = subprocess.run(
                cli(home, "--json", "say", sid, "stream me as lines"),
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert done.returncode == 0, done.stderr
            lines = [json.loads(line) for line in done.stdout.splitlines()]
            deltas = [line for line in lines if line["type"] == "message.delta"]
            assert len(deltas) > 1  # the fake model streams the reply in several pieces
            assert all(line["agentSessionId"] == sid for line in deltas)
            settled = [
                line["message"]
                for line in lines
                if line["type"] == "message" and line["message"]["kind"] == "assistant"
            ]
            assert "".join(line["delta"] for line in deltas) == settled[-1]["text"]
            assert lines.index(deltas[-1]) < lines.index(lines[-1])
            assert lines[-1]["type"] == "turn" and lines[-1]["turn"]["outcome"] == "completed"
        finally:
            d.stop()
