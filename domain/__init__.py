"""The domain's words, standard library only: the error vocabulary with one code → status
table (`domain.errors`), the enums shared by the store, the actors and the drivers
(`domain.enums`), the provider list (`domain.providers`) and the fork state machine as data
(`domain.fork_states`).

Every other package may import this one; it imports nothing of ours (an import-linter contract
in `make lint`), so a client, the wire spec or a driver worker never loads SQLite through it.
"""
