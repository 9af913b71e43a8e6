"""Keep freed host memory in the process (glibc's malloc), for XLA:CPU's temporaries.

XLA:CPU allocates a program's temporaries with ``malloc`` on every call and frees them
when the call returns. glibc serves a block larger than its mmap threshold (at most
32 MiB) with a fresh ``mmap`` and unmaps it on ``free``, and it returns the top of its
heaps to the kernel past the trim threshold, so such a program touches fresh pages,
one page fault each, on every call. A batch of 1024 shadow hands stepping one step per
call has about 53 MiB of temporaries: in a process with glibc's defaults it spent
about 30 of its ~105 us of CPU per world-step in the kernel (about 20,000 page faults
a call), and about 76 us in all with large blocks served from the heap and freed memory
kept. The price is that the process keeps its peak heap: memory freed by the program
is reused by later allocations, not handed back to the kernel.

``keep_freed_memory`` sets glibc's ``M_MMAP_MAX`` to 0 (no mmap for large blocks) and
``M_TRIM_THRESHOLD`` to 2 GiB - 1 (the largest an int holds) through ``mallopt``.
simjax calls it once when it is imported, on Linux with glibc, unless
``SIMJAX_KEEP_MALLOC=1``. Setting ``MALLOC_MMAP_MAX_=0`` and ``MALLOC_TRIM_THRESHOLD_``
in the environment before the process starts does the same from the start (glibc
reads them once), which also covers memory the process allocated before simjax's
import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1      # mallopt parameters (glibc's malloc.h)
_M_MMAP_MAX = -4
_TRIM = 2 ** 31 - 1         # mallopt takes an int

_done: list = []


def _libc():
    """glibc's C library, or None (another platform or C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version      # glibc only
        libc.mallopt
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve large blocks from its heaps and keep freed memory
    (see the module docstring). Process-wide; later calls do nothing.

    Returns:
      True where the settings were applied (now or by an earlier call), False where
      the C library is not glibc or mallopt refused them.
    """
    if _done:
        return _done[0]
    libc = _libc()
    ok = (libc is not None and libc.mallopt(_M_MMAP_MAX, 0) == 1
          and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM) == 1)
    _done.append(ok)
    return ok


def at_import():
    """The import-time call: skipped with SIMJAX_KEEP_MALLOC=1 or where the user set
    glibc's own MALLOC_MMAP_MAX_ / MALLOC_TRIM_THRESHOLD_ (their choice stands)."""
    if os.environ.get("SIMJAX_KEEP_MALLOC") or any(
            k in os.environ for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    return keep_freed_memory()
