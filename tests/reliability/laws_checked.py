"""The laws a soak checks, read from its code rather than listed by hand: every `Law` that the
soak module, the `tests.reliability` modules it imports, or a function of
`tests/support/invariants.py` they name (and, transitively, the functions those name) names. A
check the soak takes up (a cell's, a new `check_*`) is in its summary at once; a hand list
left out several."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.invariants import Law

ROOT = Path(__file__).resolve().parents[2]
INVARIANTS = ROOT / "tests" / "support" / "invariants.py"


def _named(node: ast.AST) -> tuple[set[str], set[str]]:
    """The `Law.X` members `node` names, and every other name it uses."""
    laws: set[str] = set()
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "Law":
            laws.add(n.attr)
        elif isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            names.add(n.attr)
    return laws, names


def _definitions(tree: ast.Module) -> dict[str, tuple[set[str], set[str]]]:
    """Each function, method, class and module-level name of `tree` → what it names."""
    out: dict[str, tuple[set[str], set[str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            key = node.name
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            key = next((t.id for t in targets if isinstance(t, ast.Name)), "")
        else:
            continue
        laws, names = _named(node)
        old = out.get(key, (set(), set()))
        out[key] = (old[0] | laws, old[1] | names)
    return out


def _imported_reliability_modules(tree: ast.Module) -> list[Path]:
    return [
        ROOT / Path(*node.module.split(".")).with_suffix(".py")
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("tests.reliability.")
    ]


def laws_checked(soak: Path) -> list[Law]:
    """The laws `soak` (a soak's module) checks, in `Law`'s order."""
    tree = ast.parse(soak.read_text())
    laws, names = _named(tree)
    for module in _imported_reliability_modules(tree):
        more_laws, more_names = _named(ast.parse(module.read_text()))
        laws |= more_laws
        names |= more_names
    definitions = _definitions(ast.parse(INVARIANTS.read_text()))
    seen: set[str] = set()
    todo = [n for n in names if n in definitions]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        more_laws, more_names = definitions[name]
        laws |= more_laws
        todo += [n for n in more_names if n in definitions and n not in seen]
    return [law for law in Law if law.name in laws]
