"""Constraint solvers (MuJoCo's engine_solver and mj_fwdConstraint): Newton, CG, PGS, the
noslip post-pass and warmstart.

All solvers find the unique minimiser of MuJoCo's convex constraint problem
(Todorov 2014, "Convex and analytically-invertible dynamics with contacts and
constraints"):

    qacc* = argmin_a  0.5 (a - qacc_smooth)' M (a - qacc_smooth) + s(J a - aref)

with s the sum of per-row costs (quadratic for equality rows, Huber for friction loss,
one-sided quadratic for limits and pyramidal / frictionless contacts, the elliptic cone
cost for elliptic contacts). Newton and CG are MuJoCo's primal solvers with its exact
line search (PrimalSearch: Newton steps on the piecewise-quadratic 1-D cost, then a
bracketed search; :mod:`simjax.engine.solver_search`), run on every constraint island
(mj_island) separately as MuJoCo 4.0.0 does (:class:`simjax.engine.solver_islands.Islands`); PGS
(:mod:`simjax.engine.pgs`) is MuJoCo's projected Gauss-Seidel on the dual with Nesterov
momentum and gradient restarts, per island, visiting the blocks in MuJoCo's seeded
shuffled order (same iterates as MuJoCo).

Differentiation (reverse and forward): the solution is differentiated implicitly. The
optimum satisfies g(qacc*, theta) = M qacc* - qfrc_smooth - J' f(J qacc* - aref) = 0, so
d qacc* = -H^-1 dg/dtheta with H = dg/dqacc the constraint Hessian at the solution
(M + J' D_active J plus the elliptic cone Hessians: exactly the matrix Newton factors).
``_implicit`` is a ``jax.custom_jvp`` whose tangent rule solves one linear system with H
(JAX transposes it for reverse mode), independent of the iteration count; the forward
iterations (``lax.while_loop`` with MuJoCo's early exits) run on stop-gradient inputs
and are never differentiated. This is exact wherever the active set is
locally constant (the generic case) and needs no memory per iteration, unlike a
differentiated fixed-length scan. The noslip post-pass (a fixed number of sweeps) is
differentiated directly.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import constraint as C
from simjax.engine import inline, lapack_chol, tables, tree_linalg
from simjax.engine.data import NISLAND
from simjax.engine.math import reduce_fused, where
from simjax.engine.pgs import _ar, _islands, _noslip, _pgs, _row_trees, block_order
from simjax.engine.solver_islands import Islands
from simjax.engine.solver_rows import gather as gather_rows
from simjax.engine.solver_rows import Chunked, find_chunks, head_chunk, rest_chunks, rest_zeros
from simjax.engine.solver_rows import any_world, batched_like, row_capacity, where_needed
from simjax.engine.solver_rows import spread as spread_rows
from simjax.engine.solver_rows import whole as whole_rows
from simjax.engine.solver_search import MINVAL, _ell_rows, _eval, _eval_point, _linesearch
from simjax.engine.solver_search import _prepare, _prepare_dofs
from simjax.types import DisableBit, SolverType


# --------------------------------------------------------------------------- dense algebra
def spd_factor(a):
    """Lower Cholesky factor of a symmetric positive definite (..., n, n) matrix
    (LAPACK potrf on CPU, batched under vmap; many times faster than the column loop
    of :func:`simjax.engine.pgs.cholesky`). For the constraint Hessians, M + J' D J
    with M positive definite.

    The input is symmetrised (as jnp.linalg.cholesky does) and handed to LAPACK, which
    reads column-major, as its transpose (the same symmetric matrix): a free relabelling
    of the row-major array. Handed the matrix itself, XLA stores it transposed, and
    propagates that layout up to M: batches of small transposes of M around the
    solver loops cost more than the factorisation."""
    t = lambda x: jnp.swapaxes(x, -1, -2)
    return jax.lax.linalg.cholesky(t(0.5 * (a + t(a))), symmetrize_input=False)


def _potrf(a):
    """(U, LAPACK info): the upper Cholesky factor U (row-major, U' U = a) of the
    exactly symmetric ``a`` (..., n, n) by LAPACK potrf (CPU). potrf writes the lower
    factor L column-major over its input, the same memory as L' = U row-major: the
    buffers are declared row-major, ``a`` being its own transpose; U's strictly lower
    triangle is the input's."""
    from jaxlib import lapack
    call = jax.ffi.ffi_call(
        lapack.prepare_lapack_call("potrf_ffi", a.dtype),
        (jax.ShapeDtypeStruct(a.shape, a.dtype),
         jax.ShapeDtypeStruct(a.shape[:-2], jnp.int32)),
        input_output_aliases={0: 0})
    return call(a, uplo=np.uint8(ord("L")))


@jax.custom_batching.custom_vmap
def _potrf_v(a):
    """:func:`_potrf`; under ``vmap`` one call on the batch (LAPACK loops over it)."""
    return _potrf(a)


@_potrf_v.def_vmap
def _potrf_rule(size, flags, a):
    return _potrf_v(a), (flags[0], flags[0])


def factor_t(a):
    """:func:`spd_factor` of ``a`` (..., n, n) transposed: the upper factor U = L',
    row-major (the layout XLA gives loop-carried and conditional values), NaN in U[0, 0]
    where the factorisation failed (:func:`spd_solve` then gives NaN). On CPU LAPACK is
    called directly (:func:`_potrf`): jax's cholesky zeroes the upper triangle and
    selects NaN on failure in the factor's column-major layout, and XLA made those
    selects two transposing passes over the factors (kernels slow to compile as well);
    U's strictly lower triangle is not zeroed (:func:`spd_solve` reads U's upper
    triangle, L's lower, only). The same bits as :func:`spd_factor`."""
    t = lambda x: jnp.swapaxes(x, -1, -2)
    if not lapack_chol.enabled(a.shape[-1]):
        return t(spd_factor(a))
    up, info = _potrf_v(0.5 * (a + t(a)))
    # failure marked by one NaN on the diagonal (a whole NaN factor is a pass of its own)
    return up.at[..., 0, 0].set(where(info == 0, up[..., 0, 0], jnp.nan))


def spd_solve(low, b):
    """Solve (L L') x = b for a factor of :func:`spd_factor`; b (n,)."""
    tri = jax.lax.linalg.triangular_solve
    y = tri(low, b[:, None], left_side=True, lower=True)
    return tri(low, y, left_side=True, lower=True, transpose_a=True)[:, 0]


#: products with the warm start's two points (nv, 2) as two matrix-vector products,
#: read at trace time: XLA CPU hands a batched (n, nv) x (nv, 2) product to YNNPACK,
#: whose per-world cost is 2-3x that of two of its own matrix-vector products
#: (batch 1024, float32, process CPU: 18 x 18 0.37 -> 0.12 us per world, 35 x 18
#: 0.52 -> 0.21, 54 x 27 0.77 -> 0.35)
_COLUMNS = True


def _times_cols(a, x):
    """a x for ``a`` (n, k) and ``x`` (k, c) (few columns): with :data:`_COLUMNS`
    column by column."""
    if not _COLUMNS:
        return a @ x
    return jnp.stack([a @ x[:, j] for j in range(x.shape[1])], 1)


# --------------------------------------------------------------------------- problem
@dataclasses.dataclass(frozen=True)
class Spec:
    """Static structure of the rows: masks (numpy) and elliptic blocks (start, n, dim);
    ``nisl`` the number of constraint islands the primal solvers iterate on separately
    (1: one problem; else the island capacity, rows and dofs in ``p['rowisl']``,
    ``p['dofisl']``)."""
    eq: np.ndarray
    fric: np.ndarray
    ineq: np.ndarray
    ell: tuple
    nefc: int
    nv: int
    nisl: int = 1

    def __hash__(self):
        return hash((self.eq.tobytes(), self.fric.tobytes(), self.ell, self.nefc, self.nv,
                     self.nisl))

    def __eq__(self, other):
        return hash(self) == hash(other)


def spec_from_layout(lay, nv):
    t = lay.efc_type
    ell = tuple((b.start, b.n, b.dim) for b in lay.blocks if b.kind == "conell")
    return Spec(eq=t == C.EQUALITY, fric=(t == C.FRICTION_DOF) | (t == C.FRICTION_TENDON),
                ineq=(t >= C.LIMIT_JOINT) & (t != C.CONTACT_ELLIPTIC), ell=ell,
                nefc=len(t), nv=nv)


def _ell_update(jar, D, mu, fr):
    """Elliptic cone zones (mj_constraintUpdate): force (n,dim), cost (n,), state (n,)."""
    u = jnp.concatenate([jar[:, :1] * mu[:, None], jar[:, 1:] * fr], 1)
    nn = u[:, 0]
    tt2 = jnp.sum(u[:, 1:] ** 2, 1)
    pos = tt2 > 0
    tt = jnp.sqrt(where(pos, tt2, 1.0))
    tt = where(pos, tt, 0.0)
    top = (nn >= mu * tt) | (~pos & (nn >= 0))
    bottom = ~top & ((mu * nn + tt <= 0) | (~pos & (nn < 0)))
    dm = D[:, 0] / (mu * mu * (1 + mu * mu))
    nmt = nn - mu * tt
    f0 = -dm * nmt * mu
    tsafe = where(pos, tt, 1.0)
    fj = -f0[:, None] / tsafe[:, None] * u[:, 1:] * fr
    fmid = jnp.concatenate([f0[:, None], fj], 1)
    fq = -D * jar
    force = where(top[:, None], 0.0, where(bottom[:, None], fq, fmid))
    cost = where(top, 0.0, where(bottom, 0.5 * jnp.sum(D * jar * jar, 1),
                                 0.5 * dm * nmt * nmt))
    state = where(top, C.SATISFIED, where(bottom, C.QUADRATIC, C.CONE))
    return force, cost, state


def _ell_mid_cost(jar, D0, mu, fr):
    u = jnp.concatenate([jar[:1] * mu, jar[1:] * fr])
    tt = jnp.sqrt(jnp.sum(u[1:] ** 2))
    dm = D0 / (mu * mu * (1 + mu * mu))
    return 0.5 * dm * (u[0] - mu * tt) ** 2


def update(spec, p, jar):
    """Forces, states and constraint cost at jar = J qacc - aref (mj_constraintUpdate)."""
    D, R, fl = p["D"], p["R"], p["floss"]
    # negations fall on the values at jar, not on the rows' constants (the same bits): a
    # negated constant is hoisted out of the solver loops, one more (worlds, rows) array
    # kept through the solve
    force = -(D * jar)
    cost_row = 0.5 * D * jar * jar
    state = jnp.full(jar.shape, C.QUADRATIC, jnp.int32)
    # friction loss (Huber)
    rf = R * fl
    neg = spec.fric & (-jar >= rf)
    posv = spec.fric & ~neg & (jar >= rf)
    force = where(neg | posv, fl * where(neg, 1.0, -1.0), force)
    cost_row = where(neg, -0.5 * R * fl * fl - fl * jar,
                     where(posv, -0.5 * R * fl * fl + fl * jar, cost_row))
    state = where(neg, C.LINEARNEG, where(posv, C.LINEARPOS, state))
    # one-sided rows
    sat = spec.ineq & (jar >= 0)
    force = where(sat, 0.0, force)
    cost_row = where(sat, 0.0, cost_row)
    state = where(sat, C.SATISFIED, state)
    cost = reduce_fused(where(spec.eq | spec.fric | spec.ineq, cost_row, 0.0), 0)
    for (start, n, dim), mu, fr in zip(spec.ell, p["mu"], p["fr"]):
        f, c, s = _ell_update(_ell_rows(jar, start, n, dim), _ell_rows(D, start, n, dim),
                              mu, fr)
        sl = slice(start, start + n * dim)
        force = force.at[sl].set(f.reshape(-1))
        state = state.at[sl].set(jnp.repeat(s, dim).astype(jnp.int32))
        cost = cost + jnp.sum(c)
    if "active" in p:
        state = where(p["active"], state, C.SATISFIED)
    return force, state, cost


def _quad_weights(p, state):
    """D_q: the rows' D where quadratic (and active), else 0 (MakeHessian)."""
    return where((state == C.QUADRATIC) & p["active"], p["D"], 0.0)


def _quad_hessian(H, J, dq, JT=None):
    """H + J' diag(dq) J: the quadratic rows' part of :func:`_hessian` (``JT``: J',
    where made once for many products)."""
    return H + (J.T if JT is None else JT) @ (dq[:, None] * J)


def _hessian(spec, p, J, jar, state, H, JT=None):
    """H + J' D_q J + sum of elliptic cone Hessians (MakeHessian, HessianCone; H = M
    for the whole Hessian) of the rows of ``p``, Jacobian ``J`` (``JT``: see
    :func:`_quad_hessian`)."""
    H = _quad_hessian(H, J, _quad_weights(p, state), JT)
    for (start, n, dim), mu, fr in zip(spec.ell, p["mu"], p["fr"]):
        jr = _ell_rows(jar, start, n, dim)
        d0 = p["D"][start:start + n * dim:dim]
        hc = jax.vmap(jax.hessian(_ell_mid_cost))(jr, d0, mu, fr)           # (n, d, d)
        cone = state[start:start + n * dim:dim] == C.CONE
        hc = where(cone[:, None, None], hc, 0.0)
        jb = J[start:start + n * dim].reshape(n, dim, -1)
        H = H + jnp.einsum("nik,nij,njl->kl", jb, hc, jb)
    return H


def gradient(spec, p, qacc):
    """g(qacc) = M qacc - qfrc_smooth - J' f(J qacc - aref): zero at the optimum."""
    jar = p["J"] @ qacc - p["aref"]
    force, _, _ = update(spec, p, jar)
    return p["M"] @ qacc - p["qfrc_smooth"] - p["J"].T @ force


# --------------------------------------------------------------------------- primal solvers
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
#: J' force by the same J' made the step 1.018x: it stays J.T @ force. Read at trace
#: time; False: the former way, kept to compare
_JT_FIRST = True


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
    J' force at it (nv,) where the last pass computed it (one iteration at most),
    else None.

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
        scale = (1.0 / jnp.maximum(MINVAL, jnp.trace(M)))[None]
        exists = reduce_fused(p["active"], 0, "any")[None]
    else:
        trace = isl.ddot(jnp.diag(M), jnp.ones_like(qacc0))
        scale = 1.0 / where(trace > 0, trace, 1.0)
        exists = isl.rsum(p["active"].astype(jnp.int32)) > 0
    solve_m = p["solve_m"]
    gtol_base = tol * p["ls_tolerance"]
    # the line search evaluates the friction-loss rows' Huber terms only where a row of
    # the batch is one (the flag is the same for every world: any_world)
    fric_rows = rows.src["fric"] if rows.src is not None else rows.spec.fric
    fric = (any_world(reduce_fused(p["active"] & fric_rows, 0, "any")) if np.any(fric_rows)
            else False)

    # chunk 0's J' for the Hessians (:data:`_JT`)
    J0T = jnp.swapaxes(rows.J0, -1, -2) if newton and _JT else None
    # the statically first pass's (one iteration at most, below) Hessian by J0T as well
    # (:data:`_JT_FIRST`); the barrier keeps XLA from folding the transpose back into
    # the product
    J0T_first = (jax.lax.optimization_barrier(J0T)
                 if J0T is not None and _JT_FIRST and iterations == 1 else None)

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
                                    JT=J0T_first if hess and not search_on else None), acc,
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
            # the Hessian is a function of the rows' states (and of the cone rows'
            # jaref): where no state changed and no row is in a cone, the factor in
            # hand is that of the new Hessian, bit for bit. Worlds (under vmap) whose
            # factor is remade are computed apart (where_needed): a world's last
            # iterations usually change no state
            need = first | changed | (rows.nact > 1)
            if rows.spec.ell:
                fx = functools.partial(_factor, rows.spec)
                hx = (acc[1], rows.J0, {k: rows.x0[k] for k in _HESS_KEYS}, head, hstate,
                      J0T)
            else:
                # no cone rows: the rows enter by their quadratic weights alone, one
                # (rows,) array for where_needed to gather per block, not three
                fx = _factor_quad
                hx = (acc[1], rows.J0, _quad_weights(rows.x0, hstate), J0T)
            if search_on:
                lowt = where_needed(fx, need, hx, s["lowt"])
            else:
                lowt = factor_t(acc[1])
            mgrad = spd_solve(jnp.swapaxes(lowt, -1, -2), grad)
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
        keep = lambda a, b: where(kd, a, b)
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
    vecs = ("qacc", "Ma", "search", "grad", "mgrad")
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
        out = dict({key: v[:, j] for j, key in enumerate(vecs)}, jaref=jaref,
                   imp=st[:, 0], gnorm=st[:, 1], iter=st[:, 2].astype(jnp.int32),
                   done=st[:, 3] != 0, first=st[0, 4] != 0)
        if newton:
            out["lowt"] = low
        return out

    zv = jnp.zeros_like(qacc0)
    s = dict(qacc=qacc0, Ma=Ma0, jaref=jaref0, search=zv, grad=zv, mgrad=zv,
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
        # a world whose islands are all done is left as it is by the body: the flag
        # is unbatched (any_world)
        c = inline.while_loop(
            lambda c: any_world((c[2][0, 4] != 0) | jnp.any(c[2][:, 3] == 0)),
            lambda c: pack(body(unpack(c))), batched_like(pack(s), qacc0))
        s = unpack(c)
        qfrc = None
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
                  fric), sc)


