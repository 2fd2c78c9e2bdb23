"""The benchmarks' machine record names the interpreter the daemon tree runs on: the same fork
costs the tree ~10 % less CPU on one build of Python 3.11 than on another
(docs/performance.md, "The interpreter's build"), so a figure without it compares with
nothing."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from bench.common import BUILD_FLAGS, machine


def test_the_machine_record_names_the_interpreter_its_libpython_and_its_build_flags() -> None:
    build = machine()["pythonBuild"]
    assert build["executable"] == os.path.realpath(sys.executable)
    # The shared library this process runs from, as the kernel maps it (None: linked in).
    mapped = sorted(
        {
            line.split()[-1]
            for line in Path("/proc/self/maps").read_text().splitlines()
            if Path(line.split()[-1]).name.startswith("libpython")
        }
    )
    assert build["libpython"] == (mapped[0] if mapped else None)
    configure = str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    assert build["configure"] == [flag for flag in BUILD_FLAGS if f"'{flag}'" in configure]
