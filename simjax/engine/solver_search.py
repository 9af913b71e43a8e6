"""The primal solvers' exact line search (MuJoCo's PrimalSearch, :mod:`simjax.engine.
solver`): the 1-D cost along the search direction, its quadratic coefficients per row
(PrimalPrepare) and per dof, its value and derivatives at a step length per island
(PrimalEval), and the bracketed Newton search on every island at once."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.math import matvec, unstack, where
from simjax.engine.solver_worlds import any_world

MINVAL = 1e-15


def _ell_rows(x, start, n, dim):
    return x[start:start + n * dim].reshape(n, dim)


def _prepare_dofs(p, isl, Ma, search):
    """The Gauss term of the 1-D cost along ``search`` (PrimalPrepare): ``qg``
    (islands, 4) per island, the dot products of ``search`` with itself, Ma,
    qfrc_smooth and M search (one reduction; :func:`_eval_point` makes the term of
    them), ``snorm`` the norm of ``search`` (islands,), ``Mv`` = M search."""
    Mv = matvec(p["M"], search)
    dots = isl.ddots(search, jnp.stack([search, Ma, p["qfrc_smooth"], Mv], 1))
    return dict(Mv=Mv, qg=dots, snorm=jnp.sqrt(dots[:, 0]))


def _prepare(spec, p, J, jaref, search):
    """Quadratic coefficients of the 1-D cost along ``search`` of the rows of ``p``
    (PrimalPrepare): ``Jv``, ``quad`` (rows, 4: the three coefficients, and the cost
    at 0 of one-sided rows) and the elliptic cone terms."""
    Jv = matvec(J, search)
    D = p["D"]
    dj0 = D * jaref
    cost = 0.5 * jaref * dj0
    # the cost at 0 of the one-sided rows as a fourth column (:func:`_eval`)
    quad = jnp.stack([cost, Jv * dj0, 0.5 * Jv * D * Jv, where(jaref < 0, cost, 0.0)], 1)
    ells = []
    for (start, n, dim), mu, fr in zip(spec.ell, p["mu"], p["fr"]):
        ja = _ell_rows(jaref, start, n, dim)
        jv = _ell_rows(Jv, start, n, dim)
        dd = _ell_rows(D, start, n, dim)
        qb = jnp.stack([0.5 * jnp.sum(ja * dd * ja, 1), jnp.sum(jv * dd * ja, 1),
                        0.5 * jnp.sum(jv * dd * jv, 1)], 1)
        u0, v0 = ja[:, 0] * mu, jv[:, 0] * mu
        u, v = ja[:, 1:] * fr, jv[:, 1:] * fr
        ells.append(dict(q=qb, u0=u0, v0=v0, uu=jnp.sum(u * u, 1), uv=jnp.sum(u * v, 1),
                         vv=jnp.sum(v * v, 1), dm=dd[:, 0] / (mu * mu * (1 + mu * mu))))
    return dict(Jv=Jv, quad=quad, ells=ells)


def _fric_cost(x, f, rf, D):
    # -x, not -rf (the same bits; see update)
    return where((-x < rf) & (x < rf), 0.5 * D * x * x,
                 where(-x >= rf, f * (-0.5 * rf - x), f * (-0.5 * rf + x)))


def _zone(n0, tsq, mu):
    pos = tsq > 0
    t = jnp.sqrt(where(pos, tsq, 1.0)) * pos
    top = where(pos, n0 >= mu * t, n0 >= 0)
    bottom = where(pos, ~top & (mu * n0 + t <= 0), n0 < 0)
    return where(top, 1, where(bottom, 2, 3)), t


def _ell_cost_dif(e, alpha):
    """cost(alpha) - cost(0) of elliptic cones (ellipticCostDif), and derivatives, per
    contact: (contacts, 3)."""
    mu, dm, q = e["mu"], e["dm"], e["q"]
    z0, t0 = _zone(e["u0"], e["uu"], mu)
    nn = e["u0"] + alpha * e["v0"]
    tsq = e["uu"] + alpha * (2 * e["uv"] + alpha * e["vv"])
    za, ta = _zone(nn, tsq, mu)
    quadv = alpha * alpha * q[:, 2] + alpha * q[:, 1]
    tdel = alpha * (2 * e["uv"] + alpha * e["vv"]) / where(ta + t0 > 0, ta + t0, 1.0)
    rdel = alpha * e["v0"] - mu * tdel
    r0 = e["u0"] - mu * t0
    ra = nn - mu * ta
    b0 = mu * e["u0"] + t0
    ba = mu * nn + ta
    c = jnp.zeros_like(nn)
    c = where((z0 == 2) & (za == 2), quadv, c)
    c = where((z0 == 3) & (za == 3), 0.5 * dm * rdel * (2 * r0 + rdel), c)
    c = where((z0 == 3) & (za == 2), quadv + 0.5 * dm * b0 * b0, c)
    c = where((z0 == 2) & (za == 3), quadv - 0.5 * dm * ba * ba, c)
    c = where((z0 == 1) & (za == 2), quadv + q[:, 0], c)
    c = where((z0 == 1) & (za == 3), 0.5 * dm * ra * ra, c)
    c = where((z0 == 3) & (za == 1), -0.5 * dm * r0 * r0, c)
    c = where((z0 == 2) & (za == 1), -q[:, 0], c)
    # derivatives
    tsafe = where(ta > 0, ta, 1.0)
    n1 = e["v0"]
    t1 = (e["uv"] + alpha * e["vv"]) / tsafe
    t2 = e["vv"] / tsafe - (e["uv"] + alpha * e["vv"]) * t1 / (tsafe * tsafe)
    d0 = where(za == 2, 2 * alpha * q[:, 2] + q[:, 1],
               where(za == 3, dm * ra * (n1 - mu * t1), 0.0))
    d1 = where(za == 2, 2 * q[:, 2],
               where(za == 3, dm * ((n1 - mu * t1) ** 2 + ra * (-mu * t2)), 0.0))
    return jnp.stack([c, d0, d1], 1)


def _eval(spec, p, isl, pre, start, alpha, acc, fric=True, tie=True):
    """PrimalEval's sums over the rows of ``p`` (``pre`` of :func:`_prepare`, at
    ``start`` = jaref) at one step length per island, ``alpha`` (islands,), added to
    ``acc`` (islands, 6): quadratic coefficients (3) and cost difference and its
    derivatives (3) (:func:`_eval_point` makes the point).

    Every scalar row contributes either quadratic coefficients (equality rows, active
    one-sided rows; summed before evaluation, as MuJoCo) or its cost difference and
    derivatives directly (friction loss; one-sided rows leaving the active set): one
    (rows, 6) array and a single reduction per island.

    ``fric``: whether friction-loss rows may be among the rows: True, False (static),
    or a traced flag (unbatched under vmap: :func:`simjax.engine.solver_rows.any_world`)
    choosing at run time. Without them the Huber terms, about half of the work per
    row, are not evaluated (the same sums: a friction-loss term is zero on every other
    row). Models declare friction-loss rows for every dof whose friction loss could be
    set, usually zero: the humanoid's solve ran 0.86x (batch 1024, float32).

    ``tie``: ``pre``'s rows' terms are tied to ``alpha`` by an optimisation barrier,
    for rows whose terms are made once before the line search's loop (chunk 0; a
    later chunk's are made in its loop, :func:`~simjax.engine.solver_primal.
    _eval_rest`): untied, XLA's loop-invariant code motion hoisted what the sums make
    of them alone (the cost at 0, quad0 - cost0) out of the loop as kernels of their
    own, and the columns of ``quad`` were stored apart, a kernel each (the cost at 0
    is ``quad``'s fourth column, made with the others). The bench rollouts (batch
    1024): 4 kernels fewer on each of barkour, ant, humanoid, shadow hand; float64
    outputs bit-identical. Not done: ``quad`` made in the loop from D, jaref and J
    search (2 kernels fewer on barkour and the ant): its products would be fused
    into the sums over the rows, which a multiply-add contraction could round
    otherwise."""
    eq, fr, iq = spec.eq, spec.fric, spec.ineq
    quad, Jv = pre["quad"], pre["Jv"]
    if tie:
        quad, Jv = jax.lax.optimization_barrier((quad, Jv, alpha))[:2]

    # each branch computes the step and the one-sided rows' terms itself: computed once
    # outside the branches they were materialised apart from the sums, and rounded
    # differently from one fused evaluation (ant, shadow hand: 2e-7 in qacc, float32)
    def one_sided():
        # one-sided rows: quadratic where active at alpha, minus their cost at 0; the
        # step x, the three quadratic columns and the cost of rows leaving the set
        x = start + isl.rx(alpha, 0.0) * Jv
        cost0 = quad[:, 3]
        act = iq & (x < 0)
        qrow = eq | act
        cols = [where(act, quad[:, 0] - cost0, 0.0),
                where(qrow, quad[:, 1], 0.0), where(qrow, quad[:, 2], 0.0)]
        return x, cols, where(iq & ~act, cost0, 0.0)

    def with_fric():
        x, cols, leave = one_sided()
        # friction loss: cost(alpha) - cost(0) and derivatives of the Huber cost
        f, D = p["floss"], p["D"]
        rf = p["R"] * f
        quadz = (-x < rf) & (x < rf)
        fcost = _fric_cost(x, f, rf, D) - _fric_cost(start, f, rf, D)
        dz0 = where(quadz, D * x * Jv, where(-x >= rf, -(f * Jv), f * Jv))
        dz1 = where(quadz, D * Jv * Jv, 0.0)
        rows = jnp.stack(cols + [where(fr, fcost, 0.0) - leave, where(fr, dz0, 0.0),
                                 where(fr, dz1, 0.0)], -1)
        return isl.rsum(rows)                                       # (islands, 6)

    def without():
        _, cols, leave = one_sided()
        tot = isl.rsum(jnp.stack(cols + [-leave], -1))
        return jnp.concatenate([tot, jnp.zeros_like(tot[:, :2])], -1)

    if isinstance(fric, bool):
        acc = acc + (with_fric() if fric else without())
    else:
        acc = acc + jax.lax.cond(fric, with_fric, without)
    for e, (start, n, dim), mu in zip(pre["ells"], spec.ell, p["mu"]):
        ids = isl.block(start, n, dim)
        c = isl.bsum(ids, _ell_cost_dif(dict(e, mu=mu), isl.bx(ids, alpha)))
        acc = acc + jnp.concatenate([jnp.zeros_like(c), c], 1)
    return acc


def _eval_point(qg, alpha, tot):
    """(islands, 4) points (alpha, cost(alpha) - cost(0), d cost, d2 cost) from the row
    sums ``tot`` of :func:`_eval` and the dot products ``qg`` of :func:`_prepare_dofs`
    (the Gauss term made of them here, in the line search's loop: tied to ``alpha``
    by an optimisation barrier, not hoisted out of it as a kernel per column)."""
    qg = jax.lax.optimization_barrier((qg, alpha))[0]
    qg = jnp.stack([qg[:, 1] - qg[:, 2], 0.5 * qg[:, 3]], 1)
    if _LEAN:
        (q0, q1, q2, cost, d0, d1), (g0, g1) = unstack(tot, 1), unstack(qg, 1)
        q1, q2 = q1 + g0, q2 + g1
    else:
        q0, q1, q2 = tot[:, 0], tot[:, 1] + qg[:, 0], tot[:, 2] + qg[:, 1]
        cost, d0, d1 = tot[:, 3], tot[:, 4], tot[:, 5]
    cost = cost + alpha * alpha * q2 + alpha * q1 + q0
    d0 = d0 + 2 * alpha * q2 + q1
    d1 = d1 + 2 * q2
    d1 = where(d1 <= 0, MINVAL, d1)
    return jnp.stack([alpha, cost, d0, d1], -1)


def _transitions():
    """The line search's transitions (:func:`_linesearch`), (41, 8) int32: per
    transition, the source of the new p1, p2, p1n, p2n, res (0-4 the old points, 5 the
    new point q, 6 zero), the new phase (-1: unchanged), whether the island is done,
    the new f2 flag (-1: unchanged). Phase 4's updates (15-30) are 15 + (p1's source
    among p1, p1n, p2n, q) + 4 (p2's among p2, p1n, p2n, q); 15 itself (neither
    moves) does not occur (14 is taken)."""
    P1, P2, P1N, P2N, RES, Q, ZERO = range(7)
    rows = []

    def row(ph, done=0, f2=-1, **src):
        r = [src.get(key, j) for j, key in enumerate(("p1", "p2", "p1n", "p2n", "res"))]
        rows.append(r + [ph, done, f2])

    lbs = (P1, P2, ZERO)
    row(1, p2=Q)                                                    # 0: phase 0
    for ph, extra in ((1, {}), (2, dict(p2=P1))):                   # 1-3, 4-6
        row(ph, 1, p1=Q, res=Q, **extra)                            # finished
        row(2, p1=Q, **extra)                                       # one more step
        row(3, p1=Q, p2n=Q, **extra)                                # to bracketing
    row(4, p1n=Q)                                                   # 7: phase 3
    for lb in lbs:                                                  # 8-10
        row(4, 1, p1n=Q, res=lb)
    for best in (P1N, P2N, Q):                                      # 11-13: phase 4
        row(4, 1, res=best)
    row(6, 1, 0, res=Q)                                             # 14: no update
    for u2 in (P2, P1N, P2N, Q):                                    # 15-30: update
        for u1 in (P1, P1N, P2N, Q):
            row(5 if u1 != P1 else 6, 0, int(u2 != P2), p1=u1, p2=u2)
    row(6, p1n=Q)                                                   # 31: phase 5
    row(4, p1n=Q)                                                   # 32
    for lb in lbs:                                                  # 33-35
        row(4, 1, p1n=Q, res=lb)
    row(4, p2n=Q)                                                   # 36: phase 6
    for lb in lbs:                                                  # 37-39
        row(4, 1, p2n=Q, res=lb)
    row(-1)                                                         # 40: done earlier
    return np.asarray(rows, np.int32)


_TRANSITIONS = _transitions()


#: the line search's loop runs while an island of any world searches (an unbatched flag
#: under vmap, :func:`~simjax.engine.solver_worlds.any_world`), the islands done kept
#: as they are by the body; read at trace time (False: a flag per world, for which vmap
#: selects between the body's output and its input on every trip, kept to compare).
#: Ant's bench rollout 585 -> 584 kernels, XLA compile off / on 0.997 [0.989, 1.038]
#: (6 rounds), run 1.005 [0.968, 1.041] (8 rounds); outputs bit-identical
_ANY_WORLD = True

#: the line search's decisions traced with fewer operations, the same outcomes: the
#: bracket updates' sign tests as ``d < c < 0 or d > c > 0`` (the sign of ``d`` is
#: implied) with the candidates' signs computed once for both ends, and the first
#: convergence candidate tested without the (empty) earlier ones; the points' and
#: sums' columns split once (:func:`~simjax.engine.math.unstack`), not sliced one by
#: one; :func:`_select` as nested selects; read at trace time (False: as MuJoCo writes
#: them, kept to compare). The bench's batched rollout: ant 3821 -> 3733 equations;
#: its optimised HLO 23 comparisons, 19 ands and 6 nots fewer, no argmax; outputs
#: bit-identical (float64, float32: ant, humanoid, barkour) when measured; 4 float64
#: steps from MuJoCo-settled states since: ant, barkour bit-identical, humanoid and
#: shadow hand rounding (1e-14 relative: qacc_smooth 3.9e-11 of 3912). Off (2 kernels
#: more): XLA CPU ant 0.969x [0.823, 1.033] (7 fresh-process pairs), humanoid 0.988x
#: [0.914, 1.255] (4), lowering 1.13x and 1.08x, load 5-10: noise, so on
_LEAN = True


def _select(conds, choices, default):
    """``jnp.select``: with :data:`_LEAN` as nested selects (the first condition that
    holds picks its choice; jnp's stacks the conditions and takes their argmax, a
    reduction)."""
    if not _LEAN:
        return jnp.select(conds, choices, default)
    # jnp.select's result type (a weak integer takes the strong one's width)
    dtype = jnp.result_type(default, *choices)

    def full(v):
        return jnp.broadcast_to(jnp.asarray(v, dtype), conds[0].shape)

    out = full(default)
    for c, x in zip(conds[::-1], choices[::-1]):
        out = jax.lax.select(c, full(x), out)
    return out


def _linesearch(evaluate, k, dtype, gtol, ls_iter, skip):
    """MuJoCo's PrimalSearch on every island at once, returning (alpha, improvement),
    (islands,) each; islands in ``skip`` are not searched (alpha 0); ``evaluate(alpha)``
    the (islands, 4) point at step lengths ``alpha`` (islands,) (:func:`_eval_point`).

    Points are (islands, 4) arrays of (alpha, cost, deriv, deriv2); ``n`` counts an
    island's evaluations as LSiter does. Written as one ``while_loop`` state machine
    that evaluates exactly one point per island per iteration (so the cost evaluation
    appears once in the program) until every island has finished its own search:
    phase 0 alpha = 0, 1 first Newton step, 2 one-sided Newton steps, 3 Newton point of
    p1 before bracketing, 4 bracket midpoint, 5 / 6 Newton points of updated brackets.

    An iteration's outcome per island is one transition (a row of ``_TRANSITIONS``),
    picked by one integer ``t``: every new point is one of the old points, the new
    point or zero, taken by index. The decisions are so computed once per island; as
    a select per point slot, XLA's CPU fusion evaluated them again in every slot of
    the packed state's concatenation (one kernel of 630-980 ms of LLVM time per model).
    The table row of ``t`` is the index operand of the points' gather, which XLA's
    CPU fusion materialises (one small kernel computes ``t`` and its row) instead of
    fusing it into every slot. The same comparisons in the same order as MuJoCo's,
    and only selections: the results are those of the per-slot selects.
    """
    zero = jnp.zeros((k, 4), dtype)

    def newton(q):
        return q[0] - q[2] / q[3]

    def i32(x):
        return jnp.asarray(x, jnp.int32)

    table = jnp.asarray(_TRANSITIONS)

    def body(s, f):
        # the points' columns (x, f, f', f''), each split once
        ph, p1, p2, p1n, p2n = (s["ph"], unstack(s["p1"]), unstack(s["p2"]),
                                unstack(s["p1n"], count=3), unstack(s["p2n"], count=3))
        alpha = _select([ph == 0, ph == 1, ph == 4, ph == 6],
                        [jnp.zeros(k, dtype), newton(p2), 0.5 * (p1[0] + p2[0]),
                         newton(p2)], newton(p1))
        q_ = evaluate(alpha)
        q = unstack(q_, count=3)
        n = s["n"] + 1
        stop = n >= ls_iter
        # phases 1 and 2 (first and one-sided Newton steps; phase 1 sets the direction):
        # finished (converged, or out of evaluations), one more step, or to bracketing
        direction = where(q[2] < 0, 1.0, -1.0).astype(dtype)
        init_ok = (jnp.abs(q[2]) < gtol) & ((q[0] == 0) | (q[1] < 0))
        ok2 = (jnp.abs(q[2]) < gtol) & (q[1] < 0)
        sdir = where(ph == 1, direction, s["dir"])
        # q' sdir <= -gtol as gtol <= -(q' sdir) (negation is exact: the same outcome):
        # -gtol, loop-invariant, was hoisted out of the loop as a kernel of its own
        more = (gtol <= -(q[2] * sdir)) & ~stop
        fin12 = where(ph == 1, init_ok, ok2) | (~more & stop)
        t12 = where(fin12, 0, where(more, 1, 2)) + where(ph == 1, 1, 4)
        # the bracket's last point (LastBracket): p1, p2 or zero
        lb1 = (p1[1] <= p2[1]) & (p1[1] < 0)
        lb2 = (p2[1] <= p1[1]) & (p2[1] < 0)
        lb = where(lb1, 0, where(lb2, 1, 2))
        # phase 4: convergence over the candidates p1n, p2n, q and the bracket updates
        cands = (p1n, p2n, q)
        if _LEAN:
            # the first candidate: nothing found before it (best stays 0)
            found = jnp.abs(p1n[2]) < gtol
            best, bestc = i32(0), where(found, p1n[1], jnp.zeros(k, dtype))
        else:
            best, bestc, found = i32(0), jnp.zeros(k, dtype), jnp.zeros(k, bool)
        for j, cand in enumerate(cands):
            if _LEAN and j == 0:
                continue
            ok = (jnp.abs(cand[2]) < gtol) & (~found | (cand[1] < bestc))
            best = where(ok, j, best)
            bestc = where(ok, cand[1], bestc)
            found = found | ok
        # the candidates' slope signs, shared by both ends (:data:`_LEAN`)
        signs = [(cand[2] < 0, cand[2] > 0) for cand in cands] if _LEAN else None

        def upd(pb):
            # the candidate (1 + its position; 0: pb itself) that replaces pb
            j, d = i32(0), pb[2]
            for c, cand in enumerate(cands):
                if _LEAN:
                    # d < cand < 0 or d > cand > 0: MuJoCo's tests (both slopes
                    # negative, d the lower; else both positive, d the higher), d's
                    # sign implied by the candidate's
                    neg, pos = signs[c]
                    move = (neg & (d < cand[2])) | (pos & (d > cand[2]))
                else:
                    neg = (d < 0) & (cand[2] < 0) & (d < cand[2])
                    move = neg | (~neg & (d > 0) & (cand[2] > 0) & (d > cand[2]))
                j = where(move, c + 1, j)
                d = where(move, cand[2], d)
            return j

        u1, u2 = upd(p1), upd(p2)
        # phase 4: converged (res = the best candidate); no bracket end moves (res = q);
        # else the ends move. Phases 3, 5, 6 store their Newton point and go on, or stop
        # out of evaluations (res = LastBracket); phase 5 with f2 goes to phase 6 first
        t4 = where(found, 11 + best,
                   where((u1 == 0) & (u2 == 0), 14, 15 + u1 + 4 * u2))
        t5 = where(s["f2"], 31, where(stop, 33 + lb, 32))
        t6 = where(stop, 37 + lb, 36)
        t3 = where(stop, 8 + lb, 7)
        t = _select([ph == 0, ph <= 2, ph == 3, ph == 4, ph == 5],
                    [i32(0), t12, t3, t4, t5], t6)
        if k > 1 or _ANY_WORLD:
            # islands (and, under vmap with :data:`_ANY_WORLD`, worlds) that finished
            # earlier stay as they are
            t = where(s["done"], 40, t)
            n = where(s["done"], s["n"], n)
            sdir = where(s["done"], s["dir"], sdir)
        row = table[t]                  # the points' gather indices: computed once
        sources = jnp.concatenate([f[:, :len(pts)], q_[:, None], zero[:, None]], 1)
        points = jnp.take_along_axis(sources, row[:, :len(pts), None], 1)
        out = dict(dir=sdir, n=n, ph=where(row[:, 5] < 0, ph, row[:, 5]),
                   done=s["done"] | (row[:, 6] == 1),
                   f2=where(row[:, 7] < 0, s["f2"], row[:, 7] == 1))
        return pack_meta(out, points)

    # the loop carries one array: the points, and the direction, phase, evaluation count
    # and flags as floats (small integers, exact). Every loop-carried array costs a copy
    # and its own update kernel per iteration, and the small per-island predicates
    # feeding several update kernels were each a kernel of their own (one carried array
    # instead of three: 23 -> 15 kernels per iteration on the humanoid)
    pts = ("p1", "p2", "p1n", "p2n", "res")

    def pack_meta(s, points):
        meta = jnp.stack([s["dir"], s["ph"].astype(dtype), s["n"].astype(dtype),
                          jnp.zeros(k, dtype), s["f2"].astype(dtype),
                          s["done"].astype(dtype), jnp.zeros(k, dtype),
                          jnp.zeros(k, dtype)], 1).reshape(k, 2, 4)
        return jnp.concatenate([points, meta], 1)

    def pack(s):
        return pack_meta(s, jnp.stack([s[key] for key in pts], 1))

    def unpack(f):
        if _LEAN:
            # the slots split once, the two meta slots' columns once each
            rows = unstack(f, 1)
            s = dict(zip(pts, rows))
            meta = unstack(rows[len(pts)], 1) + unstack(rows[len(pts) + 1], 1)
        else:
            s = {key: f[:, j] for j, key in enumerate(pts)}
            meta = f[:, len(pts):].reshape(k, 8)
            meta = {j: meta[:, j] for j in (0, 1, 2, 4, 5)}
        return dict(s, dir=meta[0], ph=meta[1].astype(jnp.int32),
                    n=meta[2].astype(jnp.int32), f2=meta[4] != 0, done=meta[5] != 0)

    s = dict(ph=jnp.zeros(k, jnp.int32), p1=zero, p2=zero, p1n=zero, p2n=zero,
             n=jnp.zeros(k, jnp.int32), dir=jnp.ones(k, dtype), f2=jnp.zeros(k, bool),
             res=zero, done=skip)

    def more(f):
        going = jnp.any(f[:, len(pts) + 1, 1] == 0)
        return any_world(going) if _ANY_WORLD else going

    c = inline.while_loop(more,
                          lambda f: body(unpack(f), f), pack(s))
    res = c[:, pts.index("res")]
    return res[:, 0], -res[:, 1]
