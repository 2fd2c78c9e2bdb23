"""The defaults of the Claude Code CLIs started ahead of a Session's next Turn: the
`[providers.claude-code]` keys the daemon's config schema declares and the driver reads."""

from __future__ import annotations

DEFAULT_WARM_CLIS = 4
"""`warm_clis`: how many CLIs a worker keeps started ahead, at most (one a Session)."""
DEFAULT_WARM_IDLE_S = 300.0
"""`warm_idle_seconds`: how long a CLI started ahead waits for its Turn before it ends."""
