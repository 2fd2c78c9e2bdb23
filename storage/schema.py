"""The store's SQL schema as an ordered list of migrations keyed by `PRAGMA user_version`.

Version N is reached by applying MIGRATIONS[0:N] in order inside one `BEGIN IMMEDIATE`
transaction; v1 is the foundation (sessions, turns, ...), v2 adds the fork contract, v3 an
index, v4 `abandoned` and `fork_resolutions`, v5 moves the frozen snapshot to a table of its own,
v6 an index of unbound Turns, v7 keys `messages` by an integer per Session, v8 indexes the
fork tree by source, v9 adds each Turn's workspace checkpoint record, v10 a fork's workspace,
v11 indexes what every start reads (the active Turns, the deleted Sessions), v12 the history
link of a fork child that reads its cloned Messages from its source's rows, v13 the fence's
witness: a fenced source's history rows counted as SQLite changes them, so the commit proves
the boundary unchanged without re-reading it; v14–v16 CHECKs and indexes; v17 the boundary
digests prepare kept, each deleted by SQLite with the first change of its Session's history;
v18 a Session row's version, one more at every change of the row; v19–v20 the fork status's
indexes and comparisons; v21 three indexes a query no longer needs, each a WAL frame per fork;
v22–v23 the barrier and the stage as columns; v24 a Turn the provider never got; v25 a
Session's real cwd and a deleted fork child's tree path, indexed; v26 that real cwd filled for
the Sessions from before v25; v27 a fork that ended without a child drops its frozen snapshot.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import apsw

from domain.errors import SchemaTooNew

# v1: canonical entities. Never edit a released migration: add a new one.
_V1 = """
CREATE TABLE workspaces (
    workspace_id   TEXT PRIMARY KEY,
    created_at_ms  INTEGER NOT NULL
);

CREATE TABLE sessions (
    workspace_id          TEXT NOT NULL REFERENCES workspaces(workspace_id),
    session_id            TEXT NOT NULL,
    kind                  TEXT NOT NULL CHECK (kind IN ('root', 'child')),
    provider              TEXT NOT NULL,
    provider_session_id   TEXT,
    title                 TEXT NOT NULL,
    cwd                   TEXT NOT NULL,
    settings_json         TEXT NOT NULL,
    runtime_context_json  TEXT NOT NULL,
    model                 TEXT,
    pinned                INTEGER NOT NULL DEFAULT 0,
    deleted               INTEGER NOT NULL DEFAULT 0,
    goal                  TEXT,
    parent_session_id     TEXT,
    parent_turn_id        TEXT,
    rail_placement        TEXT,
    visibility            TEXT NOT NULL DEFAULT 'visible',
    created_at_ms         INTEGER NOT NULL,
    updated_at_ms         INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, session_id)
);
CREATE INDEX sessions_by_created ON sessions (workspace_id, deleted, created_at_ms, session_id);

CREATE TABLE turns (
    workspace_id                TEXT NOT NULL,
    session_id                  TEXT NOT NULL,
    turn_id                     TEXT NOT NULL,
    sequence                    INTEGER NOT NULL,
    sequence_provenance         TEXT NOT NULL,
    phase                       TEXT NOT NULL CHECK (phase IN ('active', 'settled')),
    outcome                     TEXT CHECK (outcome IN ('completed', 'interrupted', 'failed')),
    root_provider_turn_id       TEXT,
    provider_turn_binding_json  TEXT,
    final_assistant_message_id  TEXT,
    error                       TEXT,
    created_at_ms               INTEGER NOT NULL,
    settled_at_ms               INTEGER,
    PRIMARY KEY (workspace_id, session_id, turn_id),
    UNIQUE (workspace_id, session_id, sequence),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions(workspace_id, session_id)
);
CREATE INDEX turns_by_phase ON turns (workspace_id, session_id, phase);

CREATE TABLE messages (
    workspace_id   TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    message_id     TEXT NOT NULL,
    turn_id        TEXT,
    kind           TEXT NOT NULL,
    text           TEXT,
    payload_json   TEXT NOT NULL,
    version        INTEGER NOT NULL DEFAULT 1,
    position       INTEGER NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, session_id, message_id),
    UNIQUE (workspace_id, session_id, position),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions(workspace_id, session_id),
    FOREIGN KEY (workspace_id, session_id, turn_id)
        REFERENCES turns(workspace_id, session_id, turn_id)
);
CREATE INDEX messages_by_turn ON messages (workspace_id, session_id, turn_id, position);

CREATE TABLE interactions (
    workspace_id     TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    interaction_id   TEXT NOT NULL,
    request_id       TEXT NOT NULL,
    turn_id          TEXT NOT NULL,
    kind             TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('pending', 'resolved', 'superseded')),
    input_json       TEXT NOT NULL,
    output_json      TEXT,
    created_at_ms    INTEGER NOT NULL,
    resolved_at_ms   INTEGER,
    PRIMARY KEY (workspace_id, session_id, interaction_id),
    UNIQUE (workspace_id, session_id, turn_id, request_id),
    FOREIGN KEY (workspace_id, session_id, turn_id)
        REFERENCES turns(workspace_id, session_id, turn_id)
);
CREATE INDEX interactions_by_status ON interactions (workspace_id, session_id, status);

CREATE TABLE goal_controls (
    workspace_id    TEXT NOT NULL,
    session_id      TEXT NOT NULL,
    control_id      TEXT NOT NULL,
    action          TEXT NOT NULL CHECK (action IN ('set', 'clear')),
    goal            TEXT,
    status          TEXT NOT NULL CHECK (status IN ('active', 'finished')),
    created_at_ms   INTEGER NOT NULL,
    finished_at_ms  INTEGER,
    PRIMARY KEY (workspace_id, control_id),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions(workspace_id, session_id)
);
CREATE INDEX goal_controls_active ON goal_controls (workspace_id, session_id, status);

CREATE TABLE runtime_operations (
    workspace_id    TEXT NOT NULL,
    session_id      TEXT NOT NULL,
    operation_id    TEXT NOT NULL,
    kind            TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('active', 'finished')),
    created_at_ms   INTEGER NOT NULL,
    finished_at_ms  INTEGER,
    PRIMARY KEY (workspace_id, operation_id),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions(workspace_id, session_id)
);
CREATE INDEX runtime_operations_active ON runtime_operations (workspace_id, session_id, status);

