"""agenthost: the composition root — config, daemon wiring, CLI, client Engine and GUI."""

__version__ = "0.1.0"
