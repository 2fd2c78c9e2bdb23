"""A URL's user and password are taken out of text and wire values wherever they occur: the
URL whole (its user information becomes `***`, the host is kept), and a long password alone
(a provider's own words may quote it without the URL)."""

from __future__ import annotations

from domain.redaction import Redactor, redact_url, redact_userinfo
from tutti_agent.model import shown_url

URL = "https://agent:hunter2-S3cr3t@models.example:8443/v1"


def test_a_url_keeps_its_host_and_loses_its_user_information() -> None:
    assert redact_url(URL) == "https://***@models.example:8443/v1"
    assert shown_url(URL) == "https://***@models.example:8443/v1"
    assert redact_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"
    assert redact_url(None) is None
    text = f"error sending request for url ({URL}/responses): refused; mail a@b.example"
    assert redact_userinfo(text) == (
        "error sending request for url (https://***@models.example:8443/v1/responses): "
        "refused; mail a@b.example"
    )


def test_a_configured_password_is_taken_out_of_every_string_of_a_wire_value() -> None:
    redactor = Redactor.of_config({"model_base_url": URL})
    assert redactor.active
    wire = {
        "error": f"model_unreachable: endpoint {URL} is unreachable",
        "items": [{"text": "the proxy said: bad password hunter2-S3cr3t"}, 7, None],
    }
    out = redactor.value(wire)
    assert "hunter2-S3cr3t" not in repr(out)
    assert out["error"] == (
        "model_unreachable: endpoint https://***@models.example:8443/v1 is unreachable"
    )
    assert out["items"][0]["text"] == "the proxy said: bad password ***"
    assert out["items"][1:] == [7, None]
    plain = {"error": "x"}
    assert Redactor.of_config({"model_base_url": "http://127.0.0.1:9/v1"}).value(plain) is plain
    assert not Redactor.of_config({}).active