CREATE TABLE submit_claims (
    workspace_id    TEXT NOT NULL,
    session_id      TEXT NOT NULL,
    request_id      TEXT NOT NULL,
    turn_id         TEXT NOT NULL,
    text            TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('active', 'finished')),
    created_at_ms   INTEGER NOT NULL,
    finished_at_ms  INTEGER,
    PRIMARY KEY (workspace_id, session_id, request_id),
    FOREIGN KEY (workspace_id, session_id, turn_id)
        REFERENCES turns(workspace_id, session_id, turn_id)
);
CREATE INDEX submit_claims_active ON submit_claims (workspace_id, session_id, status);
"""

# v2: the fork contract. The operation row *is* the source fence (law 3).
_V2 = """
CREATE TABLE fork_operations (
    op_seq                       INTEGER PRIMARY KEY,  -- stable recovery cursor
    workspace_id                 TEXT NOT NULL REFERENCES workspaces(workspace_id),
    operation_id                 TEXT NOT NULL,
    request_id                   TEXT NOT NULL,
    request_hash                 TEXT NOT NULL,
    source_session_id            TEXT NOT NULL,
    target_session_id            TEXT NOT NULL,
    point_kind                   TEXT NOT NULL DEFAULT 'through_turn',
    source_turn_id               TEXT NOT NULL,
    source_provider_session_id   TEXT NOT NULL,
    source_provider_turn_id      TEXT NOT NULL,
    source_provider_turn_ids     TEXT NOT NULL,  -- JSON array, the frozen ordered prefix
    target_title                 TEXT NOT NULL,
    target_provider_session_id   TEXT,
    target_provider_turn_ids     TEXT,           -- JSON array
    target_turn_bindings         TEXT,           -- JSON {source turn id: [root id, json]}
    target_turn_id               TEXT,
    driver_kind                  TEXT NOT NULL,
    driver_version               TEXT NOT NULL,
    binding_mode                 TEXT NOT NULL,
    binding_receipt              TEXT,           -- JSON
    snapshot_json                TEXT NOT NULL,
    snapshot_hash                TEXT NOT NULL,
    status                       TEXT NOT NULL CHECK (status IN ('prepared', 'dispatching',
                                   'provider_accepted', 'committed', 'failed', 'unknown')),
    error                        TEXT,
    created_at_ms                INTEGER NOT NULL,
    dispatched_at_ms             INTEGER,
    accepted_at_ms               INTEGER,
    completed_at_ms              INTEGER,
    client_observed_at_ms        INTEGER,
    UNIQUE (workspace_id, operation_id),
    UNIQUE (workspace_id, request_id),
    FOREIGN KEY (workspace_id, source_session_id) REFERENCES sessions(workspace_id, session_id)
);
CREATE INDEX fork_operations_by_source
    ON fork_operations (workspace_id, source_session_id, status);
CREATE INDEX fork_operations_barrier
    ON fork_operations (workspace_id, source_session_id, point_kind, source_turn_id, status);
CREATE INDEX fork_operations_recoverable ON fork_operations (status, op_seq);

-- A target id is reserved at prepare and released only when its operation fails.
CREATE TABLE session_reservations (
    workspace_id   TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    operation_id   TEXT NOT NULL,
    PRIMARY KEY (workspace_id, session_id),
    FOREIGN KEY (workspace_id, operation_id) REFERENCES fork_operations(workspace_id, operation_id)
);

CREATE TABLE fork_lineage (
    workspace_id        TEXT NOT NULL,
    target_session_id   TEXT NOT NULL,
    source_session_id   TEXT NOT NULL,
    source_turn_id      TEXT NOT NULL,
    target_turn_id      TEXT NOT NULL,
    operation_id        TEXT NOT NULL,
    forked_at_ms        INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, target_session_id),
    FOREIGN KEY (workspace_id, operation_id) REFERENCES fork_operations(workspace_id, operation_id)
);
"""

# v3: the reservation's foreign key and its release look rows up by operation; without an
# index every transition of an operation scanned the whole table (quadratic recovery).
_V3 = """
CREATE INDEX session_reservations_by_operation ON session_reservations (workspace_id, operation_id);
"""


def _edit_tables(conn: apsw.Connection, edits: tuple[tuple[str, str, str], ...]) -> None:
    """Replace text in the CREATE TABLE statements of `edits` (table, old text, new text).

    SQLite cannot ALTER a CHECK; an edit that changes no stored row's validity (a CHECK widened,
    or restated equal) is the documented writable_schema edit, with a schema_version bump so
    every connection reloads the schema."""
    row = conn.execute("PRAGMA schema_version").fetchone()
    assert row is not None
    version = int(row[0])
    conn.execute("PRAGMA writable_schema = ON")
    for table, old, new in edits:
        conn.execute(
            "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE type = 'table' AND name = ?",
            (old, new, table),
        )
    conn.execute(f"PRAGMA schema_version = {version + 1}")
    conn.execute("PRAGMA writable_schema = OFF")


def _v4(conn: apsw.Connection) -> None:
    """v4: the terminal status `abandoned` and the durable `fork.resolve` record."""
    _edit_tables(
        conn, (("fork_operations", "'failed', 'unknown')", "'failed', 'unknown', 'abandoned')"),)
    )
    conn.execute(_V4_RESOLUTIONS)


# One row per resolved operation: the winning request, its action and where it got to.
_V4_RESOLUTIONS = """
CREATE TABLE fork_resolutions (
    workspace_id    TEXT NOT NULL,
    operation_id    TEXT NOT NULL,
    request_id      TEXT NOT NULL,
    action          TEXT NOT NULL CHECK (action IN ('adopt', 'abandon')),
    state           TEXT NOT NULL CHECK (state IN ('started', 'done', 'rolled_back')),
    child_id        TEXT,
    evidence_json   TEXT,
    result_json     TEXT,
    created_at_ms   INTEGER NOT NULL,
    updated_at_ms   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, operation_id),
    FOREIGN KEY (workspace_id, operation_id) REFERENCES fork_operations(workspace_id, operation_id)
);
CREATE INDEX fork_resolutions_by_state ON fork_resolutions (state);
"""

# v5: the frozen snapshot in a table of its own, one row per operation written once
# at prepare and only read after. On the operation row, every status UPDATE (dispatching,
# provider_accepted, committed, the ACK) rewrote the whole row: a 1,000-Turn snapshot is
# ~2.5 MB, so each transition put 2.5 MB into the WAL and through its fsync. Existing rows move
# over unchanged (same bytes, so their frozen hash still verifies); the column is then dropped
# (SQLite >= 3.35 rewrites the table without it).
_V5 = """
CREATE TABLE fork_snapshots (
    op_seq         INTEGER PRIMARY KEY REFERENCES fork_operations(op_seq),
    snapshot_json  TEXT NOT NULL
);
INSERT INTO fork_snapshots (op_seq, snapshot_json)
    SELECT op_seq, snapshot_json FROM fork_operations ORDER BY op_seq;
