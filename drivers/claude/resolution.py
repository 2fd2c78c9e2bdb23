"""Worker side of `fork.resolve` for Claude Code (provider_owned): the children
an `unknown` fork may have left are transcripts whose entries carry `forkedFrom.sessionId` =
the source, next to the source (where `fork_session` writes) or in the target's home (where
the driver moves it). Adopt finishes the driver's own relocation idempotently and runs its
verification (turn bindings from the child's transcript); quarantine moves transcripts to
`<home>/quarantine/<operationId>/projects/...`. Never calls `fork_session`. `ClaudeResolution`
is the part of `ClaudeDriver` its `inspect_fork`, `adopt_fork` and `quarantine_fork` delegate to."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from domain.enums import DeliveryDisposition
from domain.worker_messages import (
    ForkRequest,
    ForkResult,
    ResolveAdopt,
    ResolvedChild,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
)
from drivers.claude.fork import ClaudeFork, NotStarted
from drivers.claude_transcript import parse_entries, split_turns, transcript_path
from drivers.errors import DriverError
from drivers.quarantine import QUARANTINE_DIR, move_to_quarantine, quarantine_operation_id


def _forked_from(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if '"forkedFrom"' not in line:
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                forked = entry.get("forkedFrom") if isinstance(entry, Mapping) else None
                if isinstance(forked, Mapping) and isinstance(forked.get("sessionId"), str):
                    return str(forked["sessionId"])
    except OSError:
        return None
    return None


def _children(home: Path, source_id: str, exclude: set[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    if not str(home) or not home.is_dir():
        return out
    for path in sorted(home.glob("projects/*/*.jsonl")):
        if path.stem not in exclude and path.stem != source_id and _forked_from(path) == source_id:
            out[path.stem] = path
    return out


def _roots(path: Path) -> tuple[str, ...]:
    turns = split_turns(parse_entries(path.read_text(encoding="utf-8", errors="replace")))
    return tuple(str(t.root_forked_from) for t in turns)


def _request(resolve: ResolveRequest) -> tuple[ForkRequest, Path, Path, str, set[str]]:
    request = resolve.fork_request()
    src, tgt = request.source, request.target
    if not Path(src.home).is_absolute() or not Path(tgt.home).is_absolute():
        raise DriverError("fork resolution needs absolute homes")
    if not src.provider_session_id:
        raise DriverError("fork resolution needs the source provider session id")
    exclude = set(resolve.exclude_child_ids)
    return request, Path(src.home), Path(tgt.home), src.provider_session_id, exclude


class ClaudeResolution:
    """`fork.resolve` for Claude Code over the driver's fork strategy (its plan, its child
    placement and its verification, run again idempotently)."""

    def __init__(self, fork: ClaudeFork) -> None:
        self.fork = fork

    def inspect(self, resolve: ResolveRequest) -> ResolveInspection:
        request, source_home, target_home, source_id, exclude = _request(resolve)
        prefix = tuple(request.provider_turn_ids)
        in_source = _children(source_home, source_id, exclude)
        in_target = _children(target_home, source_id, exclude)
        out = []
        for child in sorted(set(in_source) | set(in_target)):
            path = in_target.get(child) or in_source[child]
            try:
                roots: tuple[str, ...] | None = _roots(path)
            except (OSError, ValueError):
                roots = None
            if not resolve.attributes(roots):
                continue  # another operation's child (law 9): never this one's evidence
            out.append(
                ResolvedChild(
                    provider_session_id=child,
                    forked_from_id=source_id,
                    provider_turn_ids=roots or (),
                    turns_equal_prefix=roots == prefix,
                    reads_from_own_home=child in in_target and roots == prefix,
                    locations=tuple(
                        n
                        for n, found in (("source", in_source), ("target", in_target))
                        if child in found
                    ),
                )
            )
        op_id = resolve.operation_id or "-"
        quarantined = tuple(
            str(p)
            for home in (source_home, target_home)
            for p in sorted((home / QUARANTINE_DIR / op_id).rglob("*.jsonl"))
        )
        return ResolveInspection(tuple(out), quarantined)

    def adopt(self, resolve: ResolveAdopt) -> ForkResult:
        request, source_home, target_home, source_id, exclude = _request(resolve.scope)
        child = resolve.child_id
        in_source = _children(source_home, source_id, exclude)
        in_target = _children(target_home, source_id, exclude)
        if child not in in_source and child not in in_target:
            raise DriverError(f"provider child {child!r} of this operation is not there")
        try:
            plan = self.fork.plan_fork(request)
        except NotStarted as exc:
            # The boundary cannot be planned again (the source's transcript gone, the SDK
            # changed): the child cannot be proven, and the driver says why, typed.
            raise DriverError(f"provider child {child!r} cannot be adopted: {exc}") from exc
        if child in in_source:
            dest = transcript_path(target_home, request.target.cwd or request.source.cwd, child)
            if dest.exists():
                # The move was cut between copy and unlink: finish it only if the copy is whole.
                if dest.read_bytes() != in_source[child].read_bytes():
                    raise DriverError(f"child {child} differs between source and target homes")
                in_source[child].unlink()
            else:
                self.fork.relocate_child(request, plan, child)
        result = self.fork.verify_child(request, plan, child)
        if result.disposition is not DeliveryDisposition.ACCEPTED:
            raise DriverError(f"adopted child does not verify: {result.error}")
        return result

    def quarantine(self, resolve: ResolveRequest) -> ResolveQuarantined:
        _, source_home, target_home, source_id, exclude = _request(resolve)
        op_id = quarantine_operation_id(resolve)
        wanted = set(resolve.child_ids)
        moved = []
        for home in (source_home, target_home):
            for child, path in _children(home, source_id, exclude).items():
                if child in wanted:  # only what the inspection attributed to this operation
                    moved.append(move_to_quarantine(home, op_id, path))
        return ResolveQuarantined(tuple(moved))
