"""agenthost: the daemon's composition root — config, home, keys, daemon wiring, API table, and the
`agenthost` command's entry (`agenthost.cli`: `serve` and `keys` added to `client.cli`'s parser).
"""

__version__ = "0.1.0"