ALTER TABLE fork_operations DROP COLUMN snapshot_json;
"""

# v6: the settled, completed Turns no provider binding was recorded for
# (`TurnStore.turns_missing_binding`, then asked after every runtime start, once per Turn). With
# only `turns_by_phase` SQLite read every settled Turn of the Session to find none (0.15 ms of
# CPU per Turn at 300 Turns, 1 ms at 1,500); this partial index holds only those rows.
_V6 = """
CREATE INDEX turns_unbound ON turns (workspace_id, session_id, sequence)
    WHERE phase = 'settled' AND outcome = 'completed' AND root_provider_turn_id IS NULL;
"""

# v7: `messages` keyed by an integer per Session instead of its two text ids.
# Each of the table's three keys (by id, by position, by Turn) repeated the workspace and Session
# ids (a Session id alone is 36 characters) in every entry, compared on every insert; a fork's
# 10,000-Message child is the table's largest write. `session_keys` gives every Session a
# stable integer (an INTEGER PRIMARY KEY: VACUUM keeps it), filled by a trigger when the Session
# is inserted;
# `messages` keeps its text ids (its foreign keys and every reader use them) and adds
# `session_key`, which its keys lead with. A query names the key with `SESSION_KEY_OF` (the same
# two parameters, workspace then Session, that it bound before). The rebuild copies every row
# as it is, in rowid order.
_V7 = """
CREATE TABLE session_keys (
    session_key    INTEGER PRIMARY KEY,
    workspace_id   TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    UNIQUE (workspace_id, session_id)
);
INSERT INTO session_keys (workspace_id, session_id)
    SELECT workspace_id, session_id FROM sessions ORDER BY rowid;
CREATE TRIGGER session_keys_of_new_sessions AFTER INSERT ON sessions BEGIN
    INSERT INTO session_keys (workspace_id, session_id) VALUES (NEW.workspace_id, NEW.session_id);
END;

CREATE TABLE messages_v7 (
    workspace_id   TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    message_id     TEXT NOT NULL,
    turn_id        TEXT,
    kind           TEXT NOT NULL,
    text           TEXT,
    payload_json   TEXT NOT NULL,
    version        INTEGER NOT NULL DEFAULT 1,
    position       INTEGER NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    session_key    INTEGER NOT NULL,
    PRIMARY KEY (session_key, message_id),
    UNIQUE (session_key, position),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions(workspace_id, session_id),
    FOREIGN KEY (workspace_id, session_id, turn_id)
        REFERENCES turns(workspace_id, session_id, turn_id)
);
INSERT INTO messages_v7
    SELECT m.workspace_id, m.session_id, m.message_id, m.turn_id, m.kind, m.text,
        m.payload_json, m.version, m.position, m.created_at_ms, k.session_key
    FROM messages m JOIN session_keys k USING (workspace_id, session_id) ORDER BY m.rowid;
DROP TABLE messages;
ALTER TABLE messages_v7 RENAME TO messages;
CREATE INDEX messages_by_turn ON messages (session_key, turn_id, position);
"""

SESSION_KEY_OF = "(SELECT session_key FROM session_keys WHERE workspace_id = ? AND session_id = ?)"
"""The integer key of the Session `(workspace, Session)` names (schema v7): what a `messages`
query compares `session_key` with, binding the two ids it bound before."""

# v8: a Session's fork children are read by source (`session.lineage`, one query per level of
# the tree); without an index each read scanned every lineage row of the store, per node.
_V8 = """
CREATE INDEX fork_lineage_by_source ON fork_lineage (workspace_id, source_session_id);
"""

# v9: the workspace checkpoint record of a Turn (docs/design/workspace.md): JSON, its `before`
# and `after` trees in the shadow store, the files it changed, or why there is none. NULL on
# Turns settled before checkpoints existed and on a fork child's cloned Turns.
_V9 = """
ALTER TABLE turns ADD COLUMN checkpoint_json TEXT;
"""


def _v10(conn: apsw.Connection) -> None:
    """v10: a fork's workspace on its operation — `workspace_mode` (`shared`/`worktree`, NULL
    for rows before it: shared), the tree's plan frozen at prepare (`workspace_json`) and its
    state (`planned` → `made` before dispatch, or `removed` when the fork failed). The prepare
    reads the fork Turn's checkpoint record from `turns.checkpoint_json` (v9)."""
    for column in ("workspace_mode TEXT", "workspace_json TEXT", "workspace_state TEXT"):
        conn.execute(f"ALTER TABLE fork_operations ADD COLUMN {column}")
    conn.execute(
        "CREATE INDEX fork_operations_worktrees ON fork_operations (status, workspace_state)"
        " WHERE workspace_state IS NOT NULL"
    )


# v11: every start settles the Turns a previous process left active (`all_active_turns`)
# and sweeps the runtimes of deleted Sessions (`deleted_sessions`); with no index that leads
# with the phase or the flag, each walked every Turn / every Session of the store (a million
# Turns on a store of months: seconds at each start). These hold only those rows: a start
# reads as many as there are orphans and deleted Sessions.
_V11 = """
CREATE INDEX turns_active ON turns (workspace_id, session_id, sequence) WHERE phase = 'active';
CREATE INDEX sessions_deleted ON sessions (workspace_id, session_id) WHERE deleted = 1;
"""