def _update_chunk(hess, spec, x, jaref, J, args, acc, states=False, JT=None):
    """Step of the rows of a chunk (``Jv`` = J search, None: no step): J' force added
    to acc[0], with ``hess`` the Hessian's row terms to acc[1] (``JT``: J' for them,
    :func:`_hessian`); out the rows' jaref
    (kept on islands not taking the step, ``take`` false), with ``states`` and the rows'
    states after the step (on islands not taking it, those of jaref)."""
    alpha, take, Jv = args
    isl = Islands(spec.nisl, x.get("rowisl"))
    new = jaref if Jv is None else jaref + isl.rx(alpha, 0.0) * Jv
    force, state, _ = update(spec, x, new)
    out = (acc[0] + J.T @ force,) + acc[1:]
    if hess:
        out = out[:1] + (_hessian(spec, x, J, new, state, acc[1], JT),)
    kept = where(isl.rx(~take, True), jaref, new)
    return out, ((kept, state) if states else kept)


def _update_head(hess, spec, x, jaref, J, args, acc, JT=None):
    """:func:`_update_chunk` on chunk 0; out (jaref, the rows' new states, whether a
    state changed)."""
    acc, (out, state) = _update_chunk(hess, spec, x, jaref, J, args, acc, states=True,
                                      JT=JT)
    changed = reduce_fused(state != update(spec, x, jaref)[1], 0, "any")
    if spec.ell:
        # the cone Hessians follow jaref
        changed = changed | reduce_fused(state == C.CONE, 0, "any")
    return acc, (out, state, changed)


