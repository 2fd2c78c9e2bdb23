"""What `sys.modules` holds after `import X` in a fresh interpreter, for many X at the price of
one interpreter's start: one parent (`python -c`, in the checkout) imports `json, sys` as each
fresh `python -c 'import json, sys\\nimport X'` does, then forks one child per X; the child
runs `import X` and reports `sorted(sys.modules)`. A fork copies the parent's state, so each
child starts from the state a fresh interpreter has at that line, and pays only X's own imports,
not the interpreter's start (~40 ms of CPU each, for ~100 modules a run).

The parent reports its own `sorted(sys.modules)` from before its first fork (`baseline`): a test
compares it, and a few modules' load sets, with fresh interpreters'
(tests/layers/test_layers.py::test_the_forked_imports_report_what_a_fresh_interpreter_loads)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The parent: it names nothing but builtins, `json`, `sys` and `os` (loaded by every interpreter's
# start) before it forks, so it imports nothing a fresh `import json, sys` would not.
_PARENT = """import json, sys
import os


def _run(out, modules, limit):
    baseline = sorted(sys.modules)
    running = {}
    codes = {}
    for index, module in enumerate(modules):
        while len(running) >= limit:
            pid, status = os.wait()
            codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(f"{out}/{index}.out", os.O_WRONLY | os.O_CREAT, 0o600), 1)
            os.dup2(os.open(f"{out}/{index}.err", os.O_WRONLY | os.O_CREAT, 0o600), 2)
            try:
                exec(f"import {module}", globals())
                print(json.dumps(sorted(sys.modules)), flush=True)
            except BaseException:
                import traceback

                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
            os._exit(0)
        running[pid] = index
    while running:
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    print(json.dumps([baseline, [codes[i] for i in range(len(modules))]]), flush=True)


_run(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
"""


@dataclass(frozen=True)
class Imported:
    """One child's `import X`: its exit code, what it printed (`sys.modules` as JSON), its
    stderr (a traceback when the import failed)."""

    rc: int
    out: str
    err: str

    def loaded(self) -> list[str]:
        assert self.rc == 0, self.err
        names: list[str] = json.loads(self.out.strip().splitlines()[-1])
        return names


@dataclass(frozen=True)
class Imports:
    baseline: list[str]
    """The parent's `sorted(sys.modules)` before its first fork."""
    each: dict[str, Imported]


def import_each(modules: Sequence[str], limit: int = 2) -> Imports:
    """`import <module>` for each module (any `import` statement's tail: `a, b` imports both),
    each in a child forked from one parent interpreter, at most `limit` at a time."""
    unique = list(dict.fromkeys(modules))
    with tempfile.TemporaryDirectory(prefix="imports-") as out:
        done = subprocess.run(
            [sys.executable, "-c", _PARENT, out, json.dumps(unique), str(limit)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        baseline, codes = json.loads(done.stdout.strip().splitlines()[-1])
        each = {
            module: Imported(
                rc,
                Path(out, f"{index}.out").read_text(),
                Path(out, f"{index}.err").read_text(),
            )
            for index, (module, rc) in enumerate(zip(unique, codes, strict=True))
        }
    return Imports(baseline, each)


def fresh_import(module: str) -> Imported:
    """`import <module>` in a fresh interpreter of its own (what `import_each` stands for)."""
    code = f"import json, sys\nimport {module}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    return Imported(done.returncode, done.stdout, done.stderr)