# v12: a fork child's history link (docs/design/store.md, "The history link"). The child does not
# copy the boundary's Messages: it reads them from its source's rows, the source's Turns 1..
# `through_sequence` and their Messages at or below `through_position`, each seen with the id
# rule v2 gives it in the child (`message_prefix` + position, `turn_prefix` + the Turn's
# sequence) and created at `linked_at_ms`; the child's own row at a position wins over the
# linked one (the payloads prepare rewrote, a linked row changed in the child). A source that is
# itself a child is read through its own link (chains). The triggers keep a linked row frozen:
# it may change or go only once every child linking it holds its own row at its position
# (storage/history_links.py writes those first); any other change is refused by SQLite.
_LINKED = (
    "EXISTS (SELECT 1 FROM history_links l WHERE l.source_key = OLD.session_key"
    " AND l.through_position >= OLD.position AND l.through_sequence >= (SELECT t.sequence"
    " FROM turns t WHERE t.workspace_id = OLD.workspace_id AND t.session_id = OLD.session_id"
    " AND t.turn_id = OLD.turn_id) AND NOT EXISTS (SELECT 1 FROM messages c"
    " WHERE c.session_key = l.child_key AND c.position = OLD.position))"
)
_V12 = f"""
CREATE TABLE history_links (
    child_key         INTEGER PRIMARY KEY,
    source_key        INTEGER NOT NULL,
    through_sequence  INTEGER NOT NULL,
    through_position  INTEGER NOT NULL,
    message_prefix    TEXT NOT NULL,
    turn_prefix       TEXT NOT NULL,
    linked_at_ms      INTEGER NOT NULL
);
CREATE INDEX history_links_by_source ON history_links (source_key, through_position);
CREATE TRIGGER messages_linked_frozen BEFORE UPDATE ON messages WHEN {_LINKED}
BEGIN SELECT RAISE(ABORT, 'a Message a fork child links to is frozen'); END;
CREATE TRIGGER messages_linked_kept BEFORE DELETE ON messages WHEN {_LINKED}
BEGIN SELECT RAISE(ABORT, 'a Message a fork child links to is kept'); END;
"""


# v13: the fence's witness (docs/design/store.md, "The fence's witness"). Prepare writes one row
# per fenced source (its Session key, the operation, `changes` 0) in its transaction; from then
# on every insert, update or delete of one of that Session's Messages, and every change of one of
# its Turns' identity (id, Session, sequence: which Messages a boundary holds) or removal, adds 1
# to `changes` — whatever the writer, a store path or raw SQL behind the daemon's back. The
# commit reads the one row: 0 proves the source's boundary is what prepare digested without
# re-reading it. The row goes when its operation leaves the active states (committed, failed,
# unknown, abandoned). Every other Session's write pays one probe of this (nearly empty) table.
# A probe by `=` (one key each): an `IN (…)` list costs the insert of every Message ~1 µs more.
_FENCED_MESSAGES = "EXISTS (SELECT 1 FROM history_fences WHERE session_key = {key})"
_FENCED_TURN = (
    "EXISTS (SELECT 1 FROM session_keys k JOIN history_fences f ON f.session_key = k.session_key"
    " WHERE k.workspace_id = {row}.workspace_id AND k.session_id = {row}.session_id)"
)
_COUNT_TURN = (
    "UPDATE history_fences SET changes = changes + 1 WHERE session_key IN (SELECT session_key"
    " FROM session_keys WHERE workspace_id = {row}.workspace_id AND session_id = {row}.session_id)"
)
_V13 = f"""
CREATE TABLE history_fences (
    session_key  INTEGER PRIMARY KEY,
    op_seq       INTEGER NOT NULL,
    changes      INTEGER NOT NULL DEFAULT 0
);
CREATE TRIGGER messages_fenced_insert AFTER INSERT ON messages
WHEN {_FENCED_MESSAGES.format(key="NEW.session_key")}
BEGIN UPDATE history_fences SET changes = changes + 1 WHERE session_key = NEW.session_key; END;
CREATE TRIGGER messages_fenced_update AFTER UPDATE ON messages
WHEN {_FENCED_MESSAGES.format(key="OLD.session_key")}
OR {_FENCED_MESSAGES.format(key="NEW.session_key")}
BEGIN UPDATE history_fences SET changes = changes + 1
WHERE session_key = OLD.session_key OR session_key = NEW.session_key; END;
CREATE TRIGGER messages_fenced_delete AFTER DELETE ON messages
WHEN {_FENCED_MESSAGES.format(key="OLD.session_key")}
BEGIN UPDATE history_fences SET changes = changes + 1 WHERE session_key = OLD.session_key; END;
CREATE TRIGGER turns_fenced_update AFTER UPDATE OF workspace_id, session_id, turn_id, sequence
ON turns WHEN {_FENCED_TURN.format(row="OLD")} OR {_FENCED_TURN.format(row="NEW")}
BEGIN {_COUNT_TURN.format(row="OLD")}; {_COUNT_TURN.format(row="NEW")}; END;
CREATE TRIGGER turns_fenced_delete AFTER DELETE ON turns WHEN {_FENCED_TURN.format(row="OLD")}
BEGIN {_COUNT_TURN.format(row="OLD")}; END;
CREATE TRIGGER history_fences_released AFTER UPDATE OF status ON fork_operations
WHEN NEW.status NOT IN ('prepared', 'dispatching', 'provider_accepted')
BEGIN DELETE FROM history_fences WHERE op_seq = NEW.op_seq; END;
"""

# v14: the CHECKs of `turns.outcome` and `interactions.status` restated as comparisons. SQLite
# tests `x IN (a, b, c)` — a list of more than two constants — by building an ephemeral index of
# the list, once per run of a statement: every insert of a Turn, every update of its outcome (and
# of an Interaction's status) built, filled and freed a B-tree for it (~25 % of the 1,000 Turn
# inserts of a big fork's commit). `x = a OR x = b OR x = c` accepts and refuses exactly the same
# values (a NULL outcome still passes: NULL OR NULL is not false), with no such tree.
TURN_OUTCOME_CHECK = (
    "CHECK (outcome IN ('completed', 'interrupted', 'failed'))",
    "CHECK (outcome = 'completed' OR outcome = 'interrupted' OR outcome = 'failed')",
)
INTERACTION_STATUS_CHECK = (
    "CHECK (status IN ('pending', 'resolved', 'superseded'))",
    "CHECK (status = 'pending' OR status = 'resolved' OR status = 'superseded')",
)


def _v14(conn: apsw.Connection) -> None:
    _edit_tables(
        conn, (("turns", *TURN_OUTCOME_CHECK), ("interactions", *INTERACTION_STATUS_CHECK))
    )


# v15: `history_fences` by operation. `history_fences_released` deletes an operation's row by
# `op_seq` each time an operation leaves the active statuses; without this index each such
# delete read the whole table, so releasing n fences (recovery's set-based status changes of
# thousands of interrupted operations) took n × n row visits.
_V15 = "CREATE INDEX history_fences_by_op ON history_fences(op_seq);"

