"""The quarantine folder of `fork.resolve` abandon, shared by every provider's resolution:
`<provider home>/quarantine/<operationId>/<the file's path in the home>`, files moved there
whole (a rename on one filesystem, its directory fsync'd), never deleted."""

from __future__ import annotations

import os
from pathlib import Path

from domain.worker_messages import ResolveRequest
from drivers.binder import fsync_dir
from drivers.errors import DriverError

QUARANTINE_DIR = "quarantine"


def quarantine_operation_id(request: ResolveRequest) -> str:
    """The operation id that names a quarantine folder: present, and one path component."""
    op_id = request.operation_id
    if not op_id or "/" in op_id or op_id.startswith("."):
        raise DriverError("quarantine needs the operation id")
    return op_id


def move_to_quarantine(home: Path, op_id: str, path: Path) -> str:
    """Move one child file of `home` aside to `<home>/quarantine/<op_id>/<its relative path>`:
    atomically (a rename on one filesystem) and durably (its new directory fsync'd)."""
    dest = home / QUARANTINE_DIR / op_id / path.relative_to(home)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, dest)
    fsync_dir(dest.parent)
    return str(dest)
