"""Test configuration: conformance against MuJoCo C runs in float64.

Tests compile with XLA's backend (LLVM) optimisation off: the HLO program, its fusions
and its arithmetic are the same, and compiling costs about a third less CPU time (most
tests run each program a few times only). SIMJAX_TEST_FULL_OPT=1 keeps the default
optimisation level, as users run it.
"""
import os
import sys

if (not os.environ.get("SIMJAX_TEST_FULL_OPT")
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402  (after XLA_FLAGS: the backend reads them when it starts)

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.dirname(__file__))