# v16: the boundary barrier through its own rows. Every prepare asks which operation holds
# `source + Turn` (`storage/fork_prepare.py`: `barrier_holder`); with only
# `fork_operations_by_source` SQLite read every operation the source ever had and sorted
# them, so a source's n-th fork paid for the n - 1 before it. The partial index holds only
# the rows the barrier rule selects (active, `unknown`, committed and not ACKed: a handful
# per source), its WHERE the rule's SQL text exactly (`domain.fork_states.BARRIER_SQL`, which
# the query repeats, so the planner may use it). `fork_operations_barrier` (point kind before
# Turn: no query constrains the kind) is dropped: one index fewer on every status change.
_V16 = (
    "CREATE INDEX IF NOT EXISTS fork_operations_barrier_held"
    " ON fork_operations (workspace_id, source_session_id, source_turn_id, op_seq)"
    " WHERE (status IN ('prepared', 'dispatching', 'provider_accepted', 'unknown')"
    " OR (status = 'committed' AND client_observed_at_ms IS NULL));"
    " DROP INDEX IF EXISTS fork_operations_barrier;"
)

# v17: the boundary digests prepare kept (docs/design/store.md, "The kept digest"). Prepare of a
# fork digests its boundary's Messages (100,000 of them for a 10,000-Turn Session, most of a warm
# fork's daemon CPU); a row here keeps that digest, the count and highest position beside it and
# the positions of the Messages prepare must look at, for the Session's Turns through `through`
# (and whether it had later Turns then: which rows the statement reads). It is valid for as long
# as it exists: every insert, update or delete of one of the Session's Messages, every change of
# one of its Turns' identity (workspace, Session, id, sequence) or removal, and any change of
# its `session_keys` row deletes the Session's rows — whoever writes, a store path or raw SQL
# behind the daemon's back — in the writer's own transaction, so a row never outlives a change it
# did not see and a rolled-back prepare takes its row with it. Like the witness's, each write of
# a Message pays one probe of this (small) table by `=`; nothing is stored per Session until a
# fork of it, so the migration writes no row (a store of 100,000 Sessions migrates in O(1)).
_DIGEST_KEPT = "EXISTS (SELECT 1 FROM history_digests WHERE session_key = {key})"
_DIGEST_TURN = (
    "EXISTS (SELECT 1 FROM session_keys k JOIN history_digests d ON d.session_key = k.session_key"
    " WHERE k.workspace_id = {row}.workspace_id AND k.session_id = {row}.session_id)"
)
_DROP_TURN = (
    "DELETE FROM history_digests WHERE session_key IN (SELECT session_key FROM session_keys"
    " WHERE workspace_id = {row}.workspace_id AND session_id = {row}.session_id)"
)
_V17 = f"""
CREATE TABLE history_digests (
    session_key  INTEGER NOT NULL,
    through      INTEGER NOT NULL,
    later        INTEGER NOT NULL,
    count        INTEGER NOT NULL,
    digest       TEXT NOT NULL,
    top          INTEGER NOT NULL,
    special      TEXT NOT NULL,
    PRIMARY KEY (session_key, through)
) WITHOUT ROWID;
CREATE TRIGGER messages_digest_insert AFTER INSERT ON messages
WHEN {_DIGEST_KEPT.format(key="NEW.session_key")}
BEGIN DELETE FROM history_digests WHERE session_key = NEW.session_key; END;
CREATE TRIGGER messages_digest_update AFTER UPDATE ON messages
WHEN {_DIGEST_KEPT.format(key="OLD.session_key")}
OR {_DIGEST_KEPT.format(key="NEW.session_key")}
BEGIN DELETE FROM history_digests
WHERE session_key = OLD.session_key OR session_key = NEW.session_key; END;
CREATE TRIGGER messages_digest_delete AFTER DELETE ON messages
WHEN {_DIGEST_KEPT.format(key="OLD.session_key")}
BEGIN DELETE FROM history_digests WHERE session_key = OLD.session_key; END;
CREATE TRIGGER turns_digest_update AFTER UPDATE OF workspace_id, session_id, turn_id, sequence
ON turns WHEN {_DIGEST_TURN.format(row="OLD")} OR {_DIGEST_TURN.format(row="NEW")}
BEGIN {_DROP_TURN.format(row="OLD")}; {_DROP_TURN.format(row="NEW")}; END;
CREATE TRIGGER turns_digest_delete AFTER DELETE ON turns WHEN {_DIGEST_TURN.format(row="OLD")}
BEGIN {_DROP_TURN.format(row="OLD")}; END;
CREATE TRIGGER session_keys_digest_update AFTER UPDATE ON session_keys
BEGIN DELETE FROM history_digests
WHERE session_key = OLD.session_key OR session_key = NEW.session_key; END;
CREATE TRIGGER session_keys_digest_delete AFTER DELETE ON session_keys
BEGIN DELETE FROM history_digests WHERE session_key = OLD.session_key; END;
"""

# v18: a Session row's version (docs/design/store.md, "A Turn's Session events carried"). A Turn's
# claim and settlement change only their Session's `updated_at_ms` and active Turn; their event
# carries that change and the version it left, and the events thread builds the row from the one
# it holds at the version before, without reading it back. So every change of what the row shows
# moves the version: a `touch` sets it (version + 1, returned), and any other UPDATE of the row
# — a store path or raw SQL behind the daemon's back — is moved by the trigger in the writer's
# own transaction. The column's default fills every existing row in O(1) (no row is rewritten).
_V18 = """
ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
CREATE TRIGGER sessions_version AFTER UPDATE ON sessions WHEN NEW.version = OLD.version
BEGIN UPDATE sessions SET version = OLD.version + 1 WHERE rowid = NEW.rowid; END;
"""

# v19: one index fewer on every status change of an operation. `fork_operations_recoverable`
# (status, op_seq) held every operation the store ever had and moved at each of a fork's three
# status UPDATEs (and its INSERT), for two statements that run once per start: the restart
# rule's status changes and the list of its commits. Those select only active operations, which
# the barrier's partial index `fork_operations_barrier_held` (v16) holds already (with the
# `unknown` and the un-ACKed committed ones: a handful per source), so they walk it instead
# (`storage/fork_recovery.py`, `INDEXED BY` it) and sort the few rows found by `op_seq`.
_V19 = "DROP INDEX IF EXISTS fork_operations_recoverable;"

