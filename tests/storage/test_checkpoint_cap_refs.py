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


def test_a_tree_the_cap_dropped_and_collected_is_kept_again_by_an_unchanged_folders_capture(
    store: Store, tmp_path: Path
) -> None:
    """The cap drops a settled Turn's tree ref and `git gc --prune=now` runs; the folder is
    unchanged, so the next captures answer from its stat snapshot with that same tree and
    run no `write-tree`. Each writes the ref again (the cap's drop told the store's names,
    so none takes the ref for there), and the tree is still in the store (the shadow index's
    cache tree names it, and gc keeps what the index names): a record naming it names a
    tree a fork can make its files from."""
    repo = make_repo(tmp_path / "repo")
    shadow = ShadowStore(tmp_path / "home" / "checkpoints")
    shadow.racy_margin_ns = 0  # the snapshot takes the new repository's files at once
    locks = DirectoryLocks()
    turns = TurnCheckpoints(shadow, locks=locks)
    janitor = CheckpointJanitor(shadow, store, turns.pool, locks, 3600.0, max_bytes=1)
    sid = new_session(store)
    try:
        first, _ = store.turns.claim_submit(WS, sid, "req-1", "hi")
        before = turns.capture(str(repo), sid, first.turn_id, "before").result(30)
        tree = getattr(before.checkpoint, "tree", None)
        assert tree is not None, before
        after = turns.capture_after_here(str(repo), sid, first.turn_id, tree)
        assert after is not None  # the snapshot answered: no git run
        record = json.dumps(turn_record(before, after))
        store.turns.bind_provider_turn(WS, sid, first.turn_id, "pt-1", None)
        assert store.turns.record_settlement(
            WS, sid, first.turn_id, outcome="completed", checkpoint_json=record
        )
        turns.settled(sid, first.turn_id)

        assert janitor._drop_turn(WS, sid, first.turn_id, record) == 1
        assert janitor._collect() == 1
        assert shadow.refs(repo) == []

        second, _ = store.turns.claim_submit(WS, sid, "req-2", "again")
        # On the actor: the ref is gone, so the `before` is left to the pool.
        assert turns.capture_before_here(str(repo), sid, second.turn_id) is None
        again = turns.capture(str(repo), sid, second.turn_id, "before").result(30)
        assert getattr(again.checkpoint, "tree", None) == tree
        assert shadow.refs(repo) == [commit_ref(sid, tree)]
        assert shadow.has(repo, tree)

        # The same on the actor's thread: dropped and collected again, then an `after`.
        with locks(str(repo)):
            shadow.drop_refs(repo, [commit_ref(sid, tree)])
            shadow.gc(repo)
        here = turns.capture_after_here(str(repo), sid, second.turn_id, tree)
        assert here is not None and getattr(here.checkpoint, "tree", None) == tree
        assert shadow.refs(repo) == [commit_ref(sid, tree)]
        assert shadow.has(repo, tree)
        materialized = shadow.materialize(repo, tree, tmp_path / "made")
        assert (materialized / "a.txt").read_text() == (repo / "a.txt").read_text()
    finally:
        turns.pool.shutdown(wait=True)
