"""jax.numpy's jitted functions traced in line while simjax builds a step.

Most ``jax.numpy`` functions (the operators of traced arrays among them) are ``jax.jit``s
of their own: every call looks its trace up by argument types and binds a call
equation, inlined at once for ``jit(inline=True)`` (most of them) or kept (``clip``,
``where``, ``take``, ``lax.dynamic_index_in_dim``, ...: an equation that vmap batches
and the lowering emits on its own); under a ``vmap`` traced in Python (the colliders
over their pairs, the loops of the custom batching rules) every call is batched as a
call. With jax's jit disabled they run as plain Python on the tracers and bind the
same primitives directly. :func:`inlined` runs a function so (``simjax.step`` and the
larger custom batching rules: those run when vmap batches the traced step, after
``step`` returned). A disabled jit also runs ``lax.scan`` and ``fori_loop`` as Python
loops (and tries ``while_loop`` as one): the loops here re-enable it for the loop
itself and disable it again in its body, so the traced program keeps its loops. The
setting is jax's thread-local ``disable_jit`` context, left as it was on return.

Measured on the bench's batched rollout (jit(vmap(fori_loop of 4 steps)), 1024 worlds,
float32; process CPU of trace + lowering, the two alternated in one process, medians
of 4-5 pairs, load 6.5-8): humanoid 0.83x (0.78-0.86; 2.20 -> 1.80 s), ant 0.78x
(0.74-0.80), barkour 0.82x (0.78-0.87), shadow hand 0.85x (0.84-0.93; 4.30 -> 3.67 s);
the trace alone 0.75-0.84x, the lowering 0.77-0.94x. The outputs after 4 steps and a
forward (batch 32) are bit-identical in float32 and float64 on those four models; the
lowered program differs only by the inlined calls (the same loops, conditionals and
custom calls).
"""
from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import math

#: whether the disabled jit of this thread is simjax's own (:func:`inlined`), not the
#: caller's: a caller who disabled jit (to debug) keeps jax's behaviour throughout
_OURS = threading.local()


def active():
    """Whether simjax disabled jax's jit here (and traces in line)."""
    return getattr(_OURS, "on", False) and bool(jax.config.jax_disable_jit)


#: False: nothing traced in line (:func:`inlined` calls as they are; for paired
#: measurements)
ON = True