# v20: no ephemeral B-tree on a fork operation's status change. As v14 found for `turns` and
# `interactions`, SQLite tests `x IN (a, b, c)` — more than two constants — by building, filling
# and freeing an ephemeral index of the list once per run of a statement (and once per row in a
# trigger's program). Every UPDATE of an operation's status built four: the table's status CHECK,
# the barrier index's predicate (on the old row and on the new one) and `history_fences_released`'s
# `WHEN NEW.status NOT IN (…)`; each a fresh page cache malloc'd and touched, about a third of a
# recovery commit's CPU (docs/performance.md, recov). The same tests as comparisons accept and
# select exactly the same rows (`status` is NOT NULL): the CHECK restated (v14's edit), the
# trigger and the barrier's partial index made again with `=`/`<>` chains — the index's WHERE is
# `domain.fork_states.BARRIER_SQL`'s text, which every barrier query repeats (written out: a
# released migration never changes; tests/storage/test_fork_barrier_index.py holds the two equal).
FORK_STATUS_CHECK = (
    "CHECK (status IN ('prepared', 'dispatching',\n"
    "                                   'provider_accepted', 'committed', 'failed', 'unknown',"
    " 'abandoned'))",
    "CHECK (status = 'prepared' OR status = 'dispatching' OR status = 'provider_accepted'"
    " OR status = 'committed' OR status = 'failed' OR status = 'unknown'"
    " OR status = 'abandoned')",
)
_V20_OBJECTS = (
    "DROP TRIGGER history_fences_released;"
    " CREATE TRIGGER history_fences_released AFTER UPDATE OF status ON fork_operations"
    " WHEN NEW.status <> 'prepared' AND NEW.status <> 'dispatching'"
    " AND NEW.status <> 'provider_accepted'"
    " BEGIN DELETE FROM history_fences WHERE op_seq = NEW.op_seq; END;"
    " DROP INDEX fork_operations_barrier_held;"
    " CREATE INDEX fork_operations_barrier_held"
    " ON fork_operations (workspace_id, source_session_id, source_turn_id, op_seq)"
    " WHERE (status = 'prepared' OR status = 'dispatching' OR status = 'provider_accepted'"
    " OR status = 'unknown' OR (status = 'committed' AND client_observed_at_ms IS NULL));"
)


def _v20(conn: apsw.Connection) -> None:
    _edit_tables(conn, (("fork_operations", *FORK_STATUS_CHECK),))
    conn.execute(_V20_OBJECTS)


# v21: fewer b-trees on a fork's path, each a leaf (a 4 KiB WAL frame) written by every fork
# and none a query's need (docs/performance.md, walpages; every statement's plan checked with
# EXPLAIN QUERY PLAN, tests/storage/test_v21_indexes.py). Three indexes go:
# `turns_by_phase` (workspace, Session, phase) moved at every Turn's insert and its settlement:
# the reads of a Session's active Turn go through `turns_active` (v11: the same Session's active
# Turns, at most one), the others through the primary key's prefix. `history_fences_by_op`
# moved at prepare's fence and its release: the release trigger deletes the operation's fence
# by its source's key (`session_keys`, then the fence's primary key; the fence belongs to one
# operation, `op_seq` still compared), one row found as before, also for recovery's set-based
# status changes. `session_reservations_by_operation` moved at every prepare: an operation
# reserves only its target's id, so its reservation is deleted by the primary key (workspace,
# target) with its `operation_id` still compared (v3's other reader, the foreign key's child
# lookup, runs only when an operation's key changes or its row is deleted: the store does
# neither). And two tables keyed by text become WITHOUT ROWID, their primary key the table's
# own b-tree instead of a rowid table beside an index of the key: `session_reservations` (one
# row per prepare) and `fork_lineage` (one per commit), the same columns, constraints and rows.
_V21_OBJECTS = (
    "DROP INDEX IF EXISTS turns_by_phase;"
    " DROP INDEX IF EXISTS history_fences_by_op;"
    " DROP INDEX IF EXISTS session_reservations_by_operation;"
    " DROP TRIGGER history_fences_released;"
    " CREATE TRIGGER history_fences_released AFTER UPDATE OF status ON fork_operations"
    " WHEN NEW.status <> 'prepared' AND NEW.status <> 'dispatching'"
    " AND NEW.status <> 'provider_accepted'"
    " BEGIN DELETE FROM history_fences WHERE session_key = (SELECT session_key FROM session_keys"
    " WHERE workspace_id = NEW.workspace_id AND session_id = NEW.source_session_id)"
    " AND op_seq = NEW.op_seq; END;"
)
_V21_TABLES = """
CREATE TABLE session_reservations_v21 (
    workspace_id   TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    operation_id   TEXT NOT NULL,
    PRIMARY KEY (workspace_id, session_id),
    FOREIGN KEY (workspace_id, operation_id) REFERENCES fork_operations(workspace_id, operation_id)
) WITHOUT ROWID;
INSERT INTO session_reservations_v21 (workspace_id, session_id, operation_id)
    SELECT workspace_id, session_id, operation_id FROM session_reservations;
DROP TABLE session_reservations;
ALTER TABLE session_reservations_v21 RENAME TO session_reservations;
CREATE TABLE fork_lineage_v21 (
    workspace_id        TEXT NOT NULL,
    target_session_id   TEXT NOT NULL,
    source_session_id   TEXT NOT NULL,
    source_turn_id      TEXT NOT NULL,
    target_turn_id      TEXT NOT NULL,
    operation_id        TEXT NOT NULL,
    forked_at_ms        INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, target_session_id),
    FOREIGN KEY (workspace_id, operation_id) REFERENCES fork_operations(workspace_id, operation_id)
) WITHOUT ROWID;
INSERT INTO fork_lineage_v21 (workspace_id, target_session_id, source_session_id,
        source_turn_id, target_turn_id, operation_id, forked_at_ms)
    SELECT workspace_id, target_session_id, source_session_id, source_turn_id, target_turn_id,
        operation_id, forked_at_ms FROM fork_lineage;
DROP TABLE fork_lineage;
ALTER TABLE fork_lineage_v21 RENAME TO fork_lineage;
CREATE INDEX fork_lineage_by_source ON fork_lineage (workspace_id, source_session_id);
"""


def _v21(conn: apsw.Connection) -> None:
    conn.execute(_V21_OBJECTS)
    conn.execute(_V21_TABLES)


