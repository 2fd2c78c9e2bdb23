"""The design docs name code that exists: every source file they cite in backticks is in the
tree, every `bench.<module>` is in bench/, every `test_x.py::test_y` is a test of that file,
every `Class.member` docs/design/ names is a member of a class of that name (or of its bases),
the store methods docs/design/internals.md tabulates have the parameters it shows, the
failpoints docs/protocol.md lists are exactly the ones the code hits (and its actions exactly
`FailpointAction`'s), every "409 `reason`" the docs pair is a status the code answers that
reason with, every name the daemon gives a thread is in docs/design/overview.md's
thread table and the reverse, and docs/reliability.md's table of laws has one row per `Law` of
tests/support/invariants.py. A rename that leaves a doc behind fails here, not in a reader."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from domain import errors
from drivers.failpoints import FailpointAction
from storage.store import Store
from tests.support.invariants import Law

ROOT = Path(__file__).resolve().parents[2]
DESIGN_DOCS = (
    *sorted((ROOT / "docs" / "design").glob("*.md")),
    ROOT / "docs" / "reliability.md",
    ROOT / "docs" / "protocol.md",
    ROOT / "docs" / "providers.md",
    ROOT / "docs" / "tutti-agent.md",
)
# Where a failpoint may be hit: every production package but the client's.
HITTING = ("actors", "agenthost", "drivers", "storage", "workspace", "transport", "domain")
FAILPOINT = re.compile(r"(host|worker)(\.[a-z_]+){2,}")
SOURCE = re.compile(r"[\w./-]+\.(py|c)")


def _tree(source: str | ast.Module) -> ast.Module:
    return source if isinstance(source, ast.Module) else ast.parse(source)


def cited_sources(text: str) -> list[tuple[int, str]]:
    """(line, path) of every backticked source file (`x.py`, `a/b.c`, `a/b.py::test`)."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        for token in re.findall(r"`([^`\s]+)`", line):
            path = token.split("::", 1)[0]
            if SOURCE.fullmatch(path):
                found.append((number, path))
    return found


def missing_sources(cited: list[tuple[int, str]], files: set[str]) -> list[str]:
    """A path with a folder must end a file's path of the tree at a folder (`app_server/fork.py`
    in a list of drivers/' modules); a bare name must be some file's name."""
    ends = {file[i + 1 :] for file in files for i, c in enumerate(file) if c == "/"}
    return [f"{line}: {path}" for line, path in cited if path not in files | ends]


def class_members(source: str | ast.Module) -> dict[str, set[str]]:
    """Each class's members in `source`: its definitions, assignments, `self.x =` attributes,
    and `base:<Name>` for each base it names (followed by `has_member`)."""
    members: dict[str, set[str]] = {}
    for node in ast.walk(_tree(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        own = members.setdefault(node.name, set())
        own.update(f"base:{base.id}" for base in node.bases if isinstance(base, ast.Name))
        for item in ast.walk(node):
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(item.name)
            elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                own.add(item.id)
            elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                own.add(item.attr)
    return members


def has_member(members: dict[str, set[str]], cls: str, name: str) -> bool | None:
    """Whether `cls` (or a base it names) has `name`; None for a class the tree does not have."""
    if cls not in members:
        return None
    seen: set[str] = set()
    todo = [cls]
    while todo:
        current = todo.pop()
        if current in seen or current not in members:
            continue
        seen.add(current)
        if name in members[current]:
            return True
        todo += [m[len("base:") :] for m in members[current] if m.startswith("base:")]
    return False


def cited_members(text: str) -> list[tuple[int, str, str]]:
    """(line, class, member) of each backticked `Class.member` (`Store.write_stats`)."""
    return [
        (number, cls, name)
        for number, line in enumerate(text.splitlines(), 1)
        for token in re.findall(r"`([^`]+)`", line)
        for cls, name in re.findall(r"\b([A-Z][A-Za-z0-9]+)\.([a-z_][A-Za-z0-9_]*)\b", token)
    ]


def tree_sources() -> set[str]:
    skip = {"build", ".git", "node_modules"}
    return {
        path.relative_to(ROOT).as_posix()
        for suffix in ("*.py", "*.c")
        for path in ROOT.rglob(suffix)
        if not skip & set(path.relative_to(ROOT).parts)
    }


def hit_names(source: str | ast.Module) -> tuple[set[str], set[str]]:
    """The failpoint names a module spells, and its f-string ones as patterns (`{x}` → `*`)."""
    names: set[str] = set()
    patterns: set[str] = set()
    for node in ast.walk(_tree(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if FAILPOINT.fullmatch(node.value):
                names.add(node.value)
        elif isinstance(node, ast.JoinedStr):
            spelled = "".join(
                part.value if isinstance(part, ast.Constant) else "*" for part in node.values
            )
            if re.fullmatch(r"(host|worker)(\.[a-z_*]+){2,}", str(spelled)):
                patterns.add(str(spelled))
    return names, patterns


def documented_failpoints(protocol: str) -> tuple[set[str], set[str]]:
    """The names and the actions of docs/protocol.md's "## Failpoints" section."""
    section = protocol.split("\n## Failpoints\n", 1)[1].split("\n## ", 1)[0]
    actions_text = section.split("Actions", 1)[1].split("prefix", 1)[0]
    actions = set(re.findall(r"`([a-z]+)(?::<ms>)?`", actions_text)) - {"once"}
    names = set(re.findall(r"`((?:host|worker)(?:\.[a-z_]+){2,})`", section))
    return names, actions


def law_rows(reliability: str) -> set[str]:
    """The first column of docs/reliability.md's table headed "law (`Law`)"."""
    table = reliability.split("| law (`Law`) | checked as |", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE))


def documented_calls(text: str) -> list[tuple[int, str, str, list[str]]]:
    """(line, part, method, parameters) of each `part.method(a, *, b=1)` a table row opens with."""
    calls: list[tuple[int, str, str, list[str]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        cell = line.split("|")[1] if line.startswith("| `") else ""
        for part, method, params in re.findall(r"`([a-z_]+)\.([a-z_]+)\(([^`]*)\)`", cell):
            names = [p.strip() for p in params.split(",") if p.strip() not in ("", "*")]
            calls.append((number, part, method, names))
    return calls


def signature_problem(method: Callable[..., object], documented: list[str]) -> str | None:
    """Why `method` is not callable as documented: the documented parameters must be its first
    ones, in order (a capitalized one stands for a value of that type), with the defaults
    shown; the rest it leaves out must have defaults."""
    real = list(inspect.signature(method).parameters.values())
    if len(documented) > len(real):
        return f"documents {len(documented)} parameters, has {len(real)}"
    for shown, param in zip(documented, real, strict=False):
        name, _, default = (s.strip() for s in shown.partition("="))
        name = name.split(":", 1)[0].strip()
        if not name[0].isupper() and name != param.name:
            return f"documents {name!r} where it has {param.name!r}"
        if default and repr(param.default) != default.replace('"', "'"):
            return f"documents {name}={default}, its default is {param.default!r}"
    left = [p.name for p in real[len(documented) :] if p.default is inspect.Parameter.empty]
    return f"leaves out required {left}" if left else None


# The daemon process's code (a worker's and a client's threads are not the daemon's).
DAEMON_SIDE = ("actors", "agenthost", "storage", "workspace", "domain", "transport")
NOT_DAEMON = ("transport/client.py",)
NOT_DAEMON_CLASSES = frozenset({"WorkerEnd"})  # transport/worker_link.py's end in a worker


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def thread_names(source: str | ast.Module) -> set[str]:
    """The thread names `source` gives: `Thread(name="x")` → `x`; a `WakeOneThreads(n, "x")`
    pool → `x_<n>`; an `ActorPool(n, name="x")` → `x_<n>` and its timers' `x-timer`; a
    `pykka.ThreadingActor` subclass `A` → `A-<n>` (pykka's naming)."""
    names: set[str] = set()
    tree = _tree(source)
    outside = {  # what the bodies of the classes not of the daemon hold (the tree is shared)
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name in NOT_DAEMON_CLASSES
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in outside:
            continue
        if isinstance(node, ast.ClassDef) and any(
            isinstance(base, ast.Attribute) and base.attr == "ThreadingActor" for base in node.bases
        ):
            names.add(f"{node.name}-<n>")
        if not isinstance(node, ast.Call):
            continue
        callee = _callee(node)
        given = [
            k.value.value
            for k in node.keywords
            if k.arg == "name"
            and isinstance(k.value, ast.Constant)
            and isinstance(k.value.value, str)
        ]
        if callee == "Thread":
            names.update(given)
        elif callee == "WakeOneThreads" and len(node.args) > 1:
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(f"{arg.value}_<n>")
        elif callee == "ActorPool":
            names.update(n for name in given for n in (f"{name}_<n>", f"{name}-timer"))
    return names


def thread_table(overview: str) -> set[str]:
    """The first column of docs/design/overview.md's table headed "| thread |"."""
    table = overview.split("| thread | what it runs (where) |", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE))


PRODUCTION = (*DAEMON_SIDE, "drivers", "protocol", "tutti_agent", "client", "model_fakes")


def reason_statuses(source: str | ast.Module, typed: dict[str, int]) -> dict[str, set[int]]:
    """The statuses `source` raises each literal reason with: `Typed(…, reason="x")` for a
    typed error class `Typed` (its status from `typed`)."""
    found: dict[str, set[int]] = {}
    for node in ast.walk(_tree(source)):
        if isinstance(node, ast.Call) and _callee(node) in typed:
            for keyword in node.keywords:
                value = keyword.value
                if keyword.arg == "reason" and isinstance(value, ast.Constant):
                    found.setdefault(str(value.value), set()).add(typed[_callee(node)])
    return found


def typed_errors() -> dict[str, int]:
    """Each typed error class of `domain.errors` (a `HostError`) → its status."""
    return {
        value.__name__: value.status
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.HostError)
    }


def typed_in(tree: ast.Module) -> dict[str, int]:
    """The typed error classes `tree` may raise: `domain.errors`' and the module's own subclasses
    of them (drivers/errors.py's, subclasses elsewhere)."""
    local = typed_errors()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = getattr(base, "id", getattr(base, "attr", ""))
                if name in local:
                    local.setdefault(node.name, local[name])
    return local


@dataclass(frozen=True)
class Scanned:
    """What the scans below read in one production module: its tree parsed once for them all
    (most scan the same modules), and not kept (held, the trees' objects cost every garbage
    collection more than a parse)."""

    members: dict[str, set[str]]
    hits: tuple[set[str], set[str]]
    threads: set[str]
    reasons: dict[str, set[int]]


@functools.cache
def scanned(path: Path) -> Scanned:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return Scanned(
        class_members(tree),
        hit_names(tree),
        thread_names(tree),
        reason_statuses(tree, typed_in(tree)),
    )


def documented_statuses(text: str) -> list[tuple[int, int, str]]:
    """(line, status, reason) of each "409 `reason`" in `text`."""
    return [
        (number, int(status), reason)
        for number, line in enumerate(text.splitlines(), 1)
        for status, reason in re.findall(r"\b([45]0[0-9]) `([a-z_]+)`", line)
    ]


def test_the_scans_find_a_planted_mismatch() -> None:
    doc = "see `drivers/gone.py` and `base.py`, `tests/x.py::test_y`, `a.toml`\n"
    cited = cited_sources(doc)
    assert cited == [(1, "drivers/gone.py"), (1, "base.py"), (1, "tests/x.py")]
    assert missing_sources(cited, {"drivers/base.py", "tests/x.py"}) == ["1: drivers/gone.py"]
    code = 'hit("host.fork.after_x")\nhit(f"host.checkpoint.{which}")\nx = "host.name"\n'
    assert hit_names(code) == ({"host.fork.after_x"}, {"host.checkpoint.*"})
    protocol = (
        "x\n## Failpoints\n\nActions: `kill`, `sleep:<ms>`; a `once:` prefix fires once.\n"
        "Names: `host.fork.after_x`, `worker.bind.y` (`error` makes …).\n## Next\n`host.a.b`\n"
    )
    names = {"host.fork.after_x", "worker.bind.y"}
    assert documented_failpoints(protocol) == (names, {"kill", "sleep"})
    table = "| `turns.get(ws, sid, *, limit=100)` | x |\n| m | `a.b()` |\n"
    assert documented_calls(table) == [(1, "turns", "get", ["ws", "sid", "limit=100"])]

    def get(ws: str, sid: str, *, limit: int = 50, deep: bool = False) -> None: ...

    assert signature_problem(get, ["ws", "sid", "limit=50"]) is None
    assert signature_problem(get, ["ws", "sid", "limit=100"]) == (
        "documents limit=100, its default is 50"
    )
    assert signature_problem(get, ["ws", "turn"]) == "documents 'turn' where it has 'sid'"
    assert signature_problem(get, ["ws"]) == "leaves out required ['sid']"
    code = "class A(B):\n    x = 1\n    def f(self):\n        self.y = 2\nclass B:\n    z = 3\n"
    members = class_members(code)
    assert [has_member(members, "A", n) for n in ("x", "y", "z", "w")] == [True] * 3 + [False]
    assert has_member(members, "Nope", "x") is None
    cited = cited_members("see `Ab.x`, `store.db.y` and `Bc.w()`")
    assert cited == [(1, "Ab", "x"), (1, "Bc", "w")]
    assert cited_tests("`tests/a/test_b.py::test_c` and `test_d.py::test_e_…`") == [
        (1, "tests/a/test_b.py", "test_c"),
        (1, "test_d.py", "test_e_"),
    ]
    code = (
        "class H(pykka.ThreadingActor): ...\n"
        'class WorkerEnd:\n    def f(self): threading.Thread(name="w")\n'
        'threading.Thread(target=f, name="a-b")\nWakeOneThreads(4, "c-d")\n'
        'ActorPool(2, name="s")\nKey("t", "u", name="no-thread")\n'
    )
    assert thread_names(code) == {"H-<n>", "a-b", "c-d_<n>", "s_<n>", "s-timer"}
    overview = "| thread | what it runs (where) |\n|---|---|\n| `a-b` | x |\n| `s_<n>` | y |\n\n"
    assert thread_table(overview) == {"a-b", "s_<n>"}
    typed = {"Busy": 409, "Gone": 502}
    raised = 'raise Busy("x", reason="a_busy")\nGone(reason="a_gone")\nOther(reason="z")\n'
    assert reason_statuses(raised, typed) == {"a_busy": {409}, "a_gone": {502}}
    assert documented_statuses("answers 503 `a_gone`, then 409 `a_busy`") == [
        (1, 503, "a_gone"),
        (1, 409, "a_busy"),
    ]
    rows = "| law (`Law`) | checked as |\n|---|---|\n| `fence` | x |\n| `step_order` | y |\n\nz"
    assert law_rows(rows) == {"fence", "step_order"}


def test_every_source_file_a_design_doc_cites_exists() -> None:
    files = tree_sources()
    assert len(files) > 300
    problems: list[str] = []
    cited_count = 0
    for doc in DESIGN_DOCS:
        cited = cited_sources(doc.read_text(encoding="utf-8"))
        cited_count += len(cited)
        rel = doc.relative_to(ROOT).as_posix()
        problems += [f"{rel}:{problem}" for problem in missing_sources(cited, files)]
    assert cited_count > 300
    assert not problems, "cited but not in the tree:\n" + "\n".join(problems)


def cited_tests(text: str) -> list[tuple[int, str, str]]:
    """(line, file, test) of each backticked `path/test_x.py::test_y` (a `…` cut name: its
    start, `test_random_load_…` → `test_random_load_`)."""
    return [
        (number, path, name)
        for number, line in enumerate(text.splitlines(), 1)
        for path, name in re.findall(r"`([\w./-]*test_\w+\.py)::(\w+)", line)
    ]


def test_every_cited_test_is_defined_in_its_file() -> None:
    files = [name for name in tree_sources() if name.startswith("tests/")]
    problems: list[str] = []
    cited_count = 0
    for doc in DESIGN_DOCS:
        for line, path, name in cited_tests(doc.read_text(encoding="utf-8")):
            cited_count += 1
            where = [f for f in files if f == path or f.endswith(f"/{path}")]
            defined = re.compile(rf"def {re.escape(name)}" + ("" if name.endswith("_") else r"\b"))
            if not any(defined.search((ROOT / f).read_text(encoding="utf-8")) for f in where):
                problems.append(f"{doc.name}:{line}: {path}::{name}")
    assert cited_count > 30
    assert not problems, "no such test:\n" + "\n".join(problems)


def test_every_bench_module_a_doc_names_exists() -> None:
    named = {
        f"{doc.relative_to(ROOT).as_posix()}: bench.{module}"
        for doc in DESIGN_DOCS
        for module in re.findall(r"\bbench\.([a-z_]+)\b", doc.read_text(encoding="utf-8"))
        if not (ROOT / "bench" / f"{module}.py").exists() and not (ROOT / "bench" / module).is_dir()
    }
    assert not named, "no such bench module:\n" + "\n".join(sorted(named))


def test_every_class_member_a_design_page_names_exists() -> None:
    members: dict[str, set[str]] = {}
    for package in (*HITTING, "protocol", "tutti_agent", "client", "model_fakes", "tests", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if package in PRODUCTION:
                own_members = scanned(path).members
            else:
                own_members = class_members(path.read_text(encoding="utf-8"))
            for cls, own in own_members.items():
                members.setdefault(cls, set()).update(own)
    problems: list[str] = []
    checked = 0
    for doc in sorted((ROOT / "docs" / "design").glob("*.md")):
        for line, cls, name in cited_members(doc.read_text(encoding="utf-8")):
            found = has_member(members, cls, name)
            checked += found is not None
            if found is False:
                problems.append(f"{doc.name}:{line}: {cls}.{name}")
    assert checked > 50
    assert not problems, "no such member:\n" + "\n".join(problems)


def test_the_internals_store_tables_show_the_methods_as_they_are(tmp_path: Path) -> None:
    calls = documented_calls((ROOT / "docs" / "design" / "internals.md").read_text("utf-8"))
    problems: list[str] = []
    store = Store(tmp_path / "store.db")
    try:
        for line, part, method, params in calls:
            target = getattr(getattr(store, part, None), method, None)
            if target is None:
                problems.append(f"{line}: store.{part}.{method} does not exist")
            elif (problem := signature_problem(target, params)) is not None:
                problems.append(f"{line}: store.{part}.{method} {problem}")
    finally:
        store.close()
    assert len(calls) > 30
    assert not problems, "docs/design/internals.md:\n" + "\n".join(problems)


def test_the_documented_failpoints_are_exactly_the_ones_the_code_hits() -> None:
    names: set[str] = set()
    patterns: set[str] = set()
    for package in HITTING:
        for path in sorted((ROOT / package).rglob("*.py")):
            found, spelled = scanned(path).hits
            names |= found
            patterns |= spelled
    documented, actions = documented_failpoints(
        (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    )
    by_pattern = {
        name
        for name in documented
        for pattern in patterns
        if re.fullmatch(re.escape(pattern).replace(r"\*", "[a-z_]+"), name)
    }
    assert len(names) > 20
    assert documented - by_pattern == names
    assert all(any(name.startswith(p.rstrip("*")) for name in by_pattern) for p in patterns)
    assert actions == {action.value for action in FailpointAction}


def test_the_overview_names_every_thread_the_daemon_starts() -> None:
    names: set[str] = set()
    for package in DAEMON_SIDE:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() not in NOT_DAEMON:
                names |= scanned(path).threads
    names |= scanned(ROOT / "drivers" / "supervisor.py").threads
    table = thread_table((ROOT / "docs" / "design" / "overview.md").read_text(encoding="utf-8"))
    assert len(names) > 15
    assert table == names


def test_every_documented_status_is_one_the_code_answers_its_reason_with() -> None:
    classes = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.HostError)
    ]
    statuses: dict[str, set[int]] = {}
    for cls in classes:
        statuses.setdefault(cls.default_reason, set()).add(cls.status)
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            # Each module's own typed classes too (`typed_in`).
            for reason, found in scanned(path).reasons.items():
                statuses.setdefault(reason, set()).update(found)
    problems: list[str] = []
    checked = 0
    for doc in DESIGN_DOCS:
        for line, status, reason in documented_statuses(doc.read_text(encoding="utf-8")):
            if reason in statuses:
                checked += 1
                if status not in statuses[reason]:
                    problems.append(f"{doc.name}:{line}: {status} {reason} ({statuses[reason]})")
    assert checked > 30
    assert not problems, "the code answers these reasons otherwise:\n" + "\n".join(problems)


def test_the_reliability_law_table_has_one_row_per_law() -> None:
    rows = law_rows((ROOT / "docs" / "reliability.md").read_text(encoding="utf-8"))
    assert rows == {law.value for law in Law}
