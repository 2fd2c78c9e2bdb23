"""The Codex provider: the thin Codex driver over the generic app-server driver (import a
name from the module that defines it):

- `command`: which `codex` program an app-server runs (pinned install, npm shim → native).
- `config`: a Codex home's generated `config.toml` and the Session settings it carries.
- `lineage`: a fork child's recorded source and its Referenced rollout ancestors.
- `driver`: `CodexProvider`, the Codex side of the app-server driver (`create_driver` is what
  the worker loads).
"""