#: the per-row entries of the Hessian's row terms (:func:`_hessian`)
_HESS_KEYS = ("D", "active", "mu", "fr")


def _factor(spec, H, J, x, jaref, state, JT=None):
    """Transposed factor of the Hessian (:func:`spd_factor`): ``H`` (M plus the later
    chunks' row terms) plus chunk 0's row terms at ``jaref`` / ``state`` (rows ``x``,
    Jacobian ``J``). Transposed, LAPACK's column-major factor is a row-major
    array, the layout XLA gives loop-carried and conditional values: as it is, it was
    transposed to and from LAPACK's layout on every pass."""
    return factor_t(_hessian(spec, x, J, jaref, state, H, JT))


def _factor_quad(H, J, dq, JT=None):
    """:func:`_factor` of rows without cone rows, by their quadratic weights ``dq``
    (:func:`_quad_weights`)."""
    return factor_t(_quad_hessian(H, J, dq, JT))


def _update_rest(hess, spec, x, e, jaref, J, args, acc):
    """:func:`_update_chunk` on a later chunk (its jaref the loop's state), J search
    recomputed."""
    alpha, take, search = args
    Jv = None if search is None else J @ search
    return _update_chunk(hess, spec, x, jaref, J, (alpha, take, Jv), acc)


def _jaref_rest(spec, x, e, sc, J, q, acc):
    return acc, J @ q - x["aref"]


