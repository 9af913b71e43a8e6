"""Helpers shared by the profiling scripts (profile_smooth, profile_collision,
profile_contact): program size and CPU time of a jitted function."""
from __future__ import annotations

import time


def count_eqns(jaxpr):
    """Equations of a jaxpr including those of every sub-jaxpr (scan, cond, pjit...)."""
    from jax.extend import core
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            subs = p if isinstance(p, (tuple, list)) else (p,)
            for s in subs:
                if isinstance(s, core.ClosedJaxpr):
                    n += count_eqns(s.jaxpr)
                elif isinstance(s, core.Jaxpr):
                    n += count_eqns(s)
    return n


def cpu_time(fn, *args, repeat=3):
    """Best process CPU seconds of ``fn(*args)`` over ``repeat`` calls, after one warm-up
    call (CPU time, not wall time, so that runs on a shared machine stay comparable)."""
    import jax
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        jax.block_until_ready(fn(*args))
        best = min(best, time.process_time() - t0)
    return best
