"""Request bodies as a real client sends them."""

from __future__ import annotations

import gzip
import zlib


def decode_body(raw: bytes, content_encoding: str | None) -> bytes:
    """Undoes an HTTP `Content-Encoding` (identity, gzip, deflate, zstd) on a request body.

    Codex compresses request bodies with zstd for some providers; an encoding we cannot
    decode raises so the caller fails loudly instead of seeing an empty conversation.
    """
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return raw
    if enc == "gzip":
        return gzip.decompress(raw)
    if enc == "deflate":
        return zlib.decompress(raw)
    if enc == "zstd":
        import zstandard  # only needed when a client really sends zstd

        decoded: bytes = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        return decoded
    raise ValueError(f"unsupported Content-Encoding: {content_encoding}")