def _jaref(rows, q):
    """J q - aref of the rows in use, per chunk."""
    head = rows.J0 @ q - rows.x0["aref"]
    _, rest, rows = find_chunks(rows, _jaref_rest, (), args=q, jac=True,
                                state=rest_zeros(rows, head))
    return Chunked(head, rest), rows


def _warm_cost(spec, x, J, both, acc):
    """Constraint costs at the two columns of ``both`` added to acc (2,), and the
    rows' J q - aref (rows, 2)."""
    jb = _times_cols(J, both) - x["aref"][:, None]
    return acc + jax.vmap(lambda jar: update(spec, x, jar)[2], 1)(jb), jb


def _warm_head(spec, x, e, J, both, acc):
    return _warm_cost(spec, x, J, both, acc)


def _warm_first(spec, x, e, sc, J, both, acc):
    """:func:`_warm_rest` with, at both columns, the sums of a Newton first pass
    (:func:`_update_chunk` with no step): acc (costs (2,), (J' force (nv, 2), Hessian
    terms (2, nv, nv)))."""
    cost, (f, H) = acc
    jb = _times_cols(J, both) - x["aref"][:, None]

    def one(jar, f, H):
        force, state, c = update(spec, x, jar)
        return c, f + J.T @ force, _hessian(spec, x, J, jar, state, H)

    c, f, H = jax.vmap(one, (1, 1, 0), (0, 1, 0))(jb, f, H)
    return (cost + c, (f, H)), (sc if isinstance(sc, tuple) else jb)


