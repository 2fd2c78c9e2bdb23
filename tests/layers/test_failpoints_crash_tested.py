"""Every failpoint docs/protocol.md names is killed at by a crash test that checks the store's
laws after it, and every point a crash test kills at is documented. A crash test is found by one
rule, not a list, so a new one is never missed: any module under tests/ that arms a point `kill`
(a `kill` or `once:kill` literal, or one ending `=once:kill`: `AGENTHOST_FAILPOINTS`) and checks
the laws (names `assert_invariants` or `check_invariants`). The points it kills at: every
failpoint name it spells (in a table, a tuple key of one, a parameter, a local), but a name
spelled only as the key of a dict that arms another action (`once:error`, `once:sleep:…`,
`off`). A new failpoint cannot land without its crash test. And every one is a site of the code:
arming a name no site hits is no error (`drivers/failpoints.py` knows no names), so a site
renamed would leave the soak arming a point that never fires."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITES = ("agenthost", "actors", "drivers", "storage", "transport", "workspace", "tutti_agent")
"""The packages whose code hits failpoints (`Failpoints.hit`, by a literal name, a name bound
to a constant, or an f-string such as `host.checkpoint.{which}`)."""
PROTOCOL = ROOT / "docs" / "protocol.md"
TESTS = ROOT / "tests"
POINT = re.compile(r"`((?:host|worker)\.[a-z_]+(?:\.[a-z_]+)+)`")
NAME = re.compile(POINT.pattern.strip("`"))
KILLS = ("kill", "once:kill")
CHECKS = ("assert_invariants", "check_invariants")


def documented(text: str) -> set[str]:
    """The failpoint names of the `## Failpoints` section of `text` (protocol.md)."""
    section = text.split("\n## Failpoints\n", 1)[1].split("\n## ", 1)[0]
    return set(POINT.findall(section))


def kills_in(source: str) -> set[str] | None:
    """The points the module `source` kills at, None when it is no crash test (it arms no
    point `kill` or checks no law)."""
    tree = ast.parse(source)
    strings = [
        n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    arms_a_kill = any(n.value in KILLS or n.value.endswith("=once:kill") for n in strings)
    checks = any(isinstance(n, ast.Name) and n.id in CHECKS for n in ast.walk(tree))
    if not (arms_a_kill and checks):
        return None
    other_action: set[int] = set()  # the keys of dicts that arm a point anything but `kill`
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(value, ast.Constant) and value.value not in KILLS:
                    other_action.add(id(key))
    return {n.value for n in strings if NAME.fullmatch(n.value) and id(n) not in other_action}


@functools.cache
def crash_tests() -> dict[str, set[str]]:
    """Every crash-test module under tests/ (its path) → the points it kills at (read once: the
    tests below each ask)."""
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        points = kills_in(path.read_text())
        if points is not None:
            found[str(path.relative_to(ROOT))] = points
    return found


def killed_at() -> set[str]:
    return set().union(*crash_tests().values())


def test_the_scan_reads_points_from_the_failpoints_section_and_every_crash_test() -> None:
    text = "## Methods\n`host.status`\n## Failpoints\nNames: `host.a.b`, `worker.c.d`.\n## Next\n"
    assert documented(text) == {"host.a.b", "worker.c.d"}
    crash = (
        'CELLS = {("adopt", "host.a.b"): "unknown"}\n'
        "def test(c) -> None:\n"
        '    point = "worker.c.d"\n'
        '    c.call("debug.failpoints", {"points": {"host.e.f": "once:error"}})\n'
        '    c.call("debug.failpoints", {"points": {point: "once:kill"}})\n'
        "    assert_invariants(c)\n"
    )
    assert kills_in(crash) == {"host.a.b", "worker.c.d"}  # not the one armed `once:error`
    assert kills_in(crash.replace("assert_invariants", "print")) is None  # no law checked
    assert kills_in(crash.replace('"once:kill"', '"once:error"')) is None  # nothing killed
    assert kills_in('DaemonProcess(h, failpoints=f"{p}=once:kill"); check_invariants(h)') == set()
    # The real crash tests, wherever they live: the fork matrix, the named cases, the soak,
    # the resolve's matrix (its cells keyed by action and point), the worktree's column.
    found = crash_tests()
    for module, point in (
        ("tests/reliability/test_crash_matrix.py", "host.fork.after_prepare"),
        ("tests/reliability/test_crash_points.py", "worker.session.after_start"),
        ("tests/reliability/test_crash_soak.py", "worker.session.after_start"),
        ("tests/daemon/test_fork_resolve_crash.py", "host.resolve.after_quarantine"),
        ("tests/reliability/test_crash_worktree.py", "host.workspace.after_materialize"),
    ):
        assert point in found.get(module, set()), (module, point, sorted(found))
    assert "host.fork.after_prepare" in documented(PROTOCOL.read_text())


def test_every_documented_failpoint_is_killed_at_by_a_crash_test() -> None:
    missing = sorted(documented(PROTOCOL.read_text()) - killed_at())
    assert not missing, (
        "failpoints named in docs/protocol.md that no crash test kills at (add a case to "
        f"tests/reliability/test_crash_points.py): {missing}"
    )


def test_every_point_a_crash_test_kills_at_is_documented() -> None:
    unknown = {m: sorted(p - documented(PROTOCOL.read_text())) for m, p in crash_tests().items()}
    unknown = {m: p for m, p in unknown.items() if p}
    assert not unknown, f"crash tests kill at points docs/protocol.md does not name: {unknown}"


def site_names(source: str) -> set[str]:
    """The failpoint names `source` spells: its string constants that look like one, and its
    f-strings that begin as one (`host.`, `worker.`) as patterns (each `{…}` one segment)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        head = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else None
        if isinstance(head, ast.Constant) and str(head.value).startswith(("host.", "worker.")):
            assert isinstance(node, ast.JoinedStr)
            parts = [
                re.escape(v.value) if isinstance(v, ast.Constant) else "[a-z_]+"
                for v in node.values
            ]
            found.add("".join(parts))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(POINT.pattern.strip("`"), node.value)
        ):
            found.add(re.escape(node.value))
    return found


def unhit(documented: set[str], sources: list[str]) -> list[str]:
    patterns = [re.compile(p) for source in sources for p in site_names(source)]
    return sorted(n for n in documented if not any(p.fullmatch(n) for p in patterns))


def test_every_documented_failpoint_is_a_site_of_the_code() -> None:
    sources = [path.read_text() for pkg in SITES for path in sorted((ROOT / pkg).rglob("*.py"))]
    # The scan sees a literal, and an f-string's name; a name no site spells is reported.
    fake = ['hit("host.a.b")', 'hit(f"host.c.{which}")', 'version = f"{a}.{b}.{c}"']
    assert unhit({"host.a.b", "host.c.after", "host.d.e"}, fake) == ["host.d.e"]
    missing = unhit(documented(PROTOCOL.read_text()), sources)
    assert not missing, (
        "failpoints named in docs/protocol.md that no code hits (a renamed or removed site:"
        f" the crash tests would arm a name that never fires): {missing}"
    )