# v22: the barrier's index untouched by a fork's status steps (docs/performance.md, barrierflag).
# SQLite deletes and re-inserts a partial index's entry at every UPDATE that sets a column its
# WHERE names, even when the entry's key and its membership do not change: v20's
# `fork_operations_barrier_held` named `status`, so each of a warm fork's status steps
# (dispatching, provider_accepted, committed) wrote its leaf, a WAL frame, though the operation
# held the barrier from its prepare to its ACK. The barrier's set is now a column, `barrier`
# (1: the row holds it), that changes only when an operation enters or leaves the set (its
# prepare, `failed`, `abandoned`, the ACK), and the partial index's WHERE is `barrier = 1`
# (`domain.fork_states.BARRIER_SQL`, which every barrier query repeats). The rule is unchanged
# and the column is held to it by a CHECK — v20's predicate, written out — that every INSERT
# and every UPDATE of `status`, `client_observed_at_ms` or `barrier` tests: a writer sets the
# flag in the same statement as the status or ACK time that moves it, or its statement fails.
# (Triggers setting it after the fact were measured: ~2 µs more per INSERT and per ACK.) The
# column's default 0 fills every existing row in O(1); the migration sets 1 on the rows v20's
# index held (a handful per source: its WHERE is the rule's text, so the planner finds them
# through it), then adds the CHECK by `_edit_tables` (every row now satisfies it) and makes
# the index again.
BARRIER_COLUMN = (
    "barrier INTEGER NOT NULL DEFAULT 0",
    "barrier INTEGER NOT NULL DEFAULT 0 CHECK (barrier = (status = 'prepared'"
    " OR status = 'dispatching' OR status = 'provider_accepted' OR status = 'unknown'"
    " OR (status = 'committed' AND client_observed_at_ms IS NULL)))",
)
_V22_HELD = (
    "UPDATE fork_operations SET barrier = 1 WHERE (status = 'prepared' OR status = 'dispatching'"
    " OR status = 'provider_accepted' OR status = 'unknown'"
    " OR (status = 'committed' AND client_observed_at_ms IS NULL));"
)
_V22_INDEX = (
    "DROP INDEX IF EXISTS fork_operations_barrier_held;"
    " CREATE INDEX fork_operations_barrier_held"
    " ON fork_operations (workspace_id, source_session_id, source_turn_id, op_seq)"
    " WHERE barrier = 1;"
)


def _add_checked_column(
    conn: apsw.Connection, name: str, column: tuple[str, str], fill: str, index: str
) -> None:
    """A `fork_operations` column held to the status by a CHECK (v22's `barrier`, v23's
    `stage`): added plain, filled by `fill`, its CHECK added by `_edit_tables`, then `index`
    (made again). A store that has the column already (the steps re-run over a newer store)
    only gets the index."""
    columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(fork_operations)")}
    if name not in columns:
        conn.execute(f"ALTER TABLE fork_operations ADD COLUMN {column[0]}")
        conn.execute(fill)
        _edit_tables(conn, (("fork_operations", *column),))
    conn.execute(index)


def _v22(conn: apsw.Connection) -> None:
    _add_checked_column(conn, "barrier", BARRIER_COLUMN, _V22_HELD, _V22_INDEX)


# v23: the fence's index untouched by a fork's dispatching and provider_accepted steps
# (docs/performance.md, stage). `fork_operations_by_source` keyed `(workspace, source, status)`
# for its three readers — the fence probe (active), the child title's count and the prefixes
# that attribute a provider child (not failed/abandoned) — so every status step moved its
# entry, a leaf (a WAL frame). The key's last column is now `stage` (2: active, 1: committed or
# `unknown`, 0: failed or abandoned; `domain.fork_states.stage_of`), which moves only when an
# operation leaves the active set or stops being a fork: the fence probe is `stage = 2` and
# the counts `stage > 0`, both still covering. Like v22's `barrier`, the column is held to the
# status by a CHECK (`STAGE_RULE_SQL`, written out) that every INSERT and every UPDATE of
# `status` or `stage` tests: a writer sets it in the statement that moves the status across a
# stage's edge, or its statement fails. The column's default 1 (what most rows of a store are:
# committed forks) fills every existing row in O(1); the migration sets 2 on the active rows
# (each holds the barrier, so the barrier's index finds them) and 0 on the failed and abandoned
# ones (one pass over the table), then adds the CHECK by `_edit_tables` and makes the index
# again with the new key.
STAGE_COLUMN = (
    "stage INTEGER NOT NULL DEFAULT 1",
    "stage INTEGER NOT NULL DEFAULT 1 CHECK (stage = (CASE WHEN status = 'prepared'"
    " OR status = 'dispatching' OR status = 'provider_accepted' THEN 2"
    " WHEN status = 'failed' OR status = 'abandoned' THEN 0 ELSE 1 END))",
)
_V23_STAGES = (
    "DROP INDEX IF EXISTS fork_operations_by_source;"
    " UPDATE fork_operations INDEXED BY fork_operations_barrier_held SET stage = 2"
    " WHERE barrier = 1 AND (status = 'prepared' OR status = 'dispatching'"
    " OR status = 'provider_accepted');"
    " UPDATE fork_operations SET stage = 0 WHERE status = 'failed' OR status = 'abandoned';"
)
_V23_INDEX = (
    "DROP INDEX IF EXISTS fork_operations_by_source;"
    " CREATE INDEX fork_operations_by_source"
    " ON fork_operations (workspace_id, source_session_id, stage);"
)


def _v23(conn: apsw.Connection) -> None:
    _add_checked_column(conn, "stage", STAGE_COLUMN, _V23_STAGES, _V23_INDEX)


# v24: a Turn the provider never got (its `turn.start` provably never sent: the runtime's
# preparation failed, or the worker link answered "not sent") is marked `host_only` by its
# settlement. The fork's provider prefix leaves it out (storage/fork_snapshot.py): the
# provider's thread holds no Turn for it, so one such Turn no longer makes its Session
# unforkable for good. The CHECK keeps the mark honest: a marked Turn never gets a provider
# turn id. The column's default fills every existing row in O(1) (no row is rewritten); a
# store that has it already (the steps re-run over a newer store) is left as it is.
_V24 = (
    "ALTER TABLE turns ADD COLUMN host_only INTEGER NOT NULL DEFAULT 0"
    " CHECK (host_only = 0 OR (host_only = 1 AND root_provider_turn_id IS NULL))"
)


def _v24(conn: apsw.Connection) -> None:
    if "host_only" not in {str(r[1]) for r in conn.execute("PRAGMA table_info(turns)")}:
        conn.execute(_V24)


