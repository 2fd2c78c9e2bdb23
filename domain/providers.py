"""The provider kinds agenthost knows, in the order the CLI and the catalog list them."""

from __future__ import annotations

TUTTI_AGENT = "tutti-agent"
CODEX = "codex"
CLAUDE_CODE = "claude-code"

PROVIDERS: tuple[str, ...] = (TUTTI_AGENT, CODEX, CLAUDE_CODE)
"""Every provider kind (config keys, `--provider` choices, catalog entries)."""
