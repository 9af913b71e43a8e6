"""simjax._malloc: glibc keeps freed memory, so reused large blocks touch no new pages."""
import os
import subprocess
import sys

import pytest

from simjax import _malloc

# allocate, touch and free a 64 MiB block five times; print the minor page faults of the
# last four rounds and whether the import applied the settings
_PROBE = r"""
import ctypes, resource, sys
import simjax, simjax._malloc as m
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = 64 << 20
faults = []
for _ in range(5):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(m._done, sum(faults[1:]))
"""

_GLIBC = _malloc._libc() is not None


def _probe(**env):
    full = {k: v for k, v in os.environ.items()
            if k not in ("SIMJAX_KEEP_MALLOC", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")}
    full.update(env, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=full, capture_output=True,
                         text=True, check=True, timeout=300).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not _GLIBC, reason="glibc's mallopt only (Linux with glibc)")
def test_import_keeps_freed_memory():
    """After ``import simjax`` a freed 64 MiB block is reused without page faults; with
    SIMJAX_KEEP_MALLOC=1 (glibc's defaults) each round maps it afresh (16384 pages of
    4 KiB each, or 32 of 2 MiB with transparent huge pages)."""
    done, faults = _probe()
    assert done == "[True]"
    assert faults < 400, faults
    done, faults = _probe(SIMJAX_KEEP_MALLOC="1")
    assert done == "[]"
    assert faults >= 4 * 32, faults


def test_user_choice_stands(monkeypatch):
    """glibc's own environment settings, or SIMJAX_KEEP_MALLOC, leave malloc alone."""
    for key, value in (("SIMJAX_KEEP_MALLOC", "1"), ("MALLOC_MMAP_MAX_", "0"),
                       ("MALLOC_TRIM_THRESHOLD_", "1000000")):
        with monkeypatch.context() as mp:
            mp.setenv(key, value)
            assert _malloc.at_import() is False
