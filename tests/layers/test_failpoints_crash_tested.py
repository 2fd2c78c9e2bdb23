"""Every failpoint docs/protocol.md names is killed at by a crash test that checks the store's
laws after it: a cell of the fork matrix (tests/reliability/test_crash_matrix.py), a case of
tests/reliability/test_crash_points.py, or a point the crash soak arms `once:kill`. A new
failpoint cannot land without its crash test. And every one is a site of the code: arming a
name no site hits is no error (`drivers/failpoints.py` knows no names), so a site renamed
would leave the soak arming a point that never fires."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITES = ("agenthost", "actors", "drivers", "storage", "transport", "workspace", "tutti_agent")
"""The packages whose code hits failpoints (`Failpoints.hit`, by a literal name, a name bound
to a constant, or an f-string such as `host.checkpoint.{which}`)."""
PROTOCOL = ROOT / "docs" / "protocol.md"
RELIABILITY = ROOT / "tests" / "reliability"
POINT = re.compile(r"`((?:host|worker)\.[a-z_]+(?:\.[a-z_]+)+)`")
# Where each crash test keeps the points it kills at: module, then the names bound to a
# tuple of names or to a dict keyed by them.
TABLES = {
    "test_crash_matrix.py": ("HOST", "WORKER"),
    "test_crash_points.py": ("CASES",),
    "test_crash_soak.py": ("POINTS",),
}


def documented(text: str) -> set[str]:
    """The failpoint names of the `## Failpoints` section of `text` (protocol.md)."""
    section = text.split("\n## Failpoints\n", 1)[1].split("\n## ", 1)[0]
    return set(POINT.findall(section))


def named_in(source: str, names: tuple[str, ...]) -> set[str]:
    """The string constants of the tuples, or the keys of the dicts, bound at module level to
    `names` in `source`."""
    found: set[str] = set()
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id in names):
            continue
        value = node.value
        items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
        found |= {i.value for i in items if isinstance(i, ast.Constant)}
    return found


def killed_at() -> set[str]:
    return set().union(
        *(named_in((RELIABILITY / module).read_text(), names) for module, names in TABLES.items())
    )


def test_the_scan_reads_points_from_the_failpoints_section_and_the_tables() -> None:
    text = "## Methods\n`host.status`\n## Failpoints\nNames: `host.a.b`, `worker.c.d`.\n## Next\n"
    assert documented(text) == {"host.a.b", "worker.c.d"}
    source = 'X: dict[str, int] = {"host.a.b": 1}\nY = ("worker.c.d",)\nZ = ("host.e.f",)\n'
    assert named_in(source, ("X", "Y")) == {"host.a.b", "worker.c.d"}
    # The real files: the fork matrix's own points are found in both.
    assert "host.fork.after_prepare" in documented(PROTOCOL.read_text())
    assert "host.fork.after_prepare" in killed_at()


def test_every_documented_failpoint_is_killed_at_by_a_crash_test() -> None:
    missing = sorted(documented(PROTOCOL.read_text()) - killed_at())
    assert not missing, (
        "failpoints named in docs/protocol.md that no crash test kills at (add a case to "
        f"tests/reliability/test_crash_points.py): {missing}"
    )


def test_every_point_a_crash_test_kills_at_is_documented() -> None:
    unknown = sorted(killed_at() - documented(PROTOCOL.read_text()))
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
