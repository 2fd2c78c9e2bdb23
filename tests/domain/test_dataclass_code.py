"""The dataclass functions' code kept beside the packages (domain/dataclass_code.py): a class
made from the kept code is the class `dataclasses` compiles, and the daemon and its worker take
every function of theirs from the cache the run built (conftest: `bench.harness.byte_compile`)."""

from __future__ import annotations

import dataclasses
import inspect
import marshal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from domain import dataclass_code
from domain.dataclass_code import DataclassCode
from tests.support.daemon import REPO, DaemonProcess

pytestmark = pytest.mark.skipif(
    not dataclass_code.supported(), reason="this Python's dataclasses compile otherwise"
)

SOURCE = """
import dataclasses
from dataclasses import InitVar, dataclass, field

@dataclass(frozen=True, slots=True)
class Frozen:
    a: int
    b: str = "b"
    c: tuple[int, ...] = ()

@dataclass(slots=True)
class Plain:
    a: int
    items: list[int] = field(default_factory=list)
    hidden: str = field(default="h", repr=False, compare=False)

@dataclass(order=True, kw_only=True)
class Ordered:
    x: int
    y: int = 0

@dataclass(eq=False)
class Posted:
    a: int
    scale: InitVar[int] = 2
    b: int = field(init=False, default=0)

    def __post_init__(self, scale: int) -> None:
        self.b = self.a * scale
"""


def _module(name: str) -> ModuleType:
    module = ModuleType(name)
    sys.modules[name] = module  # dataclasses looks its module up while making the class
    try:
        exec(compile(SOURCE, name, "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[name]
    return module


def _made(code: DataclassCode | None, name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    with monkeypatch.context() as m:
        if code is None:
            m.delattr(dataclasses, "exec", raising=False)
        else:
            m.setattr(dataclasses, "exec", code.exec, raising=False)
        return _module(name)


def _behaviour(m: ModuleType) -> list[Any]:
    frozen = m.Frozen(1, c=(2,))
    try:
        frozen.a = 2
        refused = None
    except dataclasses.FrozenInstanceError as exc:
        refused = type(exc).__name__
    plain = m.Plain(1)
    plain.items.append(3)
    posted = m.Posted(4, scale=3)
    out: list[Any] = [
        repr(frozen),
        frozen == m.Frozen(1, "b", (2,)),
        frozen != m.Frozen(2),
        hash(frozen) == hash(m.Frozen(1, c=(2,))),
        refused,
        repr(plain),
        plain == m.Plain(1, [3], hidden="other"),
        m.Plain(1).items is not m.Plain(1).items,
        m.Ordered(x=1) < m.Ordered(x=1, y=2),
        sorted([m.Ordered(x=2), m.Ordered(x=1, y=5)]),
        posted.b,
        posted == m.Posted(4, scale=3),
        m.Frozen.__slots__,
    ]
    for cls in (m.Frozen, m.Plain, m.Ordered, m.Posted):
        init = cls.__init__
        out += [
            str(inspect.signature(cls)),
            {k: v if isinstance(v, str) else f"<{v!r}>" for k, v in init.__annotations__.items()},
            init.__defaults__,
            init.__kwdefaults__,
        ]
    return [repr(x) for x in out]


def test_a_class_made_from_the_kept_code_is_the_class_dataclasses_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = _behaviour(_made(None, "dc_plain", monkeypatch))
    recording = DataclassCode()
    recorded = _behaviour(_made(recording, "dc_recorded", monkeypatch))
    assert recording.taken == 0 and recording.compiled > 12, vars(recording)
    kept = DataclassCode(marshal.loads(marshal.dumps(recording.codes)))
    from_cache = _behaviour(_made(kept, "dc_kept", monkeypatch))
    assert kept.compiled == 0 and kept.taken == recording.compiled, vars(kept)
    assert recorded == plain
    assert from_cache == plain
    # The annotations are the types, as `exec` in dataclasses.py compiles them: not strings
    # (the future import of the module that compiles them is not inherited).
    frozen_init = plain[-15]
    assert "'a': \"<<class 'int'>>\"" in frozen_init, frozen_init
    assert "'return': '<None>'" in frozen_init, frozen_init


def test_what_another_interpreter_wrote_or_a_torn_file_is_not_taken(tmp_path: Path) -> None:
    good = tmp_path / "good.bin"
    good.write_bytes(
        marshal.dumps((dataclass_code._MAGIC, {"x = 1": compile("x = 1", "", "exec")}))
    )
    assert list(dataclass_code.load(good)) == ["x = 1"]
    other = tmp_path / "other.bin"
    other.write_bytes(marshal.dumps((b"\0\0\r\n", {"x = 1": compile("x = 1", "", "exec")})))
    torn = tmp_path / "torn.bin"
    torn.write_bytes(good.read_bytes()[:-9])
    assert dataclass_code.load(other) == {}
    assert dataclass_code.load(torn) == {}
    assert dataclass_code.load(tmp_path / "missing.bin") == {}


def test_the_daemon_and_its_worker_take_every_dataclass_function_from_the_built_cache(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            # The worker's module installs the cache as it is imported (the daemon's command
            # as it starts: `agenthost.launch`, seen in the daemon's log below).
            "import drivers.worker, agenthost.daemon\n"
            "from domain import dataclass_code\n"
            "c = dataclass_code.installed()\n"
            "print(c.taken, c.compiled)",
        ],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    taken, compiled = map(int, out.stdout.split())
    assert compiled == 0 and taken > 500, out.stdout
    d = DaemonProcess(tmp_path / "home").start()
    d.stop()
    said = [x for x in d.tail_log(100_000).splitlines() if "dataclass functions:" in x]
    assert len(said) == 1 and said[0].endswith(" from the cache, 0 compiled"), said
    assert int(said[0].split("dataclass functions: ")[1].split()[0]) > 500, said


def test_the_tutti_agent_app_server_takes_every_dataclass_function_from_its_own_cache(
    tmp_path: Path,
) -> None:
    """The app-server imports nothing of ours: it reads the file the build writes beside its own
    bytecode (`tutti_agent.dataclass_code`), holding its classes' code, and compiles none."""
    code = (
        "import sys\n"
        "sys.argv = ['tutti-agent', 'app-server']\n"
        "from tutti_agent.cli import main\n"
        "main()\n"
        "from tutti_agent import dataclass_code\n"
        "c = dataclass_code.installed()\n"
        "print(c.taken, c.compiled, 'domain.dataclass_code' in sys.modules, file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input="",  # stdin closed at once: the app-server's start, then its end
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "TUTTI_AGENT_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    taken, compiled, ours = out.stderr.split()[-3:]
    assert (int(compiled), ours) == (0, "False") and int(taken) > 50, out.stderr
