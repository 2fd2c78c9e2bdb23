"""Loaded by every Python process of a daemon started by `bench.fork_walk` (this folder leads its
PYTHONPATH): records which of the repository's files run code, and when, so the walk can name
the files one `fork.create` touches in the daemon, its workers and their app-servers.

Inert unless `AGENTHOST_WALK_DIR` is set. Each process keeps, per file, the distinct
milliseconds at which a function of that file was called, and apart from them those at which
the file's module body ran (an import), and writes them to `$AGENTHOST_WALK_DIR/<pid>.json`
every 200 ms (a process may be killed, not exited).
"""

from __future__ import annotations

import os

_DIR = os.environ.get("AGENTHOST_WALK_DIR")

if _DIR:
    import json
    import sys
    import threading
    import time
    from pathlib import Path

    _ROOT = os.environ.get("AGENTHOST_WALK_ROOT", "")
    _SKIP = tuple(os.path.join(_ROOT, d) + os.sep for d in ("tests", "bench", "build"))
    _seen: dict[str, list[int]] = {}
    _imports: dict[str, list[int]] = {}
    _ours: dict[str, bool] = {}
    _lock = threading.Lock()

    def _profile(frame: object, event: str, arg: object) -> None:
        if event != "call":
            return
        name: str = frame.f_code.co_filename  # type: ignore[attr-defined]
        ours = _ours.get(name)
        if ours is None:
            ours = _ours[name] = name.startswith(_ROOT) and not name.startswith(_SKIP)
        if not ours:
            return
        ms = int(time.time() * 1000)
        kept = _imports if frame.f_code.co_name == "<module>" else _seen  # type: ignore[attr-defined]
        stamps = kept.setdefault(name, [])
        if not stamps or stamps[-1] != ms:
            stamps.append(ms)

    def _dump_forever(folder: str) -> None:
        target = Path(folder) / f"{os.getpid()}.json"
        while True:
            time.sleep(0.2)
            snapshot = {name: list(stamps) for name, stamps in list(_seen.items())}
            imports = {name: list(stamps) for name, stamps in list(_imports.items())}
            tmp = target.with_suffix(".tmp")
            try:
                tmp.write_text(
                    json.dumps({"argv": sys.argv, "files": snapshot, "imports": imports})
                )
                os.replace(tmp, target)
            except OSError:
                return  # the walk is over (its folder removed): stop recording quietly

    sys.setprofile(_profile)
    threading.setprofile(_profile)
    threading.Thread(target=_dump_forever, args=(_DIR,), name="walk-dump", daemon=True).start()
