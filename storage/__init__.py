"""The canonical store of agenthost: an apsw (SQLite, WAL) file holding Sessions, their history
and the durable fork operations, with every write in one fenced transaction.

Public entry: `from storage import Store; store = Store.open(path)`; values are in
`storage.models`, typed errors in `domain.errors`.
"""

from domain.fork_states import ForkStatus
from storage.models import (
    ChangeEvent,
    ForkOperation,
    ForkOperationChanged,
    ForkPrepareRequest,
    Interaction,
    Lineage,
    Message,
    ProviderForkEvidence,
    Session,
    SessionChanged,
    Turn,
    TurnChanged,
)
from storage.store import Store

__all__ = [
    "ChangeEvent",
    "ForkOperation",
    "ForkOperationChanged",
    "ForkPrepareRequest",
    "ForkStatus",
    "Interaction",
    "Lineage",
    "Message",
    "ProviderForkEvidence",
    "Session",
    "SessionChanged",
    "Store",
    "Turn",
    "TurnChanged",
]
