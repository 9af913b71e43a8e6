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

This module holds the entry points (fwd_constraint, inv_constraint) and the implicit
derivative. The problem's cost and Hessian are in :mod:`simjax.engine.solver_cost`, the
dense algebra in :mod:`simjax.engine.solver_dense`, Newton / CG in
:mod:`simjax.engine.solver_primal`, their start in :mod:`simjax.engine.solver_warmstart`,
the row chunks they iterate on in :mod:`simjax.engine.solver_rows`.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import constraint as C
from simjax.engine import inline, tables, tree_linalg
from simjax.engine.data import NISLAND
from simjax.engine.collision.pairs import resting_rows
from simjax.engine.math import matvec, reduce_fused, take, where
from simjax.engine.pgs import _islands, _noslip, _pgs, _row_trees, block_order
from simjax.engine.solver_cost import Spec, gradient, spec_from_layout, update
from simjax.engine.solver_dense import factor_t, spd_factor, spd_solve, sym_solve
from simjax.engine.solver_gather import gather as gather_rows
from simjax.engine.solver_gather import row_capacity
from simjax.engine.solver_gather import spread as spread_rows
from simjax.engine.solver_gather import whole as whole_rows
from simjax.engine.solver_primal import _primal
from simjax.engine.solver_search import MINVAL
from simjax.engine.solver_warmstart import _primal_start
from simjax.types import DisableBit, SolverType

#: the entry points, and (re-exported) the problem's cost (:mod:`simjax.engine.
#: solver_cost`) and the dense algebra (:mod:`simjax.engine.solver_dense`)
__all__ = ["fwd_constraint", "inv_constraint", "island_ids", "Spec", "spec_from_layout",
           "update", "gradient", "spd_factor", "factor_t", "spd_solve"]


