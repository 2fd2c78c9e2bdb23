"""The boundary digest hashed inside SQLite: `native/line_digest.c`, a SQLite extension whose
aggregate `sha256_lines(x)` is the SHA-256 hex of the bytes `group_concat(x, char(10))` builds,
hashed as the rows arrive. The digest's value is the same bytes hashed in the same order
(`storage/history_links.py`); what goes is the one string of every line (19 MB at 100,000
Messages: SQLite's buffer, then its copy into Python, ~9,300 fresh pages in a process that never
held that much) and the statement's single result row stays one step of SQLite, the GIL released
for all of it.

Compiled on first use with the machine's C compiler (`cc`, or `$CC`) against OpenSSL's
libcrypto into the native folder (`$AGENTHOST_NATIVE_DIR`, else the platform's user cache
folder), named by a hash of its source; loaded into each connection that digests a boundary.
Where it cannot be built or loaded (no compiler, no OpenSSL headers, `AGENTHOST_NO_LINE_DIGEST=1`)
the digest is `group_concat`'s string hashed in Python, as it always was: the same value.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from pathlib import Path

import apsw

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "line_digest.c"
ENTRY_POINT = "sqlite3_linedigest_init"
FUNCTION = "sha256_lines"
OPT_OUT = "AGENTHOST_NO_LINE_DIGEST"
"""Set to 1 to digest with `group_concat` and Python's hash (the same value)."""

_lock = threading.Lock()
_state: dict[str, str | None] = {"library": None, "unavailable": None}
_loaded: weakref.WeakSet[apsw.Connection] = weakref.WeakSet()


def native_dir() -> Path:
    explicit = os.environ.get("AGENTHOST_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("agenthost")) / "native"


def build(folder: Path | None = None, *, compiler: str | None = None) -> Path:
    """The compiled extension, built now if this source has not been built yet; raises OSError
    or RuntimeError (no compiler, a compile error or time-out) when it cannot be."""
    import hashlib

    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + os.uname().machine.encode()).hexdigest()[:16]
    folder = folder or native_dir()
    target = folder / f"line_digest-{digest}.so"
    if target.exists():
        return target
    import shutil
    import subprocess
    import tempfile

    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc) to build it")
    folder.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: two processes building at once each produce a
    # whole library, and the rename is atomic.
    fd, partial = tempfile.mkstemp(prefix=".line_digest-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        try:
            out = subprocess.run(
                [cc, "-shared", "-fPIC", "-O2", "-o", partial, str(SOURCE), "-lcrypto"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except subprocess.SubprocessError as exc:  # a hung compiler: one error type for callers
            raise RuntimeError(f"{cc} failed: {exc}") from exc
        if out.returncode != 0:
            raise RuntimeError(f"{cc} failed: {out.stderr.strip()[-500:]}")
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def library() -> str | None:
    """The extension's path, built once per process (None when it cannot be: said once)."""
    with _lock:
        if _state["library"] is None and _state["unavailable"] is None:
            if os.environ.get(OPT_OUT) == "1":
                _state["unavailable"] = f"turned off ({OPT_OUT}=1)"
            else:
                try:
                    _state["library"] = str(build())
                except (OSError, RuntimeError) as exc:
                    _state["unavailable"] = f"could not be built: {exc}"
            if _state["unavailable"] is not None:
                log.warning(
                    "the boundary digest is hashed in Python (%s): the same value, with the"
                    " boundary's lines held as one string",
                    _state["unavailable"],
                )
        return _state["library"]


def hashes_in_sqlite(conn: apsw.Connection) -> bool:
    """Whether `sha256_lines` can run on `conn`: the extension loaded into it now if not yet."""
    if conn in _loaded:
        return True
    path = library()
    if path is None or _state["unavailable"] is not None:
        return False
    with _lock:
        if conn in _loaded:
            return True
        try:
            conn.enable_load_extension(True)
            try:
                conn.load_extension(path, ENTRY_POINT)
            finally:
                conn.enable_load_extension(False)
        except apsw.Error as exc:
            if _state["unavailable"] is None:
                _state["unavailable"] = f"could not be loaded: {exc}"
                log.warning("the boundary digest is hashed in Python (%s)", _state["unavailable"])
            return False
        _loaded.add(conn)
        return True
