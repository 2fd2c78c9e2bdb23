"""The size cap and the tree refs a Session's Turns share (actors/checkpoints.py
`commit_ref`): dropping one Turn's checkpoint drops a tree's ref only once no Turn record of
the Session that is not dropped names it (a real SQLite store, real git shadow store)."""

from __future__ import annotations

import json
from pathlib import Path

from store_builders import WS, new_session

from actors.checkpoints import (
    Capture,
    CheckpointJanitor,
    DirectoryLocks,
    TurnCheckpoints,
    commit_ref,
    turn_record,
)
from storage.store import Store
from tests.support.git_repos import make_repo
from workspace.shadow import ShadowStore


def test_a_dropped_turns_tree_ref_stays_while_a_turn_not_dropped_names_it(
    store: Store, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    shadow = ShadowStore(tmp_path / "home" / "checkpoints")
    locks = DirectoryLocks()
    turns = TurnCheckpoints(shadow, locks=locks)
    janitor = CheckpointJanitor(shadow, store, turns.pool, locks, 3600.0, max_bytes=1)
    sid = new_session(store)

    def settled_turn(change: str | None) -> tuple[str, str, dict[str, str]]:
        """A Turn whose folder `change` (a new text of a.txt) between its two captures."""
        turn, _ = store.turns.claim_submit(WS, sid, f"req-{change}", "hi")
        before = turns.capture(str(repo), sid, turn.turn_id, "before").result(30)
        if change is not None:
            (repo / "a.txt").write_text(change)
        tree = getattr(before.checkpoint, "tree", None)
        after: Capture = turns.capture(str(repo), sid, turn.turn_id, "after", tree).result(30)
        record = json.dumps(turn_record(before, after))
        store.turns.bind_provider_turn(WS, sid, turn.turn_id, f"pt-{turn.turn_id[:8]}", None)
        assert store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed", checkpoint_json=record
        )
        turns.settled(sid, turn.turn_id)
        return turn.turn_id, record, json.loads(record)

    try:
        t1, r1, first = settled_turn(None)
        t2, r2, second = settled_turn("changed by the second turn\n")
        x, y = first["after"], second["after"]
        assert first["before"] == x == second["before"] and y != x
        assert sorted(shadow.refs(repo)) == sorted([commit_ref(sid, x), commit_ref(sid, y)])

        assert janitor._drop_turn(WS, sid, t1, r1) == 1
        # The second Turn's `before` is the first's tree: its ref stays.
        assert sorted(shadow.refs(repo)) == sorted([commit_ref(sid, x), commit_ref(sid, y)])
        assert janitor._drop_turn(WS, sid, t2, r2) == 1
        assert shadow.refs(repo) == []
    finally:
        turns.pool.shutdown(wait=True)