def _warm_pick(cost, sums, start):
    """A world's first-pass start (J' force, M + Hessian terms) of the later chunks
    at the point of lower total cost ``cost`` (2,) (:func:`_warm_first`'s sums
    ``sums``), from ``start`` (zero, M)."""
    f, H = sums
    pick = cost[0] > cost[1]
    return (where(pick, f[:, 1], f[:, 0]),
            start[1] + where(pick, H[1], H[0]))


def _warm_rest(spec, x, e, sc, J, both, acc):
    """:func:`_warm_cost` on a later chunk; its rows kept unless ``sc`` is () (no
    state: the rows are remade at the chosen point)."""
    acc, jb = _warm_cost(spec, x, J, both, acc)
    return acc, (sc if isinstance(sc, tuple) else jb)


def _primal_start(rows, p, qs, qw, nisl, first=False):
    """((qacc0, M qacc0, J qacc0 - aref per chunk[, first]), rows with the later chunks
    found, J qacc_smooth - aref per chunk or None where it was not kept) the primal
    solvers start from. With
    ``qw`` (warmstart): one choice for all islands (MuJoCo's warmstart precedes the
    island solves), the lower total cost of qacc_warmstart and qacc_smooth, both
    evaluated in one pass; the chosen point's products start the solver (the later
    chunks' rows at both points are kept from that pass: a second loop over the chunks
    to remake them at the chosen point compiled its own gathers). With islands, the
    dofs in no island start at qacc_smooth: no active row's Jacobian touches them
    (:class:`~simjax.engine.solver_islands.Islands`), so the later chunks' J qacc0 -
    aref are those of the chosen point, up to rounding (a loop over the chunks to
    remake them compiled about 25 kernels on the shadow hand). ``first``: the solver's
    first pass is a Newton one known statically (one iteration at most,
    :func:`_primal`): the later chunks' sums of that pass (J' force, Hessian terms)
    are made by this pass over them, at both points, and the chosen point's are
    returned as ``first``: (J' force, M + Hessian terms) of the later chunks, (0, M)
    where there are none (the first pass's own loop over the later chunks compiled
    about 25 kernels on the shadow hand and barkour; the worlds that visit them keep
    the sums at both points only by their block of :func:`~simjax.engine.
    solver_rows.find_chunks`, as (worlds, 2, nv, nv) sums filled on every call ran
    barkour's step 3% slower)."""
    M = p["M"]
    if qw is None:
        jaref, rows = _jaref(rows, qs)
        return (qs, M @ qs, jaref), rows, jaref
    both = jnp.stack([qw, qs], 1)                                    # (nv, 2)
    Mb = _times_cols(M, both)
    cost, jb = head_chunk(rows, _warm_head, jnp.zeros(2, qs.dtype), args=both, jac=True)
    rest = rest_zeros(rows, jb)
    first = first and rows.nchunk > 1 and _FIRST
    smooth_cost = 0.5 * jnp.sum((Mb - p["qfrc_smooth"][:, None]) * (both - qs[:, None]), 0)
    if first:
        # the total cost known in the loop (the smooth part added first): each world
        # in it keeps the first pass's sums at its chosen point only
        nv = qs.shape[0]
        local = (jax.ShapeDtypeStruct((nv, 2), qs.dtype),
                 jax.ShapeDtypeStruct((2, nv, nv), qs.dtype))
        (cost, extra), rest, rows = find_chunks(
            rows, _warm_first, cost + smooth_cost, args=both, jac=True, state=rest,
            finish=(_warm_pick, local, (jnp.zeros_like(qs), M)))
    else:
        cost, rest, rows = find_chunks(rows, _warm_rest, cost, args=both, jac=True,
                                       state=rest)
        cost = cost + smooth_cost
    pick = cost[0] > cost[1]
    smooth = Chunked(jb[..., 1], jax.tree_util.tree_map(lambda x: x[..., 1], rest))
    qacc0, Ma0, jaref0, rest = jax.tree_util.tree_map(
        lambda x: where(pick, x[..., 1], x[..., 0]), (both, Mb, jb, rest))
    if nisl > 1:
        # dofs in no island start (and stay) at qacc_smooth
        qacc0 = where(p["dofisl"] == nisl, qs, qacc0)
        # chunk 0's rows remade at qacc0 (a product over the chunk, as before: the
        # same bits); the later chunks' (usually none) kept from the warm start's pass
        head = rows.J0 @ qacc0 - rows.x0["aref"]
        return ((qacc0, M @ qacc0, Chunked(head, rest)) + ((extra,) if first else ()), rows,
                smooth if rows.nchunk == 1 else None)
    return (qacc0, Ma0, Chunked(jaref0, rest)) + ((extra,) if first else ()), rows, smooth


