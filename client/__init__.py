"""The client side of agenthost: what a person or a local program uses to talk to the daemon.

`client.engine` (the GUI's model of Sessions, mutations and their acknowledgements),
`client.session_client` (one-shot helpers the CLI and the demo share), `client.gui` (the
terminal GUI), `client.demo` (`make demo`), `client.lineage_view` (fork-tree wording).

The client speaks only the wire contract (`protocol` for its methods, events and envelope,
`transport.client`, `domain`); it never imports the daemon's composition root, its actors,
its store or its drivers (an import-linter contract in `make lint` holds it to that), so a
client process never loads SQLite.
"""
