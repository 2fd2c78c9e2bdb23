"""Shared test support: the daemon harness, provider fixtures and fake model servers.

The model servers are the only fakes the suite allows; everything else (providers, SQLite,
sockets, subprocesses) is real. The Responses API fake and the HTTP plumbing every fake shares
live in the installed `model_fakes` package (the demo uses them too).
"""

from __future__ import annotations

from model_fakes.bodies import decode_body

__all__ = ["decode_body"]
