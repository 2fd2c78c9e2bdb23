"""A URL's user and password (`https://user:secret@host/v1`) kept out of every message, log line
and event: a configured `model_base_url` may hold them, and a message that names the endpoint
(a model failure, a provider's own error text) would otherwise carry the password to every
client and log reader. `***` stands for the user information; the rest of the URL is kept, so
the endpoint is still named."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["Redactor", "redact_url", "redact_userinfo"]

_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#@\"'<>]+@")
SHOWN = "***"
MIN_SECRET_CHARS = 6
"""A password shorter than this is not searched for alone (it would match ordinary words);
a URL holding it still loses its user information."""


def redact_userinfo(text: str) -> str:
    """`text` with every URL's user information replaced by `***`."""
    if "@" not in text:
        return text
    return _USERINFO.sub(rf"\g<1>{SHOWN}@", text)


def redact_url(url: str | None) -> str | None:
    """A URL as it may be shown (None stays None)."""
    return None if url is None else redact_userinfo(url)


def _secrets(url: str) -> list[str]:
    match = _USERINFO.match(url.strip())
    if match is None:
        return []
    userinfo = url.strip()[len(match.group(1)) : match.end() - 1]
    password = userinfo.split(":", 1)[1] if ":" in userinfo else ""
    out = [userinfo]
    if len(password) >= MIN_SECRET_CHARS:
        out.append(password)
    return out


class Redactor:
    """What one configuration's URLs hold that must not be shown: their user information and
    (a long one) the password alone, wherever a provider's own text puts them. Built once per
    process; `active` is false when no URL holds any, and then nothing is searched."""

    def __init__(self, urls: list[str]) -> None:
        self._secrets = sorted({s for url in urls for s in _secrets(url)}, key=len, reverse=True)
        self.active = bool(self._secrets)

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> Redactor:
        url = config.get("model_base_url")
        return cls([url] if isinstance(url, str) else [])

    def text(self, text: str) -> str:
        if not self.active:
            return text
        text = redact_userinfo(text)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, SHOWN)
        return text

    def value(self, value: Any) -> Any:
        """A wire value (dicts, lists, strings) with every string redacted; the same object
        when nothing in it needed it."""
        if not self.active:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out = {k: self.value(v) for k, v in value.items()}
            return value if all(out[k] is value[k] for k in value) else out
        if isinstance(value, list):
            items = [self.value(v) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value
