"""Loaded by the daemon of `bench.mutation_stages` (this folder leads its PYTHONPATH): one
mutation's path through the daemon stamped stage by stage, per request, on the wall clock the
load clients' `t0`/`t1` use (`time.time() * 1000`).

Inert unless `AGENTHOST_MUTATION_STAGES` names a folder, and then only in the daemon (`serve`):
nothing of the daemon's code changes; its functions are wrapped once their modules are
imported. Each request's stamps, keyed by its wire id: `recv` (the transport loop's `_handle`
began), `decoded`, `dispatched` (the dispatcher returned), `lane` (a rename's step began on a
writer thread) or `actor` (the Session actor began the message: the actor pool's queue),
`store_in` (the store's `submit_write` called), `body_in` / `body_out` (its body ran: on this
thread or on the baton holder's), `owner` (1: this thread held the baton), `notify_in` (the
group's COMMIT returned and the events go out), `store_out`, `reply` (the responder was
answered), `sent` (the transport loop sent the reply). Each group COMMIT (`_end_group`) is a
row of its own: `[start, ms, members]`; every 0.25 s the CPU each of the daemon's threads
(by name, numbered ones summed) has used; and each baton hold: `[start, end, thread, the
writer's store method, bodies it ran for others, the holder's thread CPU, the wall and CPU of the
group COMMITs it ran]`; each write of a Turn's batch (`TurnWrites._drain_batch`): `[what, wall,
CPU]`. One JSON file per process, written at exit
and every second.

Three knobs for experiments, each off unless set: `AGENTHOST_STAGES_GROUP_AGE_MS` (how long a
group stays open for the writers queued behind it, `Database.group_max_age_s`) and
`AGENTHOST_STAGES_BATCH_BACKGROUND=1` (a Turn's queued writes, `write_batch`, queue as
background writers behind the clients' writes), and `AGENTHOST_STAGES_COMMIT_BEFORE_HANDOFF=1`
(a group stays open only for the submitted bodies its holder runs itself: it is committed
before the baton goes to a writer of its own).
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("AGENTHOST_MUTATION_STAGES")

if _DIR and "serve" in sys.argv:
    import contextlib
    import json
    import threading
    import time
    from typing import Any

    from bench.import_wrap import wrap_on_import

    _now = time.time
    _stamps: dict[str, dict[str, float]] = {}
    _commits: list[tuple[float, float, int]] = []
    _holds: list[tuple[float, float, str, str, int, float, float, float]] = []
    """Each baton hold: start, end, thread name, the writer's store method, bodies combined,
    the holder thread's CPU over the hold (`time.thread_time`), the wall and CPU ms of the
    group COMMITs it ran (all ms)."""
    _local = threading.local()
    _by_message: dict[int, str] = {}
    _HOLD_CALLS = bool(os.environ.get("AGENTHOST_STAGES_HOLD_CALLS"))
    _hold_calls: dict[str, list[Any]] = {}
    """With `AGENTHOST_STAGES_HOLD_CALLS=1`, per writer: [holds, {function: Python and C calls
    made while its holds held the baton}] (`sys.setprofile` on the holder's thread from the
    baton's take to its hand-on; the probe's own wrappers left out at the report)."""

    def _profiler(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            key = f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_name}"
        elif event == "c_call":
            key = f"C:{getattr(arg, '__qualname__', None) or getattr(arg, '__name__', '?')}"
        else:
            return
        calls = _local.calls
        calls[key] = calls.get(key, 0) + 1

    def _stamp(rid: str | None, stage: str) -> None:
        """The stage's first stamp for the request (a later write of the same handler, say a
        Turn's start after its claim, keeps the claim's)."""
        if rid is not None:
            _stamps.setdefault(rid, {}).setdefault(stage, _now() * 1000.0)

    def _current() -> str | None:
        return getattr(_local, "rid", None)

    _dump_lock = threading.Lock()

    def _dump() -> None:
        """The stamps so far, written whole (the periodic thread and `atexit` may both come)."""
        with _dump_lock, contextlib.suppress(OSError):
            path = os.path.join(_DIR, f"stages-{os.getpid()}.json")  # type: ignore[arg-type]
            tmp = f"{path}.{threading.get_ident()}.tmp"
            got = {
                "stamps": {rid: dict(stages) for rid, stages in list(_stamps.items())},
                "commits": list(_commits),
                "holds": list(_holds),
                "cpu": list(_cpu),
                "items": list(_items),
                "hold_calls": {k: [v[0], dict(v[1])] for k, v in list(_hold_calls.items())},
            }
            with open(tmp, "w") as f:
                json.dump(got, f)
            os.replace(tmp, path)

    def _wrap_server(module: Any) -> None:
        server = module.ApiServer
        handle, send_reply, decode = server._handle, server._send_reply, module.decode_request

        def decode_request(body: bytes) -> Any:
            request = decode(body)
            rid = str(request.id)
            _local.rid = rid
            _stamps.setdefault(rid, {})["recv"] = _local.recv
            _stamp(rid, "decoded")
            return request

        def _handle(self: Any, frames: list[bytes]) -> None:
            _local.recv = _now() * 1000.0
            _local.rid = None
            try:
                handle(self, frames)
            finally:
                _stamp(_current(), "dispatched")
                _local.rid = None

        def _send_reply(self: Any, token: int, frame: bytes) -> bool:
            entry = self._in_flight.get(token)
            sent = send_reply(self, token, frame)
            if entry is not None:
                _stamp(str(entry[1]), "sent")
                if threading.get_ident() != self._loop_ident:
                    _stamps[str(entry[1])]["direct"] = 1.0
            return bool(sent)

        module.decode_request = decode_request
        server._handle = _handle
        server._send_reply = _send_reply
        responder = module.OneShotResponder
        for name in ("result", "result_packed", "error"):
            inner = getattr(responder, name)

            def answered(self: Any, *args: Any, _inner: Any = inner) -> bool:
                _stamp(self._request_id, "reply")
                return bool(_inner(self, *args))

            setattr(responder, name, answered)

    def _wrap_api(module: Any) -> None:
        lanes, route = module.SessionLanes, module.route
        write_or_route = lanes.write_or_route

        def traced_write_or_route(self: Any, key: Any, write: Any) -> bool:
            rid = _current()

            def step() -> None:
                _stamp(rid, "lane")
                _local.rid = rid
                try:
                    write()
                finally:
                    _local.rid = None

            return bool(write_or_route(self, key, step))

        def traced_route(routes: Any, host: Any, ws: str, sid: str, message: Any) -> None:
            rid = _current()
            if rid is not None:
                _by_message[id(message)] = rid
            route(routes, host, ws, sid, message)

        lanes.write_or_route = traced_write_or_route
        module.route = traced_route

    def _wrap_actors(module: Any) -> None:
        actor = module.PooledActor
        inner = actor._handle_envelope

        def _handle_envelope(self: Any, envelope: Any) -> None:
            rid = _by_message.pop(id(envelope.message), None)
            _stamp(rid, "actor")
            _local.rid = rid
            try:
                inner(self, envelope)
            finally:
                _local.rid = None

        actor._handle_envelope = _handle_envelope

    def _wrap_store(module: Any) -> None:
        database = module.Database
        submit, notify, end_group = database.submit_write, database._notify, database._end_group

        def submit_write(self: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
            rid = _current()
            _stamp(rid, "store_in")
            me = threading.get_ident()

            def timed_body(tx: Any) -> Any:
                _stamp(rid, "body_in")
                if rid is not None:
                    _stamps[rid]["owner"] = float(threading.get_ident() == me)
                try:
                    return body(tx)
                finally:
                    _stamp(rid, "body_out")

            try:
                return submit(self, timed_body, *args, **kwargs)
            finally:
                _stamp(rid, "store_out")

        def _notify(self: Any, events: Any) -> None:
            _stamp(_current(), "notify_in")
            notify(self, events)

        def _end_group(self: Any, group: Any, conn: Any) -> None:
            t0, c0 = _now() * 1000.0, time.thread_time()
            members = group.members
            try:
                end_group(self, group, conn)
            finally:
                ms = _now() * 1000.0 - t0
                _commits.append((t0, ms, members))
                _local.commit_ms = getattr(_local, "commit_ms", 0.0) + ms
                cpu = (time.thread_time() - c0) * 1000.0
                _local.commit_cpu = getattr(_local, "commit_cpu", 0.0) + cpu

        database.submit_write = submit_write
        if os.environ.get("AGENTHOST_STAGES_BATCH_BACKGROUND"):
            # An experiment: a Turn's queued writes queue behind the clients' writes.
            batch = database.write_batch

            @contextlib.contextmanager
            def background_batch(self: Any) -> Any:
                with self.background(), batch(self):
                    yield

            database.write_batch = background_batch
        if os.environ.get("AGENTHOST_STAGES_COMMIT_BEFORE_HANDOFF"):
            # An experiment: the group stays open only for the bodies its holder runs itself;
            # a writer of its own next in line gets the baton after the group's COMMIT.
            def _finish_turn(self: Any) -> None:
                while True:
                    group = self._group
                    if group is None or not self._group_stays_open(group):
                        if group is not None:
                            self._end_group(group, self._writer_connection())
                        break
                    sub = self._fifo.next_submission()
                    if sub is None:
                        self._end_group(group, self._writer_connection())
                        break
                    self._run_combined(group, sub)
                self._pass_baton()

            database._finish_turn = _finish_turn
        age_ms = os.environ.get("AGENTHOST_STAGES_GROUP_AGE_MS")
        if age_ms:
            # An experiment's knob: how long a group stays open for the writers queued behind.
            init = database.__init__

            def init_with_age(self: Any, *args: Any, **kwargs: Any) -> None:
                init(self, *args, **kwargs)
                self.group_max_age_s = float(age_ms) / 1000

            database.__init__ = init_with_age
            import gc

            for obj in gc.get_objects():
                if isinstance(obj, database):
                    obj.group_max_age_s = float(age_ms) / 1000
        _wrap_baton(module.Baton)
        database._notify = _notify
        database._end_group = _end_group

    _SKIP = ("storage/sqlite.py", "contextlib.py", "sitecustomize.py")
    _MACHINERY = {
        "_take_baton",
        "write",
        "_write_own",
        "_batched",
        "submit_write",
        "_owned_write",
        "write_batch",
    }

    def _writer() -> str:
        """The first function outside the store's write machinery: who wrote (a Turn's batch,
        whose baton its first write takes, is `_drain_batch` whatever that write is)."""
        f: Any = sys._getframe(2)
        batch = f
        while batch is not None:
            if batch.f_code.co_name == "_drain_batch":
                return "_drain_batch"
            batch = batch.f_back
        while f is not None and (
            f.f_code.co_filename.endswith(_SKIP)
            or (f.f_code.co_filename.endswith("storage/base.py") and f.f_code.co_name in _MACHINERY)
        ):
            f = f.f_back
        return f.f_code.co_name if f is not None else "?"

    def _wrap_baton(baton: Any) -> None:
        take, offer, pass_on, next_sub = (
            baton.take,
            baton.offer,
            baton.pass_on,
            baton.next_submission,
        )

        def _began(label: str) -> None:
            _local.hold = (_now() * 1000.0, label, time.thread_time())
            _local.combined = 0
            _local.commit_ms = 0.0
            _local.commit_cpu = 0.0
            if _HOLD_CALLS:
                _local.calls = {}
                sys.setprofile(_profiler)

        def traced_take(self: Any, timeout_s: float) -> None:
            label = _writer()
            take(self, timeout_s)
            _began(label)

        def traced_offer(self: Any, sub: Any, timeout_s: float) -> None:
            label = _writer()
            offer(self, sub, timeout_s)
            if sub.state == sub.OWNER:
                _began(label)

        def traced_next(self: Any) -> Any:
            sub = next_sub(self)
            if sub is not None:
                _local.combined = getattr(_local, "combined", 0) + 1
            return sub

        def traced_pass_on(self: Any) -> None:
            hold = getattr(_local, "hold", None)
            if _HOLD_CALLS and hold is not None:
                sys.setprofile(None)
                got = _hold_calls.setdefault(hold[1], [0, {}])
                got[0] += 1
                for key, n in _local.calls.items():
                    got[1][key] = got[1].get(key, 0) + n
            pass_on(self)
            if hold is not None:
                _local.hold = None
                name = threading.current_thread().name
                cpu = (time.thread_time() - hold[2]) * 1000.0
                _holds.append(
                    (
                        hold[0],
                        _now() * 1000.0,
                        name,
                        hold[1],
                        _local.combined,
                        cpu,
                        getattr(_local, "commit_ms", 0.0),
                        getattr(_local, "commit_cpu", 0.0),
                    )
                )

        baton.take, baton.offer = traced_take, traced_offer
        baton.pass_on, baton.next_submission = traced_pass_on, traced_next

    _items: list[tuple[str, float, float]] = []
    """Each write a Turn's writer applied, in a batch or alone: what it was, its wall and its
    thread's CPU, ms."""

    def _wrap_turn_writes(module: Any) -> None:
        writes = module.TurnWrites
        enqueue = writes.enqueue

        def _enqueue(self: Any, item: Any) -> None:
            inner = item.apply
            if not getattr(inner, "_staged", False):

                def timed(_inner: Any = inner, _what: str = item.what) -> object:
                    t0, c0 = _now(), time.thread_time()
                    try:
                        return _inner()
                    finally:
                        _items.append(
                            (_what, (_now() - t0) * 1000.0, (time.thread_time() - c0) * 1000.0)
                        )

                timed._staged = True  # type: ignore[attr-defined]
                item.apply = timed
            enqueue(self, item)

        writes.enqueue = _enqueue

    _WRAPS = {
        "actors.turn_writes": ("TurnWrites", _wrap_turn_writes),
        "transport.server": ("ApiServer", _wrap_server),
        "agenthost.api_base": ("SessionLanes", _wrap_api),
        "actors.pool": ("PooledActor", _wrap_actors),
        "storage.base": ("Database", _wrap_store),
    }

    _TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")
    _cpu: list[tuple[float, dict[str, float]]] = []
    """Every 0.25 s: (when, CPU ms so far by thread name, the daemon's threads summed by name)."""

    def _thread_cpu() -> dict[str, float]:
        got: dict[str, float] = {}
        # Python's thread names by kernel id (the kernel's own name is "python" for most).
        names = {t.native_id: t.name for t in threading.enumerate()}
        with contextlib.suppress(OSError):
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    name = names.get(int(tid)) or ""
                    if not name:
                        with open(f"/proc/self/task/{tid}/comm") as f:
                            name = f.read().strip()
                    name = name.rstrip("_0123456789-") or "?"
                    with open(f"/proc/self/task/{tid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    ms = (int(fields[11]) + int(fields[12])) * _TICK_MS
                    got[name] = got.get(name, 0.0) + ms
        return got

    def _wrap_module(name: str, module: Any) -> None:
        attr, wrap = _WRAPS[name]
        if hasattr(module, attr):
            wrap(module)

    def _sample() -> None:
        last_dump = time.monotonic()
        while True:
            time.sleep(0.25)
            _cpu.append((_now() * 1000.0, _thread_cpu()))
            if time.monotonic() - last_dump >= 1.0:
                _dump()
                last_dump = time.monotonic()

    wrap_on_import(_WRAPS, _wrap_module)
    threading.Thread(target=_sample, name="mutation-stages", daemon=True).start()
    import atexit

    atexit.register(_dump)
