"""A Turn's store calls as the Session actor makes them, on one thread: the claim; a batch of
the reply Message and the settlement handed its image; a rename. N Turns over 8 Sessions on a
real store file, the first 50 left out; prints the thread CPU per Turn of each, ms. In-process
and single-threaded, so it reads the calls' own CPU (what a writer holds the baton for) at any
load; compare trees interleaved.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.store_turn_cpu [N] [--folded]

`--folded`: the reply handed to the settlement (`record_settlement(…, messages=…)`: one write,
as the Session actor writes a one-reply Turn since turnfixed) instead of the batch of two.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from storage.models import Turn
from storage.store import Store

WS = "ws-store-turn-cpu"
WARM = 50


def run(n: int, folded: bool = False) -> dict[str, float]:
    spent = {"claim": 0.0, "batch": 0.0, "rename": 0.0}
    with tempfile.TemporaryDirectory(prefix="store-turn-cpu-") as tmp:
        store = Store.open(Path(tmp) / "store.sqlite3")
        try:
            sids = [
                store.sessions.create_session(
                    WS, session_id=f"s{i}", provider="tutti-agent", title="t", cwd="/", settings={}
                ).session_id
                for i in range(8)
            ]
            for i in range(n):
                sid = sids[i % len(sids)]
                c0 = time.thread_time()
                turn, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), "hello")
                c1 = time.thread_time()
                if folded:
                    from storage.models import NewMessage

                    new = NewMessage(str(uuid.uuid4()), "assistant", "reply", {})
                    store.turns.record_settlement(
                        WS, sid, turn.turn_id, outcome="completed",
                        final_assistant_message_id=new.message_id,
                        checkpoint_json='{"state":"unavailable"}', turn=turn, messages=(new,),
                    )  # fmt: skip
                else:
                    _batch(store, sid, turn)
                c2 = time.thread_time()
                store.sessions.update_title(WS, sid, f"t{i}")
                c3 = time.thread_time()
                if i >= WARM:
                    spent["claim"] += c1 - c0
                    spent["batch"] += c2 - c1
                    spent["rename"] += c3 - c2
        finally:
            store.close()
    counted = max(1, n - WARM)
    return {k: v * 1000 / counted for k, v in spent.items()}


def _batch(store: Store, sid: str, turn: Turn) -> None:
    """The reply and the settlement as two writes of one batch (the actor's before turnfixed)."""
    with store.db.write_batch():
        reply = store.history.append_message(
            WS, sid, turn.turn_id, kind="assistant", text="reply", payload={}
        )
        image = replace(turn, messages=(*turn.messages, reply))
        store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id,
            checkpoint_json='{"state":"unavailable"}', turn=image,
        )  # fmt: skip


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 600
    got = run(n, "--folded" in sys.argv)
    print(" ".join(f"{k} {v:.3f}" for k, v in got.items()) + " ms of CPU per Turn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
