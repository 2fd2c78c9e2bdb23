"""`bench.perf_split`: `perf script` samples of the tree charged to a process kind (by its
threads' names) and to what ran (a library, or the kernel by the system call on the stack)."""

from __future__ import annotations

import pytest

from bench.perf_split import parse, split

pytestmark = pytest.mark.timeout(30)

SCRIPT = """\
agenthost-trans   100/101
\t          1abb05 _PyEval_EvalFrameDefault (/x/lib/libpython3.11.so.1.0)
\t    563c97a7d0b0 [unknown] ([unknown])

:102   100/102
\t           a0cb6 sqlite3VdbeExec (/x/site-packages/apsw/__init__.cpython-311-x86_64-linux-gnu.so)

session_0   100/103
\tffffffff81100000 futex_wait ([kernel.kallsyms])
\tffffffff81100001 __x64_sys_futex ([kernel.kallsyms])
\t           f7f37 syscall (/usr/lib/x86_64-linux-gnu/libc.so.6)

python  200/200
\tffffffff817d99c5 __ext4_new_inode ([kernel.kallsyms])
\tffffffff816f6915 __x64_sys_mkdir ([kernel.kallsyms])

ZMQbg/IO/0  200/201
\tffffffff81200000 finish_task_switch.isra.0 ([kernel.kallsyms])

python  200/202
\tffffffff81300000 vfs_statx ([kernel.kallsyms])
\tffffffff81300001 __do_sys_newfstatat ([kernel.kallsyms])

python  300/300
\tffffffff81400000 ext4_sync_file ([kernel.kallsyms])
\tffffffff81400001 __x64_sys_fsync ([kernel.kallsyms])

python  300/300
\t          1abb05 PyObject_Call (/x/lib/libpython3.11.so.1.0)
"""


def test_each_sample_is_charged_to_its_process_kind_and_what_ran() -> None:
    parts = split(parse(SCRIPT))
    # 100 names its threads as the daemon does (the unnamed one counts with its process)
    assert dict(parts["daemon"]) == {
        "the interpreter": 1,
        "SQLite (C)": 1,
        "kernel: futex (the GIL, locks, queues)": 1,
    }
    # 200 runs ZeroMQ's I/O thread: a driver worker; newfstatat has only `__do_sys_` frames
    assert dict(parts["worker"]) == {"kernel: file calls": 2, "kernel: scheduling, interrupts": 1}
    assert dict(parts["app-server"]) == {"kernel: fsync/fdatasync": 1, "the interpreter": 1}
