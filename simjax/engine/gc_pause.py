"""Python's cyclic garbage collector paused while simjax builds a step or rollout.

Tracing a contact step (under ``jax.jit``) creates hundreds of thousands of long-lived
Python objects (jaxpr equations, tracers, avals); as they pile up, the collector's full
(generation 2) collections walk all of them and find almost nothing to free (0-13
objects each), and both their number and their length grow with the traced program.
Measured on ``jit(vmap(step))`` at batch 1024, fresh processes, process CPU of lower +
compile: the humanoid's trace ran 2 full collections (0.21 s) and 0.09 s of young ones,
the shadow hand's 4 (0.65 s) and 0.13 s; with the collector paused inside ``step``, no
full collection ran, and the young ones after it took 0.15 s and 0.26 s: 0.15 s and 0.5
s saved (2-5% of those compiles). Where ``vmap`` is applied outside a loop of steps
(``vmap(fori_loop(step))``, as the bench's rollouts), jax batches the loop's body again
outside ``step``, and full collections stay there (shadow hand 4 -> 2, 0.66 -> 0.40 s;
humanoid 3 -> 2, 0.33 -> 0.30 s). ``simjax.rollout`` is paused too, which covers that
re-batching for :func:`simjax.rollout_batch` (shadow hand, 4 steps, first call: 5 full
collections, 0.94 s, -> none, the young ones 0.16 -> 0.26 s). Reference counting still
frees everything that is not in a cycle at once; the cycles tracing leaves are collected
by the first collection after the pause, so memory is reclaimed as before, only later.
(A pause around compilation is an old remedy for compilers written in Python.)
"""
from __future__ import annotations

import functools
import gc


def gc_paused(fn):
    """``fn`` with Python's cyclic garbage collector paused while it runs.

    The collector is re-enabled on return or exception, only by the outermost paused
    call (nested simjax calls and callers that disabled it themselves are left as they
    are). It is process-wide: another thread running at the same time goes without
    cyclic collection until the call returns."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return paused
