"""Worker side of `fork.resolve` (issue 21 §1) for the app-server drivers (Tutti Agent and
Codex): find the provider children an `unknown` fork may have left, adopt one with the same
idempotent binder a fork uses, or move them aside into a quarantine folder.

Never calls `thread/fork`. The worker methods are `fork.inspect`, `fork.adopt` and
`fork.quarantine`; each takes a `domain.worker_messages.ResolveRequest` (`fork.adopt` a
`ResolveAdopt`: the same plus `childId`) and answers a `ResolveInspection`, a `ForkResult` or a
`ResolveQuarantined`; `dispatch` reads and writes their wire maps, the handlers see the types.

A child "of this operation" is a rollout whose `session_meta` names the source as
`forked_from_id`, found in the source home (where `thread/fork` writes it) or the target home
(where the binder copies it), not claimed by another operation (`excludeChildIds`: the host
passes every provider child its other operations recorded), and attributed to it by its Turns
(`ResolveRequest.attributes`: the frozen prefix, or no other operation that could own it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from domain.enums import DeliveryDisposition
from domain.worker_messages import (
    ForkBinding,
    ForkChild,
    ForkResult,
    ResolveAdopt,
    ResolvedChild,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
)
from drivers.errors import DriverError
from drivers.rollout_files import ROLLOUT_DIRS, BinderError, fsync_dir, iter_rollouts

QUARANTINE_DIR = "quarantine"
METHODS = (ResolveRequest.INSPECT, ResolveAdopt.METHOD, ResolveRequest.QUARANTINE)


def dispatch(driver: Any, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's entry: reads the request's type, runs the provider's handler (Claude's
    `drivers.claude_resolution`, the app-server drivers' this module; any other driver refuses,
    typed) and answers its result's wire map."""
    on_inspect: Callable[[Any, ResolveRequest], ResolveInspection]
    on_adopt: Callable[[Any, ResolveAdopt], ForkResult]
    on_quarantine: Callable[[Any, ResolveRequest], ResolveQuarantined]
    if hasattr(driver, "_relocate_child") and hasattr(driver, "_verify_child"):
        from drivers import claude_resolution as claude

        on_inspect, on_adopt, on_quarantine = claude.inspect, claude.adopt, claude.quarantine
    elif hasattr(driver, "binder") and hasattr(driver, "_thread_turns"):
        on_inspect, on_adopt, on_quarantine = inspect, adopt, quarantine
    else:
        raise DriverError(f"{type(driver).__name__} cannot resolve fork operations")
    result: ResolveInspection | ForkResult | ResolveQuarantined
    if method == ResolveAdopt.METHOD:
        result = on_adopt(driver, ResolveAdopt.from_wire(params))
    elif method == ResolveRequest.INSPECT:
        result = on_inspect(driver, ResolveRequest.from_wire(params))
    else:
        result = on_quarantine(driver, ResolveRequest.from_wire(params))
    return result.to_wire()


def _meta(path: Path) -> Mapping[str, Any]:
    try:
        with path.open("rb") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return {}
    payload = first.get("payload") if isinstance(first, Mapping) else None
    return payload if isinstance(payload, Mapping) else {}


def _child_rollouts(home: Path, source_id: str, exclude: set[str]) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    if not str(home) or not home.is_dir():
        return out
    for path in iter_rollouts(home):
        meta = _meta(path)
        child = str(meta.get("id") or "")
        if meta.get("forked_from_id") == source_id and child and child not in exclude:
            out.setdefault(child, []).append(path)
    return out


def _params(request: ResolveRequest) -> tuple[Path, Path, str, list[str], set[str]]:
    source_home = Path(request.source.home)
    target_home = Path(request.target.home)
    source_id = request.source.provider_session_id
    prefix = list(request.provider_turn_ids)
    exclude = set(request.exclude_child_ids)
    if not source_home.is_absolute() or not target_home.is_absolute() or not source_id:
        raise DriverError("fork resolution needs absolute homes and the source thread id")
    return source_home, target_home, source_id, prefix, exclude


