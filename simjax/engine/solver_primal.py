"""The primal solvers Newton and CG (MuJoCo's mj_solPrimal, mj_solNewton, mj_solCG in
engine_solver.c): the iterations on the row chunks (:mod:`simjax.engine.solver_rows`),
every constraint island solved on its own as MuJoCo 4.0.0 does
(:class:`~simjax.engine.solver_islands.Islands`), with the exact line search of
:mod:`simjax.engine.solver_search`; Newton's Hessian factor is kept where no row changed
state. The chunk functions of a pass: line-search coefficients and points, and the step
with J' force and the Hessian's row terms (mj_constraintUpdate, MakeHessian)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import constraint as C
from simjax.engine import solver_cost
from simjax.engine.math import reduce_fused, unstack, where
from simjax.engine.solver_cost import (
    _force_hessian, _hessian, _quad_hessian, _quad_weights, update)
from simjax.engine.solver_dense import factor_solve, factor_t
from simjax.engine.solver_gather import Chunked
from simjax.engine.solver_islands import Islands
from simjax.engine.solver_rows import head_chunk, rest_chunks
from simjax.engine.solver_search import MINVAL, _eval, _eval_point, _linesearch
from simjax.engine.solver_search import _prepare, _prepare_dofs
from simjax.engine.solver_worlds import any_world, batched_like, live_loop, where_needed


#: Newton's Hessian row products J' (D J) with chunk 0's J' made once per solve, read at
#: trace time: XLA CPU hands (nv, rows) x (rows, nv) products to YNNPACK, while J.T as
#: the left operand made them a dot of its own with the transposed operand, 2-3x the
#: per-world cost (batch 1024, float32, 54 x 27: 5.3 -> 2.2 us per world); False: the
#: former way, kept to compare
_JT = True


#: the Hessian row products of a first pass known statically (Newton with one
#: iteration at most, :func:`_primal`) by chunk 0's J' as well, materialised: used
#: once, J.T was folded into the product by XLA (a dot of its own with the transposed
#: operand, not YNNPACK's). Barkour's bench step (batch 1024, float32, 4-step rollouts,
#: paired in one process, 16 rounds) 0.952-0.960x; float32 outputs bit-identical.
#: J' force by the same J' made the step 1.018x: it stayed J.T @ force (with
#: :data:`~simjax.engine.solver_cost._ONE_JT`, one product with the rows' terms).
#: Read at trace time; False: the former way, kept to compare
_JT_FIRST = True


#: J' force of the loop's last pass carried out of Newton's / CG's loop as
#: qfrc_constraint: every pass sums it over the rows in use, at every world's final jaref
#: (a world that does not move keeps its jaref), so the product over every row of the
#: capacity after the solve (the ant's 116 rows for a handful in use) is not made.
#: Read at trace time (False: that product, kept to compare). Bench rollouts (batch
#: 1024, float32, 4 steps, paired in one process, loads 7-12): ant 0.928 [0.837, 1.175]
#: (14 rounds) and, switch order reversed, 1 / 1.052 [0.860, 1.297] (14); humanoid
#: 1.065 [0.895, 1.178] and reversed 1 / 1.009 (12 each), barkour 1.001 [0.908, 1.471]
#: (12): noise. Ant compile (3 fresh-process pairs) wall 0.970, XLA CPU 0.918, 523
#: kernels both, 3702 -> 3705 eqns. Outputs: ant, barkour, shadow hand bit-identical in
#: float32 and float64; humanoid (rows in later chunks: the sum in another order)
#: within 2.5e-14 relative in float64
_CARRY_QFRC = True


def _primal(rows, p, start, newton, iterations, ls_iterations):
    """Newton / CG (mj_solPrimal) on the rows ``rows`` (:class:`simjax.engine.
    solver_rows.Rows`) of problem ``p``, every island (``rows.spec.nisl``, rows
    ``p['rowisl']``, dofs ``p['dofisl']``; :class:`Islands`) solved on its own as
    MuJoCo 4.0.0 does:
    its own search direction, exact line search, CG beta, stopping rule scaled by
    1 / trace of its block of M, and iteration count. Converged islands are frozen
    while the others iterate. ``start`` is (qacc0, M qacc0, J qacc0 - aref) (the last
    per chunk of ``rows``). Every sum over rows runs over the chunks in use
    (:func:`simjax.engine.solver_rows.head_chunk`, :func:`~simjax.engine.solver_rows.
    rest_chunks`). Returns
    (qacc, niter, improvement, gradient, jaref, qfrc): niter, improvement and gradient
    per island (islands,): iterations, and the scaled improvement and gradient norm of
    the last iteration; jaref the rows' J qacc - aref (:class:`~simjax.engine.
    solver_rows.Chunked`, kept up to date by the steps as MuJoCo's Jaref is), and qfrc
    J' force at it (nv,) as the last pass computed it (None where the loop does not
    carry it out, :data:`_CARRY_QFRC` false).

    The initial gradient, Hessian factor and search direction are computed by a first
    pass of the loop body with no line search (alpha 0), so that the update, Hessian
    and factorisation appear once in the program. Newton's factor is carried from pass
    to pass and remade only where a row changed state (:func:`_update_head`)."""
    nisl = rows.spec.nisl
    isl = Islands(nisl, p.get("rowisl"), p.get("dofisl"))
    tol = p["tolerance"]
    M = p["M"]
    qacc0, Ma0, jaref0 = start[:3]
    # the later chunks' (J' force, Hessian terms) at the start, from the warm start's
    # pass over them (:func:`_primal_start`), or None
    first_rest = start[3] if len(start) > 3 else None
    # MuJoCo 4.0.0 scales improvement and gradient by 1 / trace(M) (measured: the
    # reported gradient is |grad| / trace(M) at the current configuration, per island
    # the trace of the island's block), not by meaninertia * nv
    if isl.n == 1:
        # jnp.trace's sum with the diagonal's mask a constant (jnp's, made by iota and
        # comparison, was a kernel of its own)
        diag = where(np.eye(M.shape[-1], dtype=bool), M, 0.0)
        scale = (1.0 / jnp.maximum(MINVAL, jnp.sum(diag, axis=(-2, -1))))[None]
        exists = reduce_fused(p["active"], 0, "any")[None]
    else:
        trace = isl.ddot(jnp.diag(M), jnp.ones_like(qacc0))
        scale = 1.0 / where(trace > 0, trace, 1.0)
        exists = isl.rsum(p["active"].astype(jnp.int32)) > 0
    solve_m = p["solve_m"]
    gtol_base = p["gtol_base"]
    # the line search evaluates the friction-loss rows' Huber terms only where a row of
    # the batch is one (the flag is the same for every world: any_world)
    fric_rows = rows.src["fric"] if rows.src is not None else rows.spec.fric
    fric = (any_world(reduce_fused(p["active"] & fric_rows, 0, "any")) if np.any(fric_rows)
            else False)

    # chunk 0's J' for the Hessians (:data:`_JT`): made for the solve where the
    # statically first pass (one iteration at most, below) reads it (:data:`_JT_FIRST`)
    # or the factorisations do not make their own (:data:`_JT_OWN`); the barrier keeps
    # XLA from folding the first pass's transpose back into the product
    own_jt = newton and _JT and _JT_OWN
    first_jt = newton and _JT and _JT_FIRST and iterations == 1
    J0T = (jnp.swapaxes(rows.J0, -1, -2) if newton and _JT and (first_jt or not own_jt)
           else None)
    J0T_first = jax.lax.optimization_barrier(J0T) if first_jt else None

    def body(s, search_on=True, hessian=True):
        # search_on False: a first pass known statically (no line search); hessian
        # False: a last pass known statically (H^-1 grad is used by nothing after it)
        qacc, Ma, jaref, search = s["qacc"], s["Ma"], s["jaref"], s["search"]
        first = s["first"]
        live = ~s["done"]
        if search_on:
            pre = _prepare_dofs(p, isl, Ma, search)
        else:
            # the search direction is zero: so are M search and its norm
            pre = dict(Mv=jnp.zeros_like(Ma), snorm=jnp.zeros(isl.n, Ma.dtype))
        if search_on:
            # chunk 0's line-search coefficients; the later chunks' are recomputed
            # where they are visited (usually never)
            _, rpre = head_chunk(rows, _prepare_chunk, (), extra=jaref, args=search,
                                 jac=True)
        snorm = pre["snorm"]
        small = snorm < MINVAL
        gtol = gtol_base * where(small, 1.0, snorm) / scale
        if search_on:
            def evaluate(alpha):
                tot, _ = head_chunk(rows, _eval_chunk, jnp.zeros((nisl, 6), Ma.dtype),
                                    extra=jaref, args=(alpha, rpre, fric))
                tot, _ = rest_chunks(rows, _eval_rest, tot, extra=jaref,
                                     args=(alpha, search, fric), jac=True)
                return _eval_point(pre["qg"], alpha, tot)

            alpha, imp = _linesearch(evaluate, nisl, Ma.dtype, gtol, ls_iterations,
                                     ~live | small | first)
        else:
            alpha = imp = jnp.zeros_like(snorm)
        alpha = where(small | ~live | first, 0.0, alpha)
        move = live & (alpha != 0)
        take = move | first
        # alpha is zero on islands that do not move (their vectors stay as they are)
        ad = isl.dx(alpha, 0.0)
        qacc = qacc + ad * search
        Ma = Ma + ad * pre["Mv"]
        hess = newton and hessian
        # the later chunks' Hessian terms are added to M in the pass, chunk 0's where
        # the factor is remade (or in the pass, on a first pass known statically, where
        # every factor is made: M is then not copied into the later chunks' loop)
        acc = (jnp.zeros_like(qacc), M) if hess else (jnp.zeros_like(qacc),)
        if first_rest is not None and hess and not search_on:
            # the later chunks' sums at the start (zero, M where none): chunk 0's are
            # added to them
            acc = first_rest
        # a first pass known statically makes no step (alpha 0): the rows stay where
        # they are (no J search)
        acc, (head, hstate, changed) = head_chunk(
            rows, functools.partial(_update_head, hess and not search_on,
                                    JT=J0T_first if hess and not search_on else None,
                                    changes=hess and search_on or not _HEAD_CHANGES), acc,
            extra=jaref, args=(alpha, take, rpre["Jv"] if search_on else None), jac=True)
        if first_rest is not None and hess and not search_on:
            # a first pass known statically makes no step: the later chunks' rows stay
            # where they are, and their sums were made by the warm start's pass
            rest = jaref.rest
        else:
            acc, rest = rest_chunks(rows, functools.partial(_update_rest, hess), acc,
                                    args=(alpha, take, search if search_on else None),
                                    jac=True, state=jaref.rest)
        jaref_new = Chunked(head, rest)
        grad = Ma - p["qfrc_smooth"] - acc[0]
        if hess:
            # the factor is remade where a row changed state (:func:`_refactor`); worlds
            # (under vmap) whose factor is remade are computed apart (where_needed): a
            # world's last iterations usually change no state
            if search_on or not _HEAD_CHANGES:
                refactor = _refactor(rows, first, changed, acc, head, hstate,
                                     None if own_jt else J0T, own_jt)
            if search_on:
                lowt = where_needed(*refactor, s["lowt"])
            else:
                lowt = factor_t(acc[1])
            mgrad = factor_solve(lowt, grad)
        elif newton:
            mgrad = jnp.zeros_like(grad)
        else:
            mgrad = solve_m(grad)
        improvement = scale * imp
        # |grad| and the decrement grad' mgrad in one reduction
        gdots = isl.ddots(grad, jnp.stack([grad, mgrad], 1))
        grad_norm = jnp.sqrt(gdots[:, 0])
        gnorm = scale * grad_norm
        it = s["iter"] + move.astype(jnp.int32)
        dec_ok = jnp.maximum(0.0, 0.5 * scale * gdots[:, 1]) < tol
        conv = ((improvement > 0) & (improvement < tol)) | (gnorm < tol)
        # initial test (first pass): CG stops on a small decrement in the M metric;
        # Newton on a small gradient together with a small decrement in the M or the
        # Hessian metric (H >= M, so the Hessian one is implied by the M one)
        conv0 = (gnorm < tol) & dec_ok if newton else dec_ok
        if newton:
            conv = conv | dec_ok
            new_search = -mgrad
        else:
            y = grad - s["grad"]
            my = mgrad - s["mgrad"]
            sd = isl.ddots(search, jnp.stack([y, grad], 1))
            yd = isl.ddots(y, jnp.stack([my, mgrad], 1))
            dy, ymy = sd[:, 0], yd[:, 0]
            dys = where(dy < MINVAL, 1.0, dy)
            beta_hz = (yd[:, 1] - 2 * (ymy / dys) * sd[:, 1]) / dys
            eta_k = -1.0 / jnp.maximum(MINVAL, snorm * jnp.minimum(0.01, grad_norm))
            beta = where((dy < MINVAL) | first, 0.0, jnp.maximum(eta_k, beta_hz))
            new_search = -mgrad + isl.dx(beta, 0.0) * search
        kd = isl.dx(~take, True)

        def keep(a, b):
            return where(kd, a, b)

        done = where(first, conv0 | ~exists | (iterations <= 0),
                     s["done"] | ~move | conv | (it >= iterations))
        out = dict(qacc=keep(s["qacc"], qacc), Ma=keep(s["Ma"], Ma), jaref=jaref_new,
                   search=keep(search, new_search), grad=keep(s["grad"], grad),
                   mgrad=keep(s["mgrad"], mgrad), iter=it, done=done,
                   imp=where(move, improvement, s["imp"]),
                   gnorm=where(take, gnorm, s["gnorm"]), first=jnp.zeros((), bool),
                   qfrc=acc[0])
        if newton:
            out["lowt"] = lowt if hess else s["lowt"]
        return out

    # the loop carries three arrays instead of eleven (the (nv,) vectors stacked; the
    # per-island statistics, iteration counts and flags stacked as floats, small
    # integers being exact): every loop-carried array costs a copy and its own update
    # kernel per iteration. Both are stacked on their last axis: stacked on the first,
    # the kernels writing them (a concatenation across a wider minor axis, that LLVM
    # unswitches and vectorises per operand) took 5-10x the compile time (humanoid:
    # 0.47 of 0.81 s of the loop's LLVM time in two kernels)
    vecs = ("qacc", "Ma", "search", "grad", "mgrad") + (("qfrc",) if _CARRY_QFRC else ())
    fdt = qacc0.dtype

    def pack(s):
        first = jnp.broadcast_to(s["first"], s["imp"].shape)
        # Newton's Hessian factor is carried apart: stacked with the vectors, it was
        # transposed to and from LAPACK's layout on every pass
        return (jnp.stack([s[key] for key in vecs], 1), s["jaref"],
                jnp.stack([s["imp"], s["gnorm"], s["iter"].astype(fdt),
                           s["done"].astype(fdt), first.astype(fdt)], 1),
                s["lowt"] if newton else ())

    def unpack(c):
        v, jaref, st, low = c
        # the columns by one unstack each (math.unstack: fewer traced equations than a
        # slice and a squeeze per column, the same slices compiled)
        imp, gnorm, it, done = unstack(st, 1, 4)
        out = dict(zip(vecs, unstack(v, 1)), jaref=jaref, imp=imp, gnorm=gnorm,
                   iter=it.astype(jnp.int32), done=done != 0, first=st[0, 4] != 0)
        if newton:
            out["lowt"] = low
        return out

    zv = jnp.zeros_like(qacc0)
    s = dict(qacc=qacc0, Ma=Ma0, jaref=jaref0, search=zv, grad=zv, mgrad=zv, qfrc=zv,
             iter=jnp.zeros(isl.n, jnp.int32), done=jnp.zeros(isl.n, bool),
             imp=jnp.zeros(isl.n, qacc0.dtype), gnorm=jnp.zeros(isl.n, qacc0.dtype),
             first=jnp.ones((), bool))
    if newton:
        s["lowt"] = jnp.zeros_like(M)
    if newton and iterations == 1:
        # one iteration at most: the first pass, then one pass whose Hessian factor
        # nothing uses (every island is done after it), unrolled without a loop;
        # islands done after the first pass are left alone by the second
        s = body(body(s, search_on=False), hessian=False)
        qfrc = s["qfrc"]
    else:
        # a world whose islands are all done is left as it is by the body, as
        # live_loop requires; its flag is the world's own (live_loop reduces it over
        # the batch)
        c = live_loop(lambda c: (c[2][0, 4] != 0) | jnp.any(c[2][:, 3] == 0),
                      lambda c: pack(body(unpack(c))), batched_like(pack(s), qacc0),
                      tables=(((rows.needy, rows.nact),) if rows.needy is not None
                              else ()),
                      lazy=(rows.nact, jax.tree_util.tree_leaves((rows.src, rows.rest)))
                      if rows.nchunk > 1 else None)
        s = unpack(c)
        qfrc = s["qfrc"] if _CARRY_QFRC else None
    return s["qacc"], s["iter"], s["imp"], s["gnorm"], s["jaref"], qfrc


def _prepare_chunk(spec, x, jaref, J, search, acc):
    return acc, _prepare(spec, x, J, jaref, search)


def _eval_chunk(spec, x, jaref, J, args, acc):
    alpha, pre, fric = args
    return (_eval(spec, x, Islands(spec.nisl, x.get("rowisl")), pre, jaref, alpha, acc,
                  fric), ())


def _eval_rest(spec, x, jaref, sc, J, args, acc):
    """:func:`_eval_chunk` on a later chunk, its coefficients recomputed."""
    alpha, search, fric = args
    # a traced flag is taken as true: the loop usually runs no iteration, and the
    # conditional between the two sums compiled both and materialised their operands
    # (15 kernels on the humanoid); the sums are the same without friction-loss rows
    fric = fric if isinstance(fric, bool) else True
    pre = _prepare(spec, x, J, jaref, search)
    return (_eval(spec, x, Islands(spec.nisl, x.get("rowisl")), pre, jaref, alpha, acc,
                  fric, tie=False), sc)


def _refactor(rows, first, changed, acc, head, hstate, J0T, own):
    """(factor function, worlds that need it, its operands) for where_needed: the
    Hessian is a function of the rows' states (and of the cone rows' jaref): where no
    state changed and no row is in a cone, the factor in hand is that of the new
    Hessian, bit for bit. ``J0T``: chunk 0's J' made for the solve, or None (with
    ``own``, the factorisations make it from their own J, :data:`_JT_OWN`)."""
    need = first | changed | (rows.nact > 1)
    if rows.spec.ell:
        return (functools.partial(_factor, rows.spec, own=own), need,
                (acc[1], rows.J0, {k: rows.x0[k] for k in _HESS_KEYS}, head, hstate, J0T))
    # no cone rows: the rows enter by their quadratic weights alone, one (rows,) array
    # for where_needed to gather per block, not three
    return (functools.partial(_factor_quad, own=own), need,
            (acc[1], rows.J0, _quad_weights(rows.x0, hstate), J0T))


def _update_chunk(hess, spec, x, jaref, J, args, acc, states=False, JT=None):
    """Step of the rows of a chunk (``Jv`` = J search, None: no step): J' force added
    to acc[0], with ``hess`` the Hessian's row terms to acc[1] (``JT``: J' for them,
    :func:`_hessian`); out the rows' jaref
    (kept on islands not taking the step, ``take`` false), with ``states`` and the rows'
    states after the step (on islands not taking it, those of jaref)."""
    alpha, take, Jv = args
    isl = Islands(spec.nisl, x.get("rowisl"))
    new = jaref if Jv is None else jaref + isl.rx(alpha, 0.0) * Jv
    force, state, _ = update(spec, x, new, "fs")
    if not hess:
        out = (acc[0] + J.T @ force,) + acc[1:]
    elif solver_cost._ONE_JT:
        f, H = _force_hessian(spec, x, J, new, state, force, acc[1], JT)
        out = (acc[0] + f, H)
    else:
        out = (acc[0] + J.T @ force, _hessian(spec, x, J, new, state, acc[1], JT))
    kept = where(isl.rx(~take, True), jaref, new)
    return out, ((kept, state) if states else kept)


def _update_head(hess, spec, x, jaref, J, args, acc, JT=None, changes=True):
    """:func:`_update_chunk` on chunk 0; out (jaref, the rows' new states, whether a
    state changed: None unless ``changes``, where the caller reads it, so that the
    states before the step are not traced only to be dropped)."""
    acc, (out, state) = _update_chunk(hess, spec, x, jaref, J, args, acc, states=True,
                                      JT=JT)
    if not changes:
        return acc, (out, state, None)
    changed = reduce_fused(state != update(spec, x, jaref, "s")[1], 0, "any")
    if spec.ell:
        # the cone Hessians follow jaref
        changed = changed | reduce_fused(state == C.CONE, 0, "any")
    return acc, (out, state, changed)


# Measured and not taken: the stopping tests that need no factor (improvement, gradient,
# iteration count, no step) made before the refactorisation, and the worlds whose islands
# all stop by them left out of it (the factor of a world that stops is read by nothing
# after the loop; outputs bit-identical, float32 and float64). The solve alone on the
# stored settled states (batch 1024, float32, 12 paired rounds): ant 1.043 [0.807,
# 1.194], humanoid 0.984 [0.793, 1.173]; bench rollouts (10 rounds, medians) ant 292.3
# -> 293.6 ms a call, humanoid 231.4 -> 230.2. (The first pass, inside the loop, factors
# every world through where_needed whatever the change.)

#: whether :func:`_update_head` leaves out the state comparison, and _primal the
#: refactorisation's operands, where they are not read (False: always traced, for
#: paired measurements)
_HEAD_CHANGES = True

#: the per-row entries of the Hessian's row terms (:func:`_hessian`)
_HESS_KEYS = ("D", "active", "mu", "fr")


#: the factorisations of :func:`_refactor` make chunk 0's J' (:data:`_JT`) from the J
#: they are handed, for the worlds that need a factor, instead of receiving the J'
#: made once per solve for every world: under vmap that J' was gathered with J by
#: every trip of the Newton loop (:func:`~simjax.engine.solver_worlds.live_loop`) and
#: again by :func:`~simjax.engine.solver_worlds.where_needed`, and made for the batch
#: by a copy that XLA CPU ran as one small transpose per world (the ant's bench
#: rollout: 4096 per call, the costliest of its per-world transposes). Bench rollouts
#: (batch 1024, float32, paired in one process, loads 3-6), time with this on over
#: time with it off: run (process CPU, 12 rounds each) ant 0.956 [0.898, 1.089] and
#: 0.971 [0.776, 1.290], humanoid 1.020 [0.925, 1.289] and 1.012 [0.784, 1.155]; XLA
#: compile CPU ant 1.003 [0.713, 1.104] (8 rounds) and 0.988 [0.883, 1.142] (10),
#: humanoid 1.032 [0.985, 1.248] (8), 1.055 [0.924, 1.221] and 0.939 [0.845, 1.118] (10
#: each): noise, with the same kernels (ant 535, humanoid 624). Outputs (batch 64, 8
#: steps) bit-identical in float32 and float64 on both; barkour's and the shadow hand's
#: programs unchanged. Read at trace time (False: the J' of the solve, kept to compare)
_JT_OWN = True


def _own_jt(J, JT, own):
    """J' for the Hessian's row products: ``JT``, or with ``own`` made from ``J``,
    materialised (an optimisation barrier: XLA would fold the transpose into the
    product, :data:`_JT`)."""
    return jax.lax.optimization_barrier(jnp.swapaxes(J, -1, -2)) if own else JT


def _factor(spec, H, J, x, jaref, state, JT=None, own=False):
    """Transposed factor of the Hessian (:func:`spd_factor`): ``H`` (M plus the later
    chunks' row terms) plus chunk 0's row terms at ``jaref`` / ``state`` (rows ``x``,
    Jacobian ``J``). Transposed, LAPACK's column-major factor is a row-major
    array, the layout XLA gives loop-carried and conditional values: as it is, it was
    transposed to and from LAPACK's layout on every pass."""
    return factor_t(_hessian(spec, x, J, jaref, state, H, _own_jt(J, JT, own)))


# Measured and not taken (humanoid bench rollouts, batch 1024, float32, paired in one
# process, loads 8-11): the row product over chunk 0's first 32 rows only, for the
# worlds whose quadratic rows all lie there (the others the whole product, a
# conditional per block), 1.006 [0.946, 1.075] (16 rounds) and 1.024 [0.782, 1.178]
# (30), outputs bit-identical. The batched product (27 dofs) costs about 1.4 us per
# world plus 0.046 us per row: the call, not the rows. Also slower: factor_t without
# its symmetrising, 1.074 [0.913, 1.176] (float32 results change: M + J'DJ is not
# exactly symmetric); the product as (sqrt(D) J)'(sqrt(D) J), 1.4x (XLA has no
# symmetric rank-k product); LAPACK's upper factor instead of the lower, 1.2x.
def _factor_quad(H, J, dq, JT=None, own=False):
    """:func:`_factor` of rows without cone rows, by their quadratic weights ``dq``
    (:func:`_quad_weights`)."""
    return factor_t(_quad_hessian(H, J, dq, _own_jt(J, JT, own)))


def _update_rest(hess, spec, x, e, jaref, J, args, acc):
    """:func:`_update_chunk` on a later chunk (its jaref the loop's state), J search
    recomputed."""
    alpha, take, search = args
    Jv = None if search is None else J @ search
    return _update_chunk(hess, spec, x, jaref, J, (alpha, take, Jv), acc)