def _problem(m, d, lay):
    dtype = d.qpos.dtype
    tol = solver_tolerance(m.opt.tolerance, dtype)
    p = dict(M=d.qM, qfrc_smooth=d.qfrc_smooth, qacc_smooth=d.qacc_smooth, J=d.efc_J,
             aref=d.efc_aref, D=d.efc_D, R=d.efc_R, floss=d.efc_frictionloss,
             active=d.efc_active,
             tolerance=jnp.asarray(tol, dtype),
             ls_tolerance=jnp.asarray(m.opt.ls_tolerance, dtype),
             noslip_tolerance=jnp.asarray(m.opt.noslip_tolerance, dtype),
             meaninertia=jnp.asarray(m.stat.meaninertia, dtype),
             gtol_base=_product(tol, m.opt.ls_tolerance, dtype),
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


#: the least solver tolerance of a float32 solve (0: opt.tolerance as it is), read at
#: trace time: MuJoCo Warp's (MuJoCo's float32 engine) override, for the same reason:
#: float32 rounding of the cost and gradient stays above smaller tolerances
_F32_TOLERANCE = 1e-6


def solver_tolerance(tol, dtype):
    """The tolerance of the constraint solvers' stopping tests (Newton, CG, PGS; the line
    search's gradient tolerance is its product with ``ls_tolerance``) for a solve in
    ``dtype``: ``opt.tolerance``, raised to at least :data:`_F32_TOLERANCE` in float32.

    MuJoCo's solvers run in float64. In float32 a solve's scaled cost improvement and
    gradient norm stop falling at the rounding level of the cost (worlds of mjx_sensor
    ran Newton to its 100-iteration limit with improvements of 1.5e-8 to 8.9e-8 against
    MuJoCo's default 1e-8), so the float32 tolerance is raised as MuJoCo Warp raises it
    (``max(opt.tolerance, 1e-6)`` in its ``put_model``). A traced ``tol`` is raised by a
    traced maximum. float64 solves use ``tol`` as MuJoCo does."""
    if jnp.dtype(dtype) != jnp.float32 or not _F32_TOLERANCE:
        return tol
    c = tables.concrete(tol)
    if c is not None:
        return np.maximum(np.asarray(c, np.float64), _F32_TOLERANCE)
    return jnp.maximum(tol, _F32_TOLERANCE)


def _product(a, b, dtype):
    """``a * b`` in ``dtype``: a constant where both are (the line search's gradient
    tolerance of a model closed over: a traced product would be a loop input of the
    solver's loop, which XLA drops only in a late round of its simplification
    fixpoint), else traced."""
    ca, cb = tables.concrete(a), tables.concrete(b)
    if ca is None or cb is None or not inline.LEAN:
        return jnp.asarray(a, dtype) * jnp.asarray(b, dtype)
    return np.asarray(ca, dtype) * np.asarray(cb, dtype)


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
    _, gdot = jax.jvp(lambda dd: gradient(spec, dd, qacc), (diff,), (ddiff,))
    return qacc, -sym_solve(H, gdot)


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
    lay = C.data_layout(m, d)
    zero_v = jnp.zeros_like(d.qacc_smooth)
    if lay.nefc == 0 or m.nv == 0:
        return d.replace(qacc=d.qacc_smooth, qfrc_constraint=zero_v)
    nefc = lay.nefc
    spec = spec_from_layout(lay, m.nv)
    p = _problem(m, d, lay)
    p["efc_b"] = where(d.efc_active, matvec(d.efc_J, d.qacc_smooth) - d.efc_aref, 0.0)
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

        if not (m.opt.disableflags & (DisableBit.CONTACT | DisableBit.CONSTRAINT)):
            spec = dataclasses.replace(spec, resting=resting_rows(m))
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
            fw, _, _ = update(spec, ps, ps["J"] @ qw - ps["aref"], "f")
            # AR fw as J M^-1 J' fw + R fw: the dense AR (rows^2 nv) is made by PGS for
            # the rows it solves only (pgs._pgs)
            arf = ps["J"] @ ps["solve_m"](ps["J"].T @ fw) + ps["R"] * fw
            dual = jnp.dot(fw, ps["efc_b"]) + 0.5 * jnp.dot(fw, arf)
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
    force, state, _ = update(spec, p, jar, "fs")
    if force_solver is not None:
        force = force + sg(force_solver - force)
        state = _dual_state(spec, p, force_solver, state)
    niter, imp, gnorm = _per_island(niter), _per_island(imp), _per_island(gnorm)
    if m.opt.noslip_iterations > 0:
        one = None
        if tables.has_adhesion(m):
            one = d.efc_type == C.CONTACT_FRICTIONLESS
        force, nit = _noslip(spec, p, force, int(m.opt.noslip_iterations), lay, order, one)
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
    force, state, _ = update(spec, p, full[:, 0], "fs")
    force = where(active, force, 0.0)
    if qfrc is None:
        qfrc = p["J"].T @ force
    b = full[:, 1] if jb_smooth is not None else None
    return force, state, qfrc, b


def _full_outputs(spec, with_b, diff, qacc, qs, active):
    """efc_force, qfrc_constraint (and efc_b) of solution ``qacc`` over every row."""
    J, aref = diff["J"], diff["aref"]
    force, _, _ = update(spec, dict(diff, active=active), J @ qacc - aref, "f")
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
    if n == 2:
        # two trees: a select by the dof's tree (a constant mask), not a gather
        return rowisl, where(dof_tree == 0, tree_isl[0], tree_isl[1])
    return jnp.minimum(rowisl, n), jnp.minimum(take(tree_isl, dof_tree), n)


def inv_constraint(m, d):
    """Constraint forces of a given acceleration (mj_invConstraint): with
    jar = J qacc - aref, efc_force and efc_state are the per-row optimality forces of
    the constraint cost at jar (mj_constraintUpdate: -D jar for active quadratic rows,
    Huber-clamped friction loss, zero for satisfied one-sided rows, elliptic cone zones),
    and qfrc_constraint = J' efc_force (nv,). Requires make_constraint and
    reference_constraint (the position and velocity stages) to have run on ``d``.
    Differentiable (no iterations)."""
    zero_v = jnp.zeros(m.nv, d.qpos.dtype)
    lay = C.data_layout(m, d)
    if lay.nefc == 0 or m.nv == 0:
        return d.replace(qfrc_constraint=zero_v)
    spec = spec_from_layout(lay, m.nv)
    p = _problem(m, d, lay)
    force, state, _ = update(spec, p, d.efc_J @ d.qacc - d.efc_aref, "fs")
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
