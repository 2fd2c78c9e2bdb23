"""The worker side: the worker process and its supervisor, and the provider drivers by provider
(the generic app-server driver in `drivers.app_server`, thin `drivers.tutti_agent` and
`drivers.codex` over it, `drivers.claude` by concern). Never imports `storage` or `actors`;
docs/design/drivers.md "Layout" gives each module's one concern."""