def _turns_in(driver: Any, home: Path, thread_id: str) -> list[str] | str:
    """The thread's provider Turn ids read by an app-server on `home` alone (the live one of
    that home if any, else a transient one), or why not."""
    live = driver._live_runtime_for_home(home)
    try:
        runtime = live or driver._spawn(home, None, None)
    except Exception as exc:  # noqa: BLE001 - evidence, not a failure of the inspection
        return str(exc)
    try:
        project = getattr(driver, "_project", None)
        if project is not None:
            # Codex loads a thread (and the ancestors it reads through) only once projected.
            from drivers.codex import rollout_lineage

            project(runtime, reversed(rollout_lineage(home, thread_id)))
        return [str(t.get("id")) for t in driver._thread_turns(runtime, thread_id)]
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    finally:
        if live is None:
            runtime.proc.close()


def inspect(driver: Any, request: ResolveRequest) -> ResolveInspection:
    source_home, target_home, source_id, prefix, exclude = _params(request)
    in_source = _child_rollouts(source_home, source_id, exclude)
    in_target = _child_rollouts(target_home, source_id, exclude)
    children = []
    for child in sorted(set(in_source) | set(in_target)):
        locations = [
            n for n, found in (("source", in_source), ("target", in_target)) if child in found
        ]
        # Read it where the provider wrote it (source home) or, failing that, the target's.
        turns = _turns_in(driver, source_home if child in in_source else target_home, child)
        if not request.attributes(tuple(turns) if isinstance(turns, list) else None):
            continue  # another operation's child (law 9): never this one's evidence
        own = _turns_in(driver, target_home, child) if child in in_target else "not in its home"
        children.append(
            ResolvedChild(
                provider_session_id=child,
                forked_from_id=source_id,
                provider_turn_ids=tuple(turns) if isinstance(turns, list) else (),
                read_error=None if isinstance(turns, list) else turns,
                reports_read_error=True,
                turns_equal_prefix=isinstance(turns, list) and turns == prefix,
                reads_from_own_home=isinstance(own, list) and own == prefix,
                locations=tuple(locations),
            )
        )
    quarantined = tuple(
        str(p)
        for home in (source_home, target_home)
        for p in sorted((home / QUARANTINE_DIR / (request.operation_id or "-")).rglob("*.jsonl"))
    )
    return ResolveInspection(tuple(children), quarantined)


def adopt(driver: Any, request: ResolveAdopt) -> ForkResult:
    """The idempotent binder on a verified child; answers like `fork` (`accepted` + evidence)."""
    source_home, target_home, source_id, prefix, exclude = _params(request.scope)
    child = request.child_id
    found = _child_rollouts(source_home, source_id, exclude)
    if child not in found and child not in _child_rollouts(target_home, source_id, exclude):
        raise DriverError(f"provider child {child!r} of this operation is not there")
    turns = _turns_in(driver, source_home if child in found else target_home, child)
    if turns != prefix:
        raise DriverError(f"provider child {child!r} does not show the frozen prefix: {turns}")
    if child in found:
        try:
            receipt = driver.binder.bind(source_home, target_home, child)
        except (BinderError, OSError) as exc:
            raise DriverError(f"provider-state binding failed: {exc}") from exc
        wire = receipt.to_wire()
    else:
        wire = {"childId": child, "sourceHome": str(source_home), "targetHome": str(target_home)}
    own = _turns_in(driver, target_home, child)
    if own != prefix:
        raise DriverError(f"adopted child not readable from its own home: {own}")
    wire["verifiedReadable"] = True
    wire["forkedFromId"] = source_id
    return ForkResult(
        DeliveryDisposition.ACCEPTED,
        child=ForkChild(child, source_id, tuple(prefix)),
        binding=ForkBinding(driver.binding_mode, wire),
    )


def quarantine(driver: Any, request: ResolveRequest) -> ResolveQuarantined:
    """Move the child rollouts the inspection attributed to this operation (`child_ids`)
    aside, never delete: `<home>/quarantine/<operationId>/<its relative path>`, atomically per
    file (rename on one filesystem). Any other child of the source stays where it is."""
    source_home, target_home, source_id, _, exclude = _params(request)
    op_id = quarantine_operation_id(request)
    wanted = set(request.child_ids)
    moved = []
    for home in (source_home, target_home):
        for child, paths in _child_rollouts(home, source_id, exclude).items():
            if child not in wanted:
                continue
            for path in paths:
                rel = path.relative_to(home)
                if rel.parts[0] not in ROLLOUT_DIRS:
                    continue
                moved.append(move_to_quarantine(home, op_id, path))
    return ResolveQuarantined(tuple(moved))


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
