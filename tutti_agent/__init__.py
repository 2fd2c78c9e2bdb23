"""Tutti Agent: our own app-server provider, speaking the Codex app-server protocol on stdio.

It owns threads, turns and rollouts under TUTTI_AGENT_HOME and implements the thread-fork
semantics of seed 004 (snapshots, named boundaries, Copied/Referenced persistence)."""

__version__ = "0.1.0"
