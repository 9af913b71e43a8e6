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
collections, 0.94 s, -> none, the young ones 0.16 -> 0.26 s). For a user's own
``jit(vmap(fori_loop(step)))``, a ``step`` traced inside a jit holds the pause until jax
has lowered the program (:func:`_hold`, ended by jax.monitoring's lowering event). The
bench's rollouts, fresh processes, trace + lowering (2 cores, loaded): full collections
shadow hand 2 -> 0, barkour, humanoid and ant 1 -> 0; the collector's CPU over trace and
lowering 0.34-0.38 -> 0.09 s (hand) and 0.16-0.22 -> 0.04 s (barkour); a full
collection right after the compile took the same with or without the hold (0.10-0.19
s), so the walks are saved, not moved. Reference counting still
frees everything that is not in a cycle at once; the cycles tracing leaves are collected
by the first collection after the pause, so memory is reclaimed as before, only later
(after a hold, by the next full collection: the hold's end moves the traced program's
objects to the oldest generation without walking them, :func:`_promote`).
(A pause around compilation is an old remedy for compilers written in Python.)
"""
from __future__ import annotations

import functools
import gc
import threading

import jax

#: keep the collector paused past a ``step`` / ``forward`` / ``inverse`` traced inside a
#: larger jax trace, until jax has finished lowering that program (:func:`_hold`). Read
#: at call time.
HOLD = True

#: jax's monitoring events (jax._src.dispatch). The outermost jit trace (its start is
#: recorded as a scalar, its end as a duration; only for a trace started with no other
#: trace in progress, so ``make_jaxpr`` / ``eval_shape`` / ``jit(f).trace`` included):
#: a hold is taken only inside one, so an eager ``vmap`` / ``grad`` of ``step`` (no
#: lowering follows) is paused for the call alone.
_TRACED = "/jax/core/compile/jaxpr_trace_duration"
#: the end of lowering the traced program to StableHLO (before its XLA compile): ends a
#: hold
_LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"
#: seconds after the outermost trace's end at which a hold ends where no lowering
#: follows (``make_jaxpr``, ``jit(f).trace`` alone, an error in the trace). The timer
#: enables the collector even where the caller disabled it in that time: a hold
#: cannot tell the caller's gc.disable() from its own
_FALLBACK_S = 20.0

_lock = threading.Lock()
_state = {"tracing": False, "held": False, "timer": None}


#: at the end of a hold, move every object the collector tracks into its oldest
#: generation (:func:`_promote`) before it runs again. Read at the hold's end. Bench
#: rollouts (batch 1024, float32), fresh processes, 6 pairs each alternated with this
#: off, medians: the collector's CPU inside the lowering shadow hand 0.090 -> 0 s,
#: humanoid 0.038 -> 0, barkour 0.028 -> 0, ant 0.025 -> 0, and over ten runs after the
#: compile (and some Python allocation) 0.100 -> 0.031, 0.071 -> 0.028, 0.064 -> 0.028,
#: 0.045 -> 0.024 s; the lowering's CPU 0.83x [0.47, 1.20] (hand), 0.94x (humanoid),
#: 0.89x (barkour), 0.87x (ant): noisy (2 loaded cores); the collector's share is the
#: gain to expect, about 1-1.5% of the hand's whole compile.
PROMOTE = True


def _promote():
    """Every object the collector tracks moved into its oldest generation, unwalked
    (``gc.freeze()`` then ``gc.unfreeze()``: two list splices).

    A hold ends with the young generation holding every object allocated since the
    pause began: the traced program's jaxprs, avals and lowering caches, hundreds of
    thousands of them, alive (cached by jax) or freed by reference counting (a full
    collection after the shadow hand's compile, and again after jax.clear_caches(),
    found no cyclic garbage). The first allocation after gc.enable() ran a young
    collection over all of them, inside the lowering jax was timing (see
    :data:`PROMOTE`), and they moved to the middle generation, to be walked again by its
    next collection; in the oldest they are walked by full collections alone, as they
    would have been in the end. The caller's young objects move with them. The full
    collections' trigger counts survivors of middle-generation collections: objects
    moved here do not bring the next one forward. Skipped where someone has frozen
    objects (a forking server's ``gc.freeze()``): the unfreeze would release theirs."""
    if PROMOTE and gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


def _resume():
    """End a hold: the collector back on (once; a later hold starts afresh), the
    objects of the traced program moved to the oldest generation (:func:`_promote`)."""
    with _lock:
        if not _state["held"]:
            return
        _state["held"] = False
        timer, _state["timer"] = _state["timer"], None
    if timer is not None:
        timer.cancel()
    _promote()
    gc.enable()


def _on_scalar(event, value, **kwargs):
    # a trace's start is recorded as a scalar (its start time)
    if event == _TRACED:
        _state["tracing"] = True


def _on_duration(event, duration, **kwargs):
    if event == _TRACED:
        _state["tracing"] = False
        with _lock:
            if _state["held"] and _state["timer"] is None:
                t = threading.Timer(_FALLBACK_S, _resume)
                t.daemon = True
                _state["timer"] = t
                t.start()
    elif event == _LOWERED and _state["held"]:
        _resume()


jax.monitoring.register_scalar_listener(_on_scalar)
jax.monitoring.register_event_duration_secs_listener(_on_duration)


def _hold():
    """Whether to leave the collector paused after a call returns, and if so take the
    hold: inside a jit trace, jax re-batches the enclosing loops' bodies
    (``vmap(fori_loop(step))``) and lowers the whole program after ``step`` has
    returned, and the full collections that pile up there walk the same hundreds of
    thousands of objects. The hold ends with jax's lowering of that program
    (:data:`_LOWERED`) or the fallback timer."""
    if not (HOLD and _state["tracing"]):
        return False
    with _lock:
        _state["held"] = True
    return True


def gc_paused(fn):
    """``fn`` with Python's cyclic garbage collector paused while it runs.

    The collector is re-enabled on return or exception, only by the outermost paused
    call (nested simjax calls and callers that disabled it themselves are left as they
    are). Where the call is traced inside a jit and returns normally, the pause is held
    until jax has lowered the enclosing program (:func:`_hold`). It is
    process-wide: another thread running at the same time goes without cyclic
    collection until then."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        held = False
        try:
            out = fn(*args, **kwargs)
            held = _hold()
            return out
        finally:
            if not held:
                gc.enable()

    return paused
