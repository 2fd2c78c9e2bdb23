"""The client Engine: the single source of truth for fork mutations (seed 000 §8.3, §9) on top of
the transport client, plus the client-side session cache the GUI and CLI read.

It allocates and reuses request/target identities, reconciles accepted operations through
`fork.get` and `fork.operation` events, adopts the durable identity the daemon returns, and sends
the client-observed ACK with a deadline and capped backoff on an injectable scheduler.

`Engine` (`lifecycle`) is one object that owns its parts, one concern and module each:
`changes` (the one lock, the change outbox, listeners), `calls` (requests in the workspace),
`records` (fork mutations and their bookkeeping), `cache` (sessions), `unknown` (the
`unknown` operations seen), `acks` (the ACK state machine), `reconcile` (events, polls and
adoption merged into records), `forks` (fork, fork_latest, resolve); `values` and `ports`
hold the records, statuses and the edges to the outside. Import each name from the module
that defines it (`client.engine.lifecycle.Engine`, `client.engine.values.MutationStatus`).
"""
