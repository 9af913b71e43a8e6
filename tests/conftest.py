"""Test configuration: conformance against MuJoCo C runs in float64.

Tests compile with XLA's backend (LLVM) optimisation off and its expensive LLVM passes
skipped: the HLO program, its fusions and its arithmetic are the same, and compiling
costs about a third less CPU time (most tests run each program a few times only; the
passes skipped: tests/engine/test_solver.py 4m30 -> 4m10 CPU). SIMJAX_TEST_FULL_OPT=1
keeps the default optimisation, as users run it.
"""
import os
import sys

if (not os.environ.get("SIMJAX_TEST_FULL_OPT")
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0"
                               + " --xla_llvm_disable_expensive_passes=true").strip()

import jax  # noqa: E402  (after XLA_FLAGS: the backend reads them when it starts)

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.dirname(__file__))


# ---------------------------------------------------------------- shared compile cache
# Many tests compile the same program (a model's step traced by a jitted function of
# their own): JAX's persistent compilation cache, in a directory made for this test run
# and shared by the pytest-xdist workers (they inherit SIMJAX_TEST_CACHE_DIR from the
# process that made it), compiles each once per run. A cache key is the lowered
# program with the compile options, XLA flags and jaxlib version, so a hit is the
# executable the test would have compiled.
# SIMJAX_TEST_NO_CACHE=1 compiles every program afresh.
_OWN_CACHE = None
if not os.environ.get("SIMJAX_TEST_NO_CACHE"):
    if not os.environ.get("SIMJAX_TEST_CACHE_DIR"):
        import tempfile
        _OWN_CACHE = tempfile.mkdtemp(prefix="simjax-test-xla-")
        os.environ["SIMJAX_TEST_CACHE_DIR"] = _OWN_CACHE
    jax.config.update("jax_compilation_cache_dir", os.environ["SIMJAX_TEST_CACHE_DIR"])
    # programs that compile faster than this are not worth a file read and write
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)


def pytest_configure(config):
    """A test whose pytest-xdist worker crashed (a native fault, not a failed assertion)
    runs once more on a fresh worker: jaxlib 0.10.2 has segfaulted, rarely, while
    serialising an executable for the cache above (seen in the slow set, in
    ``executable.serialize()`` of ``compilation_cache.put_executable_and_time``, under
    test_pid's and test_sdf's compiles; each test passed when run again).
    pytest-rerunfailures reschedules a crashed test up to ``reruns`` times whatever its
    filters; ``rerun_except`` matching every error keeps failures of any other kind
    from being rerun. The summary counts the reruns."""
    if config.pluginmanager.hasplugin("rerunfailures") and not config.option.reruns:
        config.option.reruns = 1
        config.option.rerun_except = [r"(?s).*"]


def pytest_unconfigure(config):
    if _OWN_CACHE is not None:
        import shutil
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
