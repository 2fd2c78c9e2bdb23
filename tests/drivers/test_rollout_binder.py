"""The host_copy rollout binder, one test per rule of seed 000 §7/§10: exact copy,
idempotence, identity checks, keep/repair/diverge, archived targets, corrupt sources, symlinks,
Referenced lineage, and that every refusal writes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from drivers.binder import (
    BindAction,
    BinderError,
    BindFailure,
    RolloutBinder,
    iter_rollouts,
    parse_rollout,
)
from drivers.errors import FailpointError
from drivers.failpoints import Failpoints

CHILD = "01a228cc-0615-7000-9287-053cd6fa8a8d"
PARENT = "01a228cc-0375-7000-bfc2-d5c618808a77"
REL = Path("sessions/2026/11/29")


def rollout_bytes(
    thread_id: str,
    lines: int,
    *,
    start: int = 0,
    forked_from: str | None = None,
    ordinal_exclusive: int | None = None,
    tag: str = "src",
) -> bytes:
    meta: dict[str, object] = {"id": thread_id, "cwd": "/w"}
    if forked_from:
        meta["forked_from_id"] = forked_from
    if ordinal_exclusive is not None:
        meta["forked_from_ordinal_exclusive"] = ordinal_exclusive
    out = [{"timestamp": "t", "ordinal": start, "type": "session_meta", "payload": meta}]
    for i in range(1, lines):
        out.append(
            {
                "timestamp": "t",
                "ordinal": start + i,
                "type": "response_item",
                "payload": {"type": "message", "text": f"{tag}-{i}"},
            }
        )
    return b"".join(json.dumps(o).encode() + b"\n" for o in out)


def put(home: Path, thread_id: str, data: bytes, *, rel: Path = REL) -> Path:
    path = home / rel / f"rollout-2026-11-29T19-33-09-{thread_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def homes(tmp_path: Path) -> tuple[Path, Path]:
    src, dst = tmp_path / "a" / "tutti-agent-home", tmp_path / "b" / "tutti-agent-home"
    src.mkdir(parents=True)
    dst.mkdir(parents=True)
    return src, dst


def snapshot(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in home.rglob("*") if p.is_file()}


def refuse(binder: RolloutBinder, src: Path, dst: Path, failure: BindFailure) -> None:
    before = snapshot(dst)
    with pytest.raises(BinderError) as info:
        binder.bind(src, dst, CHILD)
    assert info.value.failure is failure
    assert snapshot(dst) == before  # every refusal writes nothing


def test_exact_copy_lands_at_the_same_relative_path_with_a_matching_receipt(
    homes: tuple[Path, Path],
) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 5)
    source = put(src, CHILD, data)
    receipt = RolloutBinder().bind(src, dst, CHILD)
    target = dst / source.relative_to(src)
    assert target.read_bytes() == data
    [r] = receipt.rollouts
    assert r.action is BindAction.COPIED and r.role == "child"
    assert (r.source_size, r.target_size) == (len(data), len(data))
    assert r.source_sha256 == r.target_sha256
    assert r.relative_path == str(source.relative_to(src))
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


def test_rebinding_is_idempotent_and_rewrites_nothing(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    binder = RolloutBinder()
    binder.bind(src, dst, CHILD)
    [target] = list(iter_rollouts(dst))
    inode = target.stat().st_ino
    again = binder.bind(src, dst, CHILD)
    assert again.rollouts[0].action is BindAction.IDENTICAL
    assert target.stat().st_ino == inode


def test_source_whose_session_meta_names_another_thread_is_refused(
    homes: tuple[Path, Path],
) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(PARENT, 3))  # file name says CHILD, content says PARENT
    refuse(RolloutBinder(), src, dst, BindFailure.SOURCE_IDENTITY_MISMATCH)


def test_target_with_other_metadata_at_the_same_path_is_refused(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    meta = json.loads(rollout_bytes(CHILD, 1))
    meta["payload"]["cwd"] = "/elsewhere"
    put(dst, CHILD, json.dumps(meta).encode() + b"\n")
    refuse(RolloutBinder(), src, dst, BindFailure.TARGET_DIVERGED)


def test_target_with_a_torn_tail_that_is_a_source_prefix_is_repaired(
    homes: tuple[Path, Path],
) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 6)
    put(src, CHILD, data)
    cut = data.index(b"\n", data.index(b"\n") + 1) + 10  # two lines and a partial third
    target = put(dst, CHILD, data[:cut])
    receipt = RolloutBinder().bind(src, dst, CHILD)
    assert receipt.rollouts[0].action is BindAction.REPAIRED
    assert target.read_bytes() == data


def test_truncated_target_of_whole_lines_is_restored(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 6)
    put(src, CHILD, data)
    target = put(dst, CHILD, data[: data.index(b"\n") + 1])  # only session_meta survived
    assert RolloutBinder().bind(src, dst, CHILD).rollouts[0].action is BindAction.REPAIRED
    assert target.read_bytes() == data


def test_archived_target_is_repaired_in_place_not_duplicated(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 4)
    put(src, CHILD, data)
    archived = put(dst, CHILD, data[:-5], rel=Path("archived_sessions"))
    receipt = RolloutBinder().bind(src, dst, CHILD)
    assert receipt.rollouts[0].relative_path.startswith("archived_sessions/")
    assert archived.read_bytes() == data
    assert list(iter_rollouts(dst)) == [archived]


def test_target_whose_identity_cannot_be_proven_is_refused(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 4)
    put(src, CHILD, data)
    put(dst, CHILD, data[:20])  # a strict prefix, but not even one complete line
    refuse(RolloutBinder(), src, dst, BindFailure.TARGET_IDENTITY_UNDETECTABLE)


def test_post_fork_appends_in_the_target_are_kept(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 3)
    put(src, CHILD, data)
    grown = rollout_bytes(CHILD, 6)
    assert grown.startswith(data)
    target = put(dst, CHILD, grown)
    assert RolloutBinder().bind(src, dst, CHILD).rollouts[0].action is BindAction.KEPT
    assert target.read_bytes() == grown


def test_post_fork_history_with_a_corrupt_tail_is_never_rolled_back(
    homes: tuple[Path, Path],
) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 3)
    put(src, CHILD, data)
    put(dst, CHILD, rollout_bytes(CHILD, 6) + b'{"timestamp": "t", "ordi')
    refuse(RolloutBinder(), src, dst, BindFailure.TARGET_POST_FORK_CORRUPT)


def test_divergent_target_is_refused(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 4, tag="source"))
    put(dst, CHILD, rollout_bytes(CHILD, 4, tag="other"))
    refuse(RolloutBinder(), src, dst, BindFailure.TARGET_DIVERGED)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: d[:-3],  # torn last line
        lambda d: d.replace(b'"ordinal": 2', b'"ordinal": 1'),  # ordinals not increasing
        lambda d: d + b"not json\n",
        lambda d: d + b"[1, 2]\n",
        lambda d: b"\n".join(reversed(d.rstrip(b"\n").split(b"\n"))) + b"\n",  # meta not first
        # Lines that are not exactly one value each, though the text reads as JSON across
        # them (the validator scans the whole file's text, line by line).
        lambda d: d.replace(b', "type": "response_item"', b',\n"type": "response_item"', 1),
        lambda d: (
            d.rstrip(b"\n") + b' {"timestamp": "t", "ordinal": 9, "type": "x", "payload": {}}\n'
        ),  # two objects on one line
        lambda d: d.replace(b"\n", b"\n\n", 1),  # an empty line
    ],
)
def test_corrupt_source_is_refused(homes: tuple[Path, Path], corrupt) -> None:  # type: ignore[no-untyped-def]
    src, dst = homes
    put(src, CHILD, corrupt(rollout_bytes(CHILD, 4)))
    refuse(RolloutBinder(), src, dst, BindFailure.SOURCE_ROLLOUT_CORRUPT)


def test_symlinked_target_rollout_is_refused(homes: tuple[Path, Path], tmp_path: Path) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 3)
    put(src, CHILD, data)
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(data[:10])
    link = dst / REL / f"rollout-2026-11-29T19-33-09-{CHILD}.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    refuse(RolloutBinder(), src, dst, BindFailure.SYMLINKED_PATH)
    assert elsewhere.read_bytes() == data[:10]


def test_symlinked_target_ancestor_is_refused(homes: tuple[Path, Path], tmp_path: Path) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    real = tmp_path / "real-sessions"
    real.mkdir()
    (dst / "sessions").symlink_to(real)
    refuse(RolloutBinder(), src, dst, BindFailure.SYMLINKED_PATH)
    assert not any(real.rglob("*"))


def test_symlinked_target_home_is_refused(homes: tuple[Path, Path], tmp_path: Path) -> None:
    src, _ = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    real = tmp_path / "real-home"
    real.mkdir()
    link = tmp_path / "linked-home"
    link.symlink_to(real)
    with pytest.raises(BinderError) as info:
        RolloutBinder().bind(src, link, CHILD)
    assert info.value.failure is BindFailure.SYMLINKED_PATH
    assert not any(real.rglob("*"))


def test_symlinked_source_home_is_refused(homes: tuple[Path, Path], tmp_path: Path) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    link = tmp_path / "src-link"
    link.symlink_to(src)
    refuse(RolloutBinder(), link, dst, BindFailure.SYMLINKED_PATH)


def test_missing_source_with_a_valid_target_is_accepted_as_is(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 3)
    put(dst, CHILD, data)
    receipt = RolloutBinder().bind(src, dst, CHILD)
    assert receipt.rollouts[0].action is BindAction.KEPT
    assert receipt.rollouts[0].source_sha256 is None


def test_missing_source_and_missing_target_is_refused(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    refuse(RolloutBinder(), src, dst, BindFailure.SOURCE_ROLLOUT_MISSING)


def test_two_source_rollouts_for_one_thread_are_ambiguous(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    put(src, CHILD, rollout_bytes(CHILD, 3), rel=Path("sessions/2026/11/30"))
    refuse(RolloutBinder(), src, dst, BindFailure.SOURCE_ROLLOUT_AMBIGUOUS)


@pytest.mark.parametrize(
    "rel",
    [
        Path("sessions/2026/12/03"),  # another day, as a source home grows
        Path("archived_sessions"),
        Path("sessions/2026/11/29/deeper/still"),  # below the day, off the provider's layout
        Path("sessions/rollout-2026-11-29T19-33-09-dir.jsonl"),  # inside a rollout-named dir
    ],
)
@pytest.mark.parametrize("side", ["source", "target"])
def test_a_second_rollout_of_the_thread_anywhere_under_a_home_fails_the_bind(
    homes: tuple[Path, Path], rel: Path, side: str
) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    for i in range(40):  # the other children a source home holds, listed beside it
        other = f"01a228cc-0615-7000-9287-{i:012d}"
        put(src, other, rollout_bytes(other, 2))
    if side == "target":
        put(dst, CHILD, rollout_bytes(CHILD, 3))
    put(src if side == "source" else dst, CHILD, rollout_bytes(CHILD, 3), rel=rel)
    failure = (
        BindFailure.SOURCE_ROLLOUT_AMBIGUOUS
        if side == "source"
        else BindFailure.TARGET_ROLLOUT_AMBIGUOUS
    )
    refuse(RolloutBinder(), src, dst, failure)


def test_a_directory_the_lookup_cannot_list_fails_the_bind(
    homes: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stray below a directory that cannot be listed would go unseen: the bind fails
    (`os.walk` skipped such a directory). The tests run as root, whom no mode bit refuses,
    so the refusal is the kernel's error injected at the listing of that one directory."""
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    hidden = src / "sessions" / "2026" / "12"
    hidden.mkdir(parents=True)
    real = os.scandir

    def scandir(path: str) -> object:
        if os.path.abspath(path) == str(hidden):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    refuse(RolloutBinder(), src, dst, BindFailure.IO_ERROR)


