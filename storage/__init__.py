"""The canonical store of agenthost: an apsw (SQLite, WAL) file holding Sessions, their history
and the durable fork operations, with every write in one fenced transaction.

Public entry: `from storage.store import Store; store = Store.open(path)`; values are in
`storage.models`, typed errors in `domain.errors`.
"""