#: the later chunks' first-pass sums made by the warm start's pass (False: by a loop
#: of the first pass, the former way, kept to compare)
_FIRST = True


# --------------------------------------------------------------------------- entry
def _problem(m, d, lay):
    dtype = d.qpos.dtype
    p = dict(M=d.qM, qfrc_smooth=d.qfrc_smooth, qacc_smooth=d.qacc_smooth, J=d.efc_J,
             aref=d.efc_aref, D=d.efc_D, R=d.efc_R, floss=d.efc_frictionloss,
             active=d.efc_active,
             tolerance=jnp.asarray(m.opt.tolerance, dtype),
             ls_tolerance=jnp.asarray(m.opt.ls_tolerance, dtype),
             noslip_tolerance=jnp.asarray(m.opt.noslip_tolerance, dtype),
             meaninertia=jnp.asarray(m.stat.meaninertia, dtype),
             solve_m=lambda x: tree_linalg.solve_ld(m, d.qLD, x))
    mus, frs = [], []
    for blk in lay.blocks:
        if blk.kind != "conell":
            continue
        ok = d.efc_active[blk.start:blk.start + blk.n * blk.k:blk.k]
        fr = C.take(d.contact.friction, blk.ids)[:, :blk.dim - 1]
        fr = where(ok[:, None], fr, 1.0)
        mu = fr[:, 0] * jnp.sqrt(1 / jnp.maximum(MINVAL, jnp.asarray(m.opt.impratio, dtype)))
        mus.append(mu)
        frs.append(fr)
    p["mu"], p["fr"] = tuple(mus), tuple(frs)
    return p


_DIFF_KEYS = ("M", "qfrc_smooth", "J", "aref", "D", "R", "floss", "mu", "fr")


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _implicit(spec, diff, qacc_star):
    """Identity on the (non-differentiated) solution ``qacc_star`` whose derivative is
    the implicit-function-theorem one: d qacc* = -H^-1 (dg/d diff) d diff, with g the
    optimality residual (:func:`gradient`) and H = dg/dqacc at the solution."""
    return qacc_star


@_implicit.defjvp
def _implicit_jvp(spec, primals, tangents):
    diff, qacc = primals
    ddiff, _ = tangents
    H = jax.jacfwd(lambda qa: gradient(spec, diff, qa))(qacc)
    low = spd_factor(0.5 * (H + H.T))
    _, gdot = jax.jvp(lambda dd: gradient(spec, dd, qacc), (diff,), (ddiff,))
    return qacc, -spd_solve(low, gdot)