def test_a_linked_directory_is_not_descended_and_a_linked_rollout_is_refused(
    homes: tuple[Path, Path], tmp_path: Path
) -> None:
    src, dst = homes
    elsewhere = tmp_path / "elsewhere"
    put(elsewhere, CHILD, rollout_bytes(CHILD, 3))
    (src / "sessions").mkdir()
    (src / "sessions" / "2026").symlink_to(elsewhere / "sessions" / "2026")
    refuse(RolloutBinder(), src, dst, BindFailure.SOURCE_ROLLOUT_MISSING)
    day = src / "archived_sessions"
    day.mkdir()
    (day / f"rollout-2026-11-29T19-33-09-{CHILD}.jsonl").symlink_to(
        next(elsewhere.rglob("rollout-*.jsonl"))
    )
    refuse(RolloutBinder(), src, dst, BindFailure.SYMLINKED_PATH)


def test_lookup_is_exact_and_ignores_ids_that_merely_end_alike(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    put(src, "x" + CHILD, rollout_bytes("x" + CHILD, 3))
    refuse(RolloutBinder(), src, dst, BindFailure.SOURCE_ROLLOUT_MISSING)


def test_referenced_child_brings_its_ancestor_rollouts(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    grand = "01a228cc-0000-7000-8000-000000000001"
    put(src, grand, rollout_bytes(grand, 4))
    put(src, PARENT, rollout_bytes(PARENT, 3, start=4, forked_from=grand, ordinal_exclusive=4))
    put(src, CHILD, rollout_bytes(CHILD, 2, start=7, forked_from=PARENT, ordinal_exclusive=7))
    receipt = RolloutBinder().bind(src, dst, CHILD)
    assert [(r.thread_id, r.role) for r in receipt.rollouts] == [
        (CHILD, "child"),
        (PARENT, "ancestor"),
        (grand, "ancestor"),
    ]
    assert snapshot(dst) == snapshot(src)


def test_copied_child_does_not_need_its_parent(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    # A Copied fork names its parent but starts at ordinal 0 and holds its whole history.
    put(src, CHILD, rollout_bytes(CHILD, 4, forked_from=PARENT))
    receipt = RolloutBinder().bind(src, dst, CHILD)
    assert [r.thread_id for r in receipt.rollouts] == [CHILD]


def test_referenced_child_with_a_missing_ancestor_is_refused(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 2, start=5, forked_from=PARENT, ordinal_exclusive=5))
    refuse(RolloutBinder(), src, dst, BindFailure.SOURCE_ROLLOUT_MISSING)


def test_ancestor_shorter_than_the_referenced_prefix_is_refused(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    put(src, PARENT, rollout_bytes(PARENT, 3))  # ordinals 0..2
    put(src, CHILD, rollout_bytes(CHILD, 2, start=5, forked_from=PARENT, ordinal_exclusive=5))
    refuse(RolloutBinder(), src, dst, BindFailure.LINEAGE_INCOMPLETE)


def test_failpoint_before_copy_stops_the_bind_with_nothing_written(
    homes: tuple[Path, Path],
) -> None:
    src, dst = homes
    put(src, CHILD, rollout_bytes(CHILD, 3))
    binder = RolloutBinder(Failpoints({"worker.bind.before_copy": "error"}))
    with pytest.raises(FailpointError):
        binder.bind(src, dst, CHILD)
    assert list(iter_rollouts(dst)) == []


def test_failpoint_after_copy_fires_once_the_copy_is_in_place(homes: tuple[Path, Path]) -> None:
    src, dst = homes
    data = rollout_bytes(CHILD, 3)
    put(src, CHILD, data)
    binder = RolloutBinder(Failpoints({"worker.bind.after_copy": "error"}))
    with pytest.raises(FailpointError):
        binder.bind(src, dst, CHILD)
    [target] = list(iter_rollouts(dst))
    assert target.read_bytes() == data
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o600)


def test_a_line_with_whitespace_around_its_one_object_is_valid() -> None:
    """The validator's fast path scans each line's value where it starts; a line with
    spaces around its object still validates (as `json.loads` of the line would), and the
    records are what a per-line `json.loads` returns."""
    from drivers.binder import parse_rollout

    data = rollout_bytes(CHILD, 4)
    lines = data.rstrip(b"\n").split(b"\n")
    padded = b"\n".join([lines[0], b"  " + lines[1] + b" \t", *lines[2:]]) + b"\n"
    parsed = parse_rollout(padded, CHILD)
    assert list(parsed.records) == [json.loads(line) for line in lines]
    assert parsed.meta.last_ordinal == 3


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (b'"a string"', "not a JSON object"),
        (b"null", "not a JSON object"),
        (b"5", "not a JSON object"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"ordinal": 9, "type": "x", "payload": {}}', "lacks 'timestamp'"),
        (b'{"timestamp": "t", "type": "x", "payload": {}}', "lacks 'ordinal'"),
        (b'{"timestamp": "t", "ordinal": 9, "payload": {}}', "lacks 'type'"),
        (b'{"timestamp": "t", "ordinal": 9, "type": "x"}', "lacks 'payload'"),
        (b'{"timestamp": "t", "ordinal": true, "type": "x", "payload": {}}', "not an integer"),
        (b'{"timestamp": "t", "ordinal": 9.0, "type": "x", "payload": {}}', "not an integer"),
        (b'{"timestamp": "t", "ordinal": 9, "type": 1, "payload": {}}', "bad type or payload"),
        (b'{"timestamp": "t", "ordinal": 9, "type": "x", "payload": []}', "bad type or payload"),
    ],
)
def test_each_line_that_is_no_rollout_record_is_refused_with_its_defect_named(
    line: bytes, named: str
) -> None:
    data = rollout_bytes(CHILD, 3) + line + b"\n"
    last = data.count(b"\n")
    with pytest.raises(ValueError, match=rf"^line {last}: .*{named}"):
        parse_rollout(data, CHILD)