# v25: who works in a tree, and whether a cwd lies in a deleted fork child's tree, by real path
# (docs/design/workspace.md "Deleting a fork's tree"). `sessions.real_cwd`: the real path
# (`os.path.realpath`) of the cwd `session.create` was given, kept only when it differs from
# it (a symlink, `..`, a doubled or trailing slash); NULL when the cwd is its real path, on a
# fork child (its cwd is its source's, spelled the same, or its tree's real path) and on every
# row before v25 (this step reads no file system: v26 fills those).
# `fork_operations.deleted_tree_path`: the tree's path (its plan's `path`, a real path), set in
# the transaction that marks a committed fork's tree `removing` (its child's delete) and kept
# when it becomes `removed`; NULL on every other row. `session.create` probes it by equality,
# once for each ancestor of its cwd, through a partial index that holds only those rows, where
# it decoded the plan of every deleted child's tree under the write lock; `sessions_real_cwd`
# holds only the Sessions that have a real cwd (written by no fork: a child has none), so
# `tree_users` finds the spellings that reach a tree without a second pass over every
# Session. The back-fill sets the path on the rows already `removing`/`removed` (found through
# v10's `fork_operations_worktrees`).
# One transaction, as every step: a crash or an error mid-way leaves the store at v24, whole.
# A store that has the columns already (the steps re-run over a newer store) gets the rest.
_V25_FILL = (
    "UPDATE fork_operations INDEXED BY fork_operations_worktrees"
    " SET deleted_tree_path = json_extract(workspace_json, '$.path')"
    " WHERE status = 'committed' AND workspace_state IN ('removing', 'removed')"
    " AND deleted_tree_path IS NULL"
)
_V25_INDEX = (
    "CREATE INDEX IF NOT EXISTS fork_operations_deleted_trees"
    " ON fork_operations (deleted_tree_path) WHERE deleted_tree_path IS NOT NULL;"
    " CREATE INDEX IF NOT EXISTS sessions_real_cwd ON sessions (real_cwd)"
    " WHERE real_cwd IS NOT NULL"
)


def _v25(conn: apsw.Connection) -> None:
    if "real_cwd" not in {str(r[1]) for r in conn.execute("PRAGMA table_info(sessions)")}:
        conn.execute("ALTER TABLE sessions ADD COLUMN real_cwd TEXT")
    columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(fork_operations)")}
    if "deleted_tree_path" not in columns:
        conn.execute("ALTER TABLE fork_operations ADD COLUMN deleted_tree_path TEXT")
    conn.execute(_V25_FILL)
    conn.execute(_V25_INDEX)


# v26: the real cwd of the Sessions from before v25, filled once (docs/design/store.md v26).
# v25 kept `sessions.real_cwd` only for the Sessions `session.create` made from then on (its
# migration reads no file system), so a Session started through a symlink or `..` before the
# upgrade was compared by its cwd as given and not seen as its tree's user. This step gives each
# live Session with a NULL `real_cwd` whose cwd is a directory spelled otherwise than its real
# path that real path (`os.path.realpath`, once per distinct cwd, read as such); a cwd that
# no longer exists keeps NULL and is compared as given; one that is its own real path stays
# NULL, as `session.create` leaves it. In the migration's one transaction: a crash or an error
# mid-way leaves the store at v25, whole, and the next open fills it all; done once, not at
# every start.
_V26_CWDS = "SELECT DISTINCT cwd FROM sessions WHERE deleted = 0 AND real_cwd IS NULL"
# One pass over the Sessions for every cwd filled: `[cwd, real]` pairs as one JSON parameter.
_V26_FILL = (
    "UPDATE sessions SET real_cwd = f.real FROM (SELECT json_extract(value, '$[0]') AS cwd,"
    " json_extract(value, '$[1]') AS real FROM json_each(?)) AS f"
    " WHERE sessions.cwd = f.cwd AND sessions.deleted = 0 AND sessions.real_cwd IS NULL"
)


def _v26(conn: apsw.Connection) -> None:
    # The distinct cwds only (a store of months: 100,000 Sessions in a handful of folders),
    # each asked of the file system once.
    fills = []
    for (raw,) in conn.execute(_V26_CWDS).fetchall():
        cwd = str(raw)
        if os.path.isdir(cwd) and (real := os.path.realpath(cwd)) != cwd:
            fills.append([cwd, real])
    if fills:
        conn.execute(_V26_FILL, (json.dumps(fills),))


# v27: a fork that ended without a child keeps no frozen snapshot (docs/design/store.md v27).
# The snapshot is read by the operation's commit and by its committed child's projection only;
# a `failed` or `abandoned` operation is terminal and childless, so neither can read it again,
# yet it was kept for good: every fork the provider refused, every `prepared` one a restart
# failed and every abandoned one left its whole boundary's document (~150 bytes a Turn). Each
# statement that ends an operation so sets its `stage` to 0 (v23's CHECK makes it), and this
# trigger drops the snapshot in that statement's transaction; a status step that keeps the
# stage names no `stage` and does not fire it, and a commit (stage 1) only tests the WHEN. The
# step drops the snapshots a store already kept for its ended operations (one pass over the
# operations), in the migration's one transaction; over a store that has the trigger already
# (the steps re-run over a newer store) it only drops.
_V27 = """
CREATE TRIGGER IF NOT EXISTS fork_snapshots_of_ended AFTER UPDATE OF stage ON fork_operations
WHEN NEW.stage = 0
BEGIN DELETE FROM fork_snapshots WHERE op_seq = NEW.op_seq; END;
DELETE FROM fork_snapshots WHERE op_seq IN (SELECT op_seq FROM fork_operations WHERE stage = 0);
"""

MIGRATIONS: tuple[str | Callable[[apsw.Connection], None], ...] = (
    _V1,
    _V2,
    _V3,
    _v4,
    _V5,
    _V6,
    _V7,
    _V8,
    _V9,
    _v10,
    _V11,
    _V12,
    _V13,
    _v14,
    _V15,
    _V16,
    _V17,
    _V18,
    _V19,
    _v20,
    _v21,
    _v22,
    _v23,
    _v24,
    _v25,
    _v26,
    _V27,
)
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: apsw.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: apsw.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring the file to `target` in one transaction; returns the version found before.

    BEGIN IMMEDIATE serialises concurrent openers (several processes may open one file).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = user_version(conn)
        if found > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"store schema version {found} is newer than this build ({SCHEMA_VERSION})"
            )
        for version in range(found, target):
            step = MIGRATIONS[version]
            if callable(step):
                step(conn)
            else:
                conn.execute(step)
        if target > found:
            conn.execute(f"PRAGMA user_version = {int(target)}")
        conn.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled the whole transaction back itself (a full disk, an I/O error):
        # a ROLLBACK then fails "no transaction is active" and would hide the typed cause.
        if not conn.getautocommit():
            conn.execute("ROLLBACK")
        raise
    return found
