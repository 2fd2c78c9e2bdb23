"""Tutti Agent's HTTP model client as a person behind a corporate network meets it: the model
is reached through a proxy named in the environment (`HTTP_PROXY` for http, a `CONNECT`
tunnel through `HTTPS_PROXY` for https), `NO_PROXY` bypasses it, a private CA named by
`SSL_CERT_FILE` is trusted, and the two time limits stay apart (nothing at all within the
first-byte limit; a reply that stops in the middle for the stream-idle limit). An interrupt
wakes a read blocked on a silent model at once. Real sockets: the fake Responses server (over
TLS where said), a forward proxy and a silent endpoint, all on 127.0.0.1."""

from __future__ import annotations

import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from model_fakes.responses import ResponsesServer
from model_fakes.silent import SilentServer
from tests.support.proxy import ForwardProxy
from tutti_agent.errors import ModelError
from tutti_agent.model import Endpoint, ResponsesModel, TurnCancelled

pytestmark = pytest.mark.timeout(60)

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR")


class IO:
    """The TurnIO a model drives, recording what it was given."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.texts: list[str] = []
        self.deltas: list[str] = []
        self._on_cancel: list[Callable[[], None]] = []

    def model_input(self) -> list[Mapping[str, Any]]:
        return [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ]

    def on_cancel(self, callback: Callable[[], None]) -> None:
        self._on_cancel.append(callback)

    def cancel(self) -> None:
        self.cancelled.set()
        for callback in self._on_cancel:
            callback()

    def agent_message(self, text: str, item_id: str | None = None) -> None:
        self.texts.append(text)

    def delta(self, item_id: str, kind: str, text: str) -> None:
        self.deltas.append(text)

    def reasoning(self, text: str, item_id: str | None = None) -> None:
        pass

    def tool_call(self, name: str, arguments: str, output: str) -> None:
        pass


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*PROXY_VARS, *(v.lower() for v in PROXY_VARS)):
        monkeypatch.delenv(name, raising=False)


def run(base_url: str, **limits: float) -> IO:
    io = IO()
    ResponsesModel(Endpoint(base_url, **limits)).run("hi", io)  # type: ignore[arg-type]
    return io


def test_an_http_model_is_reached_through_the_proxy_in_http_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ResponsesServer() as model, ForwardProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        io = run(model.base_url)
        assert io.texts == ["echo: hi"] and "".join(io.deltas) == "echo: hi"
        assert proxy.forwarded == [f"POST {model.base_url}/responses"]
        # NO_PROXY names the model's host: the request goes straight there.
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert run(model.base_url).texts == ["echo: hi"]
        assert len(proxy.forwarded) == 1 and len(model.requests) == 2


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ssl.SSLContext]]:
    """A CA of our own and a server certificate for 127.0.0.1 it signed (the openssl CLI)."""
    d = tmp_path_factory.mktemp("ca")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=30)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=agenthost test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text(
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\n"
        "authorityKeyIdentifier=keyid,issuer\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf",
    )  # fmt: skip
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(d / "srv.pem", d / "srv.key")
    yield d / "ca.pem", server


def test_an_https_model_is_reached_through_a_connect_tunnel_trusting_a_private_ca(
    monkeypatch: pytest.MonkeyPatch, private_ca: tuple[Path, ssl.SSLContext]
) -> None:
    ca, server_tls = private_ca
    with ResponsesServer(tls=server_tls) as model, ForwardProxy() as proxy:
        assert model.base_url.startswith("https://")
        # Without the CA the certificate is refused, in words, and the turn fails typed.
        with pytest.raises(ModelError) as refused:
            run(model.base_url)
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        io = run(model.base_url)
        assert io.texts == ["echo: hi"]
        assert proxy.tunnels == [f"127.0.0.1:{model.port}"]
        assert proxy.forwarded == []


def test_the_first_byte_and_the_stream_idle_limits_are_two_limits() -> None:
    with SilentServer() as silent:
        started = time.monotonic()
        with pytest.raises(ModelError) as nothing:
            run(silent.base_url, first_byte_timeout_s=0.5, read_timeout_s=30)
        assert time.monotonic() - started < 20
        assert "model_timeout" in str(nothing.value)
        assert "sent nothing within 0.5 s" in str(nothing.value)
    gate = threading.Event()
    with ResponsesServer(gate=gate, hold_after=4) as model:
        try:
            with pytest.raises(ModelError) as stalled:
                run(model.base_url, first_byte_timeout_s=30, read_timeout_s=0.5)
        finally:
            gate.set()
        assert "model_timeout" in str(stalled.value)
        assert "stopped answering for 0.5 s in the middle of its reply" in str(stalled.value)
        assert "model_stream_idle_seconds" in str(stalled.value)


def test_an_interrupt_wakes_a_read_blocked_on_a_silent_model() -> None:
    with SilentServer() as silent:
        io = IO()
        model = ResponsesModel(Endpoint(silent.base_url, first_byte_timeout_s=30))
        outcome: list[BaseException] = []

        def turn() -> None:
            try:
                model.run("hi", io)
            except BaseException as exc:  # noqa: BLE001
                outcome.append(exc)

        t = threading.Thread(target=turn)
        t.start()
        deadline = time.monotonic() + 10
        while silent.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert silent.accepted == 1
        time.sleep(0.2)  # the request is written and the read is blocked
        io.cancel()
        t.join(5)
        assert not t.is_alive(), "the interrupt did not wake the blocked read"
        assert len(outcome) == 1 and isinstance(outcome[0], TurnCancelled), outcome
