"""A/B of a jump in a long transcript, in one process on one transcript (so the host's load
hits both alike): the CPU ms of the jump's own frame and of the whole jump until the transcript
is idle, with the jump's Turns mounted with their Fork buttons (A: `_place` forced to arm) or
without them, armed by the next frame's placement (B). Alternated per round.

    build/venv/bin/python -m bench.gui_jump_ab [TURNS=190] [ROUNDS=10]

TURNS stays under one page (200) so no Load more is needed.
"""
# ruff: noqa
# mypy: ignore-errors
import asyncio, statistics, sys, tempfile, time
from pathlib import Path
from bench.harness import WS, BenchDaemon, create_session, run_turn
from client.engine import Engine
from client.gui.app import AgentHostApp
from client.gui.transcript import TranscriptView

TURNS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 15

async def until(pilot, pred, t=120):
    d = time.monotonic() + t
    while not pred():
        assert time.monotonic() < d
        await asyncio.sleep(0.005)

async def measure(daemon, big, size):
    engine = Engine.connect(daemon.api, daemon.events, WS)
    app = AgentHostApp(engine, own_engine=True)
    res = {"A": [], "B": []}
    tot = {"A": [], "B": []}
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.sessions_loaded and engine.session(big))
        app.open_session(big)
        tr = app.query_one(TranscriptView)
        await until(pilot, lambda: tr.turn_count == TURNS and tr.idle)
        place = tr._place
        for r in range(ROUNDS):
            for variant in ("A", "B") if r % 2 == 0 else ("B", "A"):
                for frac in (0.15, 0.5, 0.85, 0.3, 0.7):
                    # A jump from far away: first park at the other end.
                    tr.scroll_to(y=0 if frac > 0.5 else tr.max_scroll_y, animate=False)
                    await pilot.pause()
                    await until(pilot, lambda: tr.idle)
                    await pilot.pause(0.02)
                    if variant == "A":
                        async def forced(rows, at_end, overscan=8, *, arm=True):
                            await place(rows, at_end, overscan, arm=True)
                        tr._place = forced
                    drawn = []
                    margins = tr._mount_margins
                    def stamp():
                        drawn.append(time.process_time())
                        margins()
                    tr._mount_margins = stamp
                    c0 = time.process_time()
                    tr.scroll_to(y=tr.max_scroll_y * frac, animate=False)
                    await pilot.pause()
                    await until(pilot, lambda: tr.idle)
                    c1 = time.process_time()
                    del tr._mount_margins
                    if variant == "A":
                        del tr._place
                    if drawn:
                        res[variant].append((drawn[0] - c0) * 1000)
                        tot[variant].append((c1 - c0) * 1000)
    for v in "AB":
        print(f"{size[0]}x{size[1]} {v} ({'buttons on the jump frame' if v == 'A' else 'no buttons on the jump frame'}): "
              f"jump frame CPU median {statistics.median(res[v]):.1f} ms, until idle {statistics.median(tot[v]):.1f} ms, n={len(res[v])}")

def main():
    with tempfile.TemporaryDirectory(prefix="ab-gui-") as tmp, BenchDaemon(Path(tmp) / "home").start() as daemon:
        c = daemon.client()
        big = create_session(c, "Long")
        for i in range(TURNS):
            run_turn(c, big, f"/tool step_{i} arg" if i % 10 == 0 else f"message {i}")
        for size in ((80, 24), (200, 50)):
            asyncio.run(measure(daemon, big, size))

main()