def fwd_constraint(m, d):
    """Constraint solve (mj_fwdConstraint): qacc, efc_force, efc_state, qfrc_constraint,
    efc_b, and per constraint island (NISLAND,) solver_niter / solver_improvement /
    solver_gradient (iterations, and the scaled improvement and gradient norm of the
    last iteration; with DisableBit.ISLAND everything is island 0).

    Newton, CG and PGS solve every constraint island (mj_island) on its own, as MuJoCo
    4.0.0 unless DisableBit.ISLAND.

    Warmstart as MuJoCo: unless DisableBit.WARMSTART, start from qacc_warmstart if its
    total cost is lower than that of qacc_smooth (primal solvers), or from the forces it
    implies when their dual cost is negative (PGS). Requires make_constraint and
    reference_constraint to have run.
    """
    tables.precision_guard()
    nefc = d.efc_J.shape[0]
    zero_v = jnp.zeros_like(d.qacc_smooth)
    if nefc == 0 or m.nv == 0:
        return d.replace(qacc=d.qacc_smooth, qfrc_constraint=zero_v)
    lay = C.layout(m, C.slot_dims(d))
    spec = spec_from_layout(lay, m.nv)
    p = _problem(m, d, lay)
    p["efc_b"] = where(d.efc_active, d.efc_J @ d.qacc_smooth - d.efc_aref, 0.0)
    # the iterations run on constants: nothing differentiates through the loops
    sg = jax.lax.stop_gradient
    ps = {k: jax.tree_util.tree_map(sg, v) for k, v in p.items() if k != "solve_m"}
    qld = sg(d.qLD)
    ps["solve_m"] = lambda x: tree_linalg.solve_ld(m, qld, x)
    solver = m.opt.solver
    iters = int(m.opt.iterations)
    fast = None
    warm = not (m.opt.disableflags & DisableBit.WARMSTART)
    qs = sg(d.qacc_smooth)
    islands = solver == SolverType.PGS or m.opt.noslip_iterations > 0
    order = block_order(m, d, lay) if islands else None
    # MuJoCo 4.0.0 solves every constraint island on its own unless DisableBit.ISLAND
    # (with one kinematic tree there is one island at most)
    nisl = int(m.ntree) if not (m.opt.disableflags & DisableBit.ISLAND) else 1

    if solver in (SolverType.NEWTON, SolverType.CG):
        if nisl > 1:
            rowisl, dofisl = ((order["rowisl"], order["dofisl"]) if order is not None
                              else island_ids(m, d, lay))
            ps = dict(ps, rowisl=rowisl, dofisl=dofisl)
            spec = dataclasses.replace(spec, nisl=nisl)

        caps = row_capacity(spec)
        if caps[0] + sum(k * dim for k, (_, _, dim) in zip(caps[1], spec.ell)) < nefc:
            rows = gather_rows(spec, ps, caps)
        else:
            rows = whole_rows(spec, ps)
        qw = sg(d.qacc_warmstart) if warm else None
        start, rows, jb_smooth = _primal_start(
            rows, ps, qs, qw, spec.nisl,
            first=solver == SolverType.NEWTON and iters == 1)
        qacc0, Ma0, jaref0 = start[:3]
        # no active row: MuJoCo skips the solver (qacc = qacc_smooth)
        qacc0 = where(~reduce_fused(ps["active"], 0, "any"), qs, qacc0)
        res = _primal(rows, ps, (qacc0, Ma0, jaref0) + start[3:],
                      solver == SolverType.NEWTON, iters,
                      int(m.opt.ls_iterations))
        qacc, niter, imp, gnorm, jaref, qfrc_rows = res
        force_solver = None
        if m.opt.noslip_iterations == 0:
            fast = _rows_outputs(spec, ps, rows, jaref, qfrc_rows, jb_smooth)
    elif solver == SolverType.PGS:
        f0 = jnp.zeros(nefc, qs.dtype)
        if warm:
            qw = sg(d.qacc_warmstart)
            fw, _, _ = update(spec, ps, ps["J"] @ qw - ps["aref"])
            AR = _ar(ps)
            dual = jnp.dot(fw, ps["efc_b"]) + 0.5 * jnp.dot(fw, AR @ fw)
            f0 = where(dual > 0, 0.0, fw)
        force_solver, niter, imp = _pgs(spec, ps, f0, iters, lay, order)
        gnorm = jnp.zeros_like(imp)
        qacc = qs + ps["solve_m"](ps["J"].T @ force_solver)
    else:
        raise C.UnsupportedFeatureError(f"solver {int(solver)}")

    # differentiable solution (implicit function theorem), then forces from it
    diff = {k: p[k] for k in _DIFF_KEYS}
    qacc = _implicit(spec, diff, sg(qacc))
    if fast is not None:
        force, state, qfrc, b = fast
        full = functools.partial(_full_outputs, spec, b is not None)
        args = (diff, qacc, d.qacc_smooth, d.efc_active)
        if b is None:
            force, qfrc = _value_as(full, args, (force, qfrc))
            efc_b = p["efc_b"]
        else:
            force, qfrc, efc_b = _value_as(full, args, (force, qfrc, b))
        niter = where(reduce_fused(d.efc_active.reshape(-1), 0, "any"), _per_island(niter), 0)
        return d.replace(qacc=qacc, efc_force=force, efc_state=state,
                         qfrc_constraint=qfrc, efc_b=efc_b,
                         solver_niter=niter.astype(jnp.int32),
                         solver_improvement=_per_island(imp),
                         solver_gradient=_per_island(gnorm))
    jar = d.efc_J @ qacc - d.efc_aref
    force, state, _ = update(spec, p, jar)
    if force_solver is not None:
        force = force + sg(force_solver - force)
        state = _dual_state(spec, p, force_solver, state)
    niter, imp, gnorm = _per_island(niter), _per_island(imp), _per_island(gnorm)
    if m.opt.noslip_iterations > 0:
        force, nit = _noslip(spec, p, force, int(m.opt.noslip_iterations), lay, order)
        niter = niter + _per_island(nit)
        qacc = d.qacc_smooth + p["solve_m"](d.efc_J.T @ force)
    force = where(d.efc_active, force, 0.0)
    qfrc = d.efc_J.T @ force
    # MuJoCo returns before the solver when no row is active: no iterations
    niter = where(reduce_fused(d.efc_active.reshape(-1), 0, "any"), niter, 0)
    return d.replace(qacc=qacc, efc_force=force, efc_state=state, qfrc_constraint=qfrc,
                     efc_b=p["efc_b"], solver_niter=niter.astype(jnp.int32),
                     solver_improvement=imp, solver_gradient=gnorm)