def inlined(fn):
    """``fn`` run with jax's jit disabled: the jax.numpy functions it calls bind their
    primitives in line (the same primitives; XLA inlined the calls anyway)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not ON or jax.config.jax_disable_jit:
            # off, already in line, or the caller's own disabled jit (left as it is)
            return fn(*args, **kwargs)
        before = getattr(_OURS, "on", False)
        _OURS.on = True
        try:
            with jax.disable_jit():
                return fn(*args, **kwargs)
        finally:
            _OURS.on = before

    return run


#: whether simjax's loops leave out the loop inputs that XLA's simplification fixpoint
#: finds dead only in its late rounds (a fori_loop's second counter in
#: lapack_chol.chunked and solver_gather.first_true's search, a ``c - 1`` in
#: solver_rows._loop, the solver's traced gradient tolerance); read at trace time (False:
#: as they were, kept to compare). Bench rollouts (batch 1024, float32): rounds of XLA's
#: simplification fixpoints ant 17 -> 14, humanoid 15 -> 13 (barkour 16, shadow hand 11
#: unchanged); XLA compile, paired fresh processes on an idle machine: ant wall 0.982
#: [0.965, 0.996] (6 pairs), humanoid 1.000 [0.954, 1.080], barkour 0.999 [0.970, 1.026]
#: (4 pairs each); ant run time 1.011 [0.946, 1.032] and 1 / 1.003 (12 rounds, both
#: orders); outputs bit-identical (float32 ant, humanoid, barkour; float64 ant)
LEAN = True


def _body(fn):
    return inlined(fn) if active() else fn


def _loop(loop):
    @functools.wraps(loop)
    def run(*args, **kwargs):
        if not active():
            return loop(*args, **kwargs)
        with jax.disable_jit(False):
            return loop(*args, **kwargs)
    return run


def outside(fn):
    """``fn`` run with jax's jit enabled again where simjax disabled it (as the caller
    had it): a user's plugin function, whose own loops and jits keep their meaning (a
    disabled jit would unroll its scans), or a jit of simjax's whose trace is to be
    cached and reused (``collision.chunked``)."""
    return _loop(fn)


def _uniform(c):
    """The constant ``c`` as (kind, value): ("full", v) where every entry is v (bit for
    bit), ("iota", None) for 0, 1, ..., n-1; None otherwise (a traced value, a scalar,
    another array)."""
    if isinstance(c, jax.core.Tracer) or not isinstance(c, (np.ndarray, jax.Array)):
        return None
    if c.ndim == 0 or c.size < 2:
        return None
    flat = np.ascontiguousarray(c).reshape(-1)
    raw = flat.view(np.uint8).reshape(flat.size, -1)
    if np.all(raw == raw[0]):
        return "full", flat[0]
    if c.ndim == 1 and flat.dtype.kind in "iu" and np.array_equal(flat, np.arange(c.size)):
        return "iota", None
    return None


def _consts_inside(f, *args):
    """``f`` (a loop body, called with ``args``: arrays or ShapeDtypeStructs) traced once
    here, returned as the re-evaluation of its jaxpr with its uniform constants
    (:func:`_uniform`) built in the body (a broadcast of a scalar, traced once per
    value and shape by :func:`simjax.engine.math.fill`; an iota).

    jax passes a loop body's constant arrays in as loop operands. XLA sinks a constant
    operand back into the body, but it turns a uniform one into a broadcast (and a 0, 1,
    ... one into an iota) first, which it does not sink: each is then a kernel of its own
    outside the loop, and inside it a loaded buffer where the body's kernels would
    otherwise fuse the broadcast. The bench's rollout (RK4 ant: forward in a scan inside
    the rollout loop) compiled 20 kernels fewer (568 -> 548: 15 broadcasts, 5 iotas),
    in fresh processes XLA's CPU 0.90x (0.87-1.01), the lowering's 1.06x, the wall time
    of both 0.91x (0.74-1.04; 6 pairs, load 8); run time 0.985x (0.92-1.07, 12 rounds);
    outputs bit-identical (float32, float64)."""
    sds = jax.tree_util.tree_map(
        lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(
            np.shape(x), jnp.result_type(x), weak_type=getattr(x, "weak_type", False)), args)
    with jax.disable_jit(False):
        closed, shape = jax.make_jaxpr(f, return_shape=True)(*sds)
    kinds = [_uniform(c) for c in closed.consts]
    out_tree = jax.tree_util.tree_structure(shape)

    def g(*a):
        consts = [c if k is None else
                  (math.fill(np.shape(c), k[1], np.asarray(c).dtype) if k[0] == "full"
                   else jax.lax.iota(np.asarray(c).dtype, np.size(c)))
                  for c, k in zip(closed.consts, kinds)]
        out = _replay(closed.jaxpr, consts, jax.tree_util.tree_leaves(a))
        return jax.tree_util.tree_unflatten(out_tree, out)
    return g


#: whether :func:`_replay` copies a traced body's equations into the loop's trace
#: (False: jax.core.eval_jaxpr binds them again; kept to compare)
COPY_EQUATIONS = True


def _replay(jaxpr, consts, args):
    """``jaxpr``'s outputs for ``consts`` and ``args`` in the trace being built: its
    equations copied in (:func:`_copy_equations`: no abstract evaluation, no rule
    lookups per equation), or evaluated again with ``eval_jaxpr`` where the current
    trace is not a jaxpr trace (or with :data:`COPY_EQUATIONS` off, or where a jax
    version lacks the internals the copy uses). Used by :func:`_consts_inside`, the
    solver's loops (solver_worlds._hoisted) and batch_minor's calls. The bench's RK4 ant
    (jit(vmap(fori_loop of 4 steps)), 1024 worlds, float32; fresh processes, 4
    alternated pairs): trace 0.69-0.79 -> 0.62-0.66 s wall, lowering and XLA within
    their noise; in one process, 6 alternated rounds, with the equations' own source
    locations: trace 0.78 -> 0.67 s CPU (medians), lowering 0.29 -> 0.27. The humanoid
    and shadow hand within noise (their solver loops run under vmap's rule, where the
    body is batched, not copied). The optimised program is the same but for its
    numbering (instructions, source frames); outputs bit-identical (float32,
    float64)."""
    from jax._src import core as jcore
    from jax._src.interpreters import partial_eval as pe
    trace = getattr(getattr(jcore, "trace_ctx", None), "trace", None)
    if not (COPY_EQUATIONS and isinstance(trace, getattr(pe, "DynamicJaxprTrace", ()))
            and hasattr(trace, "emit_eqn") and hasattr(pe, "try_constant_folding")):
        return jax.core.eval_jaxpr(jaxpr, consts, *args)
    return _copy_equations(trace, jaxpr, consts, args)


def _copy_equations(trace, jaxpr, consts, args):
    """jax's ``inline_jaxpr_into_trace`` (how jax inlines a jit's jaxpr), except that
    each equation keeps its own source location (its traceback; its name stack under
    the caller's), as ``eval_jaxpr`` keeps it: jax's version gives every copied
    equation the caller's, which left the RK4 ant's optimised program 453 distinct
    stack frames instead of 1535 (the kernels' attribution in bench/profiling.py and in
    profiler traces)."""
    from jax._src import core as jcore
    from jax._src import effects
    from jax._src import source_info_util
    from jax._src.interpreters import partial_eval as pe
    src = source_info_util.current()
    env = dict(zip([*jaxpr.constvars, *jaxpr.invars],
                   [trace.to_jaxpr_tracer(x, src) for x in (*consts, *args)]))

    def read(x, where):
        if isinstance(x, jcore.Literal):
            return pe.DynamicJaxprTracer(trace, x.aval, x, where)
        return env[x]

    for eqn in jaxpr.eqns:
        where = eqn.source_info.replace(
            name_stack=src.name_stack + eqn.source_info.name_stack)
        ins = [read(v, where) for v in eqn.invars]
        avals = [v.aval for v in eqn.outvars]
        folded = pe.try_constant_folding(eqn.primitive, ins, eqn.params, avals)
        if folded is not None:
            outs = [trace.new_const(c, source_info=where, aval=a)
                    for c, a in zip(folded, avals)]
        else:
            effs = ({e.replace(env[e.input].val)
                     if isinstance(e, effects.JaxprInputEffect) else e
                     for e in eqn.effects} if eqn.effects else eqn.effects)
            outs = trace.emit_eqn(ins, avals, eqn.primitive, eqn.params, effs, where,
                                  eqn.ctx)
        for v, t in zip(eqn.outvars, outs):
            env.setdefault(v, t)
    return [trace.to_jaxpr_tracer(read(v, src), src) for v in jaxpr.outvars]


#: whether :func:`scan` builds a body's uniform constants inside where asked
#: (:func:`_consts_inside`; read at trace time; False: never, kept to compare)
CONSTS_INSIDE = True


def scan(f, init, xs, consts_inside=False, **kwargs):
    """``jax.lax.scan``, its body traced in line where the caller is; with
    ``consts_inside`` its uniform constants built in the body (:func:`_consts_inside`:
    for a large body holding many, as RK4's scan over forward; the body is traced once
    and its jaxpr evaluated again, which cost the while loops of the humanoid, barkour
    and shadow hand 5-20% more lowering CPU for 3 kernels fewer each)."""
    body = _body(f)
    if consts_inside and CONSTS_INSIDE:
        x = jax.tree_util.tree_map(
            lambda v: jax.ShapeDtypeStruct(np.shape(v)[1:], jnp.result_type(v)), xs)
        body = _consts_inside(body, init, x)
    return _loop(jax.lax.scan)(body, init, xs, **kwargs)


def fori_loop(lower, upper, body, init, **kwargs):
    """``jax.lax.fori_loop`` (see :func:`scan`)."""
    return _loop(jax.lax.fori_loop)(lower, upper, _body(body), init, **kwargs)


def while_loop(cond, body, init):
    """``jax.lax.while_loop`` (see :func:`scan`)."""
    return _loop(jax.lax.while_loop)(_body(cond), _body(body), init)


def map(f, xs, **kwargs):   # noqa: A001 (jax.lax.map's name)
    """``jax.lax.map`` (see :func:`scan`)."""
    return _loop(jax.lax.map)(_body(f), xs, **kwargs)


def searchsorted(*args, **kwargs):
    """``jnp.searchsorted`` (its "scan" method is a loop; see :func:`scan`)."""
    return _loop(jnp.searchsorted)(*args, **kwargs)
