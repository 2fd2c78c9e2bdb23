"""The environment a worker is started with, as both ends name it: the host's spawn
(`drivers.worker_spawn`) sets these variables and the worker's main (`drivers.worker`) reads
them. Its own module so the host's side names them without loading the worker's code."""

from __future__ import annotations

ENV_PROVIDER_CONFIG = "AGENTHOST_PROVIDER_CONFIG"
"""The provider's configuration, a JSON object."""
ENV_PARENT_PID = "AGENTHOST_WORKER_PARENT_PID"
"""The daemon's pid: the worker ends when that process does."""