def _rows_outputs(spec, p, rows, jaref, qfrc, jb_smooth):
    """efc_force, efc_state, qfrc_constraint and efc_b (where ``jb_smooth`` is given)
    from the primal solver's rows (no derivative: :func:`_value_as` gives them that of
    :func:`_full_outputs`); None where the rows cannot be spread back
    (:func:`simjax.engine.solver_rows.spread`). The rows' J qacc - aref are those the
    solver kept up to date step by step (as MuJoCo's efc_force comes from its Jaref),
    and J' force was summed over the rows in use by the last pass: neither is made
    again over every row of the capacity."""
    vals = [jaref] + ([jb_smooth] if jb_smooth is not None else [])
    full = spread_rows(rows, p["active"], vals)
    if full is None:
        return None
    active = p["active"]
    force, state, _ = update(spec, p, full[:, 0])
    force = where(active, force, 0.0)
    if qfrc is None:
        qfrc = p["J"].T @ force
    b = full[:, 1] if jb_smooth is not None else None
    return force, state, qfrc, b


def _full_outputs(spec, with_b, diff, qacc, qs, active):
    """efc_force, qfrc_constraint (and efc_b) of solution ``qacc`` over every row."""
    J, aref = diff["J"], diff["aref"]
    force, _, _ = update(spec, dict(diff, active=active), J @ qacc - aref)
    force = where(active, force, 0.0)
    out = (force, J.T @ force)
    if with_b:
        out = out + (where(active, J @ qs - aref, 0.0),)
    return out


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _value_as(fn, args, value):
    """``value``, computed another way than ``fn(*args)`` and equal to it up to
    rounding, with the derivatives of ``fn(*args)``: the forward pass does not
    evaluate ``fn``."""
    return value


@_value_as.defjvp
def _value_as_jvp(fn, primals, tangents):
    args, value = primals
    dargs, _ = tangents
    _, t = jax.jvp(lambda *a: fn(*a), args, dargs)
    return value, t


def _per_island(x):
    """Per-island statistics (islands,) as MuJoCo's (mjNISLAND,) arrays (islands past
    the first mjNISLAND not reported, as MuJoCo)."""
    x = x[:NISLAND]
    return jnp.concatenate([x, jnp.zeros(NISLAND - x.shape[0], x.dtype)])


def island_ids(m, d, lay):
    """Constraint islands of the active rows (mj_island, as :func:`simjax.engine.pgs.
    block_order`): (island of every row (nefc,), of every dof (nv,)), ``m.ntree`` for
    rows and dofs in no island."""
    n = int(m.ntree)
    rowisl, tree_isl = _islands(_row_trees(m, d, lay, lay.nefc), d.efc_active)
    dof_tree = np.asarray(m.dof_treeid).reshape(-1)
    return jnp.minimum(rowisl, n), jnp.minimum(tree_isl[dof_tree], n)


def inv_constraint(m, d):
    """Constraint forces of a given acceleration (mj_invConstraint): with
    jar = J qacc - aref, efc_force and efc_state are the per-row optimality forces of
    the constraint cost at jar (mj_constraintUpdate: -D jar for active quadratic rows,
    Huber-clamped friction loss, zero for satisfied one-sided rows, elliptic cone zones),
    and qfrc_constraint = J' efc_force (nv,). Requires make_constraint and
    reference_constraint (the position and velocity stages) to have run on ``d``.
    Differentiable (no iterations)."""
    zero_v = jnp.zeros(m.nv, d.qpos.dtype)
    if d.efc_J.shape[0] == 0 or m.nv == 0:
        return d.replace(qfrc_constraint=zero_v)
    lay = C.layout(m, C.slot_dims(d))
    spec = spec_from_layout(lay, m.nv)
    p = _problem(m, d, lay)
    force, state, _ = update(spec, p, d.efc_J @ d.qacc - d.efc_aref)
    force = where(d.efc_active, force, 0.0)
    return d.replace(efc_force=force, efc_state=state, qfrc_constraint=d.efc_J.T @ force)


def _dual_state(spec, p, force, primal_state):
    """Constraint states from dual forces (dualState)."""
    fl = p["floss"]
    st = jnp.full(force.shape, C.QUADRATIC, jnp.int32)
    st = where(spec.fric & (force <= -fl), C.LINEARPOS, st)
    st = where(spec.fric & (force >= fl), C.LINEARNEG, st)
    st = where(spec.ineq & (force <= 0), C.SATISFIED, st)
    for (start, n, dim) in spec.ell:
        sl = slice(start, start + n * dim)
        st = st.at[sl].set(primal_state[sl])
    return where(p["active"], st, C.SATISFIED)
