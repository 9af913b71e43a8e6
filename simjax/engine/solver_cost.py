"""The primal constraint problem's cost (:mod:`simjax.engine.solver`; Todorov 2014, "Convex
and analytically-invertible dynamics with contacts and constraints"): the rows' static
structure (:class:`Spec`), the forces, states and cost at jar = J qacc - aref (MuJoCo's
mj_constraintUpdate, the elliptic cone zones included), the Hessian (MakeHessian,
HessianCone) and the optimality residual g(qacc) that the implicit derivative
differentiates."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import constraint as C
from simjax.engine.math import reduce_fused, where
from simjax.engine.solver_search import _ell_rows


@dataclasses.dataclass(frozen=True)
class Spec:
    """Static structure of the rows: masks (numpy) and elliptic blocks (start, n, dim);
    ``nisl`` the number of constraint islands the primal solvers iterate on separately
    (1: one problem; else the island capacity, rows and dofs in ``p['rowisl']``,
    ``p['dofisl']``); ``resting`` the scalar rows of the model's rigid objects resting
    on static geoms (:func:`~simjax.engine.collision.pairs.resting_rows`; 0 where
    contacts are off), a floor on the row chunks' size."""
    eq: np.ndarray
    fric: np.ndarray
    ineq: np.ndarray
    ell: tuple
    nefc: int
    nv: int
    nisl: int = 1
    resting: int = 0

    def __hash__(self):
        return hash((self.eq.tobytes(), self.fric.tobytes(), self.ell, self.nefc, self.nv,
                     self.nisl, self.resting))

    def __eq__(self, other):
        return hash(self) == hash(other)


def spec_from_layout(lay, nv):
    t = lay.efc_type
    ell = tuple((b.start, b.n, b.dim) for b in lay.blocks if b.kind == "conell")
    return Spec(eq=t == C.EQUALITY, fric=(t == C.FRICTION_DOF) | (t == C.FRICTION_TENDON),
                ineq=(t >= C.LIMIT_JOINT) & (t != C.CONTACT_ELLIPTIC), ell=ell,
                nefc=len(t), nv=nv)


def _ell_update(jar, D, mu, fr, want="fcs"):
    """Elliptic cone zones (mj_constraintUpdate): force (n,dim), cost (n,), state (n,);
    of those named in ``want`` (f, c, s), None for the others."""
    u = jnp.concatenate([jar[:, :1] * mu[:, None], jar[:, 1:] * fr], 1)
    nn = u[:, 0]
    tt2 = jnp.sum(u[:, 1:] ** 2, 1)
    pos = tt2 > 0
    tt = jnp.sqrt(where(pos, tt2, 1.0))
    tt = where(pos, tt, 0.0)
    top = (nn >= mu * tt) | (~pos & (nn >= 0))
    bottom = ~top & ((mu * nn + tt <= 0) | (~pos & (nn < 0)))
    force = cost = state = None
    if "f" in want or "c" in want:
        dm = D[:, 0] / (mu * mu * (1 + mu * mu))
        nmt = nn - mu * tt
    if "f" in want:
        f0 = -dm * nmt * mu
        tsafe = where(pos, tt, 1.0)
        fj = -f0[:, None] / tsafe[:, None] * u[:, 1:] * fr
        fmid = jnp.concatenate([f0[:, None], fj], 1)
        fq = -D * jar
        force = where(top[:, None], 0.0, where(bottom[:, None], fq, fmid))
    if "c" in want:
        cost = where(top, 0.0, where(bottom, 0.5 * jnp.sum(D * jar * jar, 1),
                                     0.5 * dm * nmt * nmt))
    if "s" in want:
        state = where(top, C.SATISFIED, where(bottom, C.QUADRATIC, C.CONE))
    return force, cost, state


def _ell_mid_cost(jar, D0, mu, fr):
    u = jnp.concatenate([jar[:1] * mu, jar[1:] * fr])
    tt = jnp.sqrt(jnp.sum(u[1:] ** 2))
    dm = D0 / (mu * mu * (1 + mu * mu))
    return 0.5 * dm * (u[0] - mu * tt) ** 2


#: row masks that are static (numpy) and the same on every row (no friction-loss row,
#: every row one-sided, no equality row: a chunk's masks where
#: :func:`simjax.engine.solver_gather._uniform` knows them) leave out their selects and
#: logical operations in :func:`update` (:func:`_maybe`, :func:`_mask_and`), read at
#: trace time (False: traced, kept to compare). XLA folded only some of them: bench
#: rollouts (batch 1024, float32) ant 572 -> 569 kernels (4960 -> 4775 equations; the
#: warm start's two-point updates lose mask broadcasts and transposes), humanoid 628 ->
#: 626 (6399 -> 6214), barkour 625 (6682 -> 6470), shadow hand 823 (11481 -> 11269).
#: Ant run (paired, 10 rounds) off / on 1.016 [0.959, 1.042]; compile CPU (6 rounds)
#: off / on trace + lower 0.955 [0.637, 1.134], XLA 0.974 [0.950, 1.111] (noise). The
#: same in :func:`simjax.engine.solver_search._eval` (act, qrow) removed 2 more kernels
#: per model but ran ant's rollout slower (off / on 0.963 [0.922, 1.007], 0.983 [0.931,
#: 1.277]) and changed rounding (kernels fused differently): not done
_STATIC = True


def _maybe(mask, value):
    """Whether a row of ``mask`` may be ``value``: False only for a static mask
    (:data:`_STATIC`) with no such row."""
    return not (_STATIC and isinstance(mask, np.ndarray) and not np.any(mask == value))


def _mask_and(mask, x):
    """``mask & x``: ``x`` where no row of ``mask`` may be false (:func:`_maybe`)."""
    return mask & x if _maybe(mask, False) else x


def update(spec, p, jar, want="fsc"):
    """Forces, states and constraint cost at jar = J qacc - aref (mj_constraintUpdate):
    those named in ``want`` (f, s, c), None for the others. The parts a caller drops
    are not traced: XLA removed them anyway, but each traced equation costs trace,
    batching and lowering time (all three built, about 150 of the shadow hand's
    equations were dropped)."""
    D, R, fl = p["D"], p["R"], p["floss"]
    want = want if _PARTS else "fsc"
    F, S, K = ("f" in want), ("s" in want), ("c" in want)
    # negations fall on the values at jar, not on the rows' constants (the same bits): a
    # negated constant is hoisted out of the solver loops, one more (worlds, rows) array
    # kept through the solve
    force = -(D * jar) if F else None
    cost_row = 0.5 * D * jar * jar if K else None
    state = jnp.full(jar.shape, C.QUADRATIC, jnp.int32) if S else None
    # friction loss (Huber)
    if _maybe(spec.fric, True):
        rf = R * fl
        neg = spec.fric & (-jar >= rf)
        posv = spec.fric & ~neg & (jar >= rf)
        if F:
            force = where(neg | posv, fl * where(neg, 1.0, -1.0), force)
        if K:
            cost_row = where(neg, -0.5 * R * fl * fl - fl * jar,
                             where(posv, -0.5 * R * fl * fl + fl * jar, cost_row))
        if S:
            state = where(neg, C.LINEARNEG, where(posv, C.LINEARPOS, state))
    # one-sided rows
    if _maybe(spec.ineq, True):
        sat = _mask_and(spec.ineq, jar >= 0)
        if F:
            force = where(sat, 0.0, force)
        if K:
            cost_row = where(sat, 0.0, cost_row)
        if S:
            state = where(sat, C.SATISFIED, state)
    cost = None
    if K:
        rows = spec.eq | spec.fric | spec.ineq
        cost = reduce_fused(where(rows, cost_row, 0.0) if _maybe(rows, False) else cost_row, 0)
    for (start, n, dim), mu, fr in zip(spec.ell, p["mu"], p["fr"]):
        f, c, s = _ell_update(_ell_rows(jar, start, n, dim), _ell_rows(D, start, n, dim),
                              mu, fr, want)
        sl = slice(start, start + n * dim)
        if F:
            force = force.at[sl].set(f.reshape(-1))
        if S:
            state = state.at[sl].set(jnp.repeat(s, dim).astype(jnp.int32))
        if K:
            cost = cost + jnp.sum(c)
    if S and "active" in p:
        state = where(p["active"], state, C.SATISFIED)
    return force, state, cost


#: whether :func:`update` traces only the parts its caller asks for (False: all three,
#: for paired measurements). Measured together with solver_primal._HEAD_CHANGES and
#: collision.broadphase._LAZY_ROWS (the bench rollout's dead equations, shadow hand
#: 11983 -> 11599 equations, barkour 6896 -> 6600): trace + lowering CPU, all three off
#: against on (in one process, alternated, jax.clear_caches() between, load 9-13),
#: shadow hand 1.017 [0.999, 1.051] (8 rounds) and 1.009 [0.969, 1.092] (10; the trace
#: alone 1.025 and 1.018), barkour 1.002 [0.954, 1.115] (8) and 1.021 [0.974, 1.055]
#: (10), humanoid 1.046 [0.973, 1.062] (8; 6893 -> 6618 equations), ant 1.016 [0.980,
#: 1.089] (8; 5202 -> 4973); the optimised HLO the same instructions (hand, barkour,
#: humanoid), outputs bit-identical (float64 and float32, the four models)
_PARTS = True


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
    return _cone_hessian(spec, p, J, jar, state, H)


def _force_hessian(spec, p, J, jar, state, force, H, JT=None):
    """(J' force, :func:`_hessian`): J' force and J' D_q J as one product of J' with the
    weighted rows and the force column (:data:`_ONE_JT`)."""
    nv = J.shape[1]
    w = jnp.concatenate([_quad_weights(p, state)[:, None] * J, force[:, None]], 1)
    prod = (J.T if JT is None else JT) @ w                              # (nv, nv + 1)
    return prod[:, nv], _cone_hessian(spec, p, J, jar, state, H + prod[:, :nv])


#: J' force and the Hessian's quadratic row terms J' D_q J of a pass's chunk as one
#: product (:func:`_force_hessian`): the later chunks' step of a Newton pass and the
#: first pass known statically, one matrix-vector product fewer (a kernel of its own,
#: 25-35 ms of LLVM time, in each copy of the loop body: ant's bench rollout 634 ->
#: 630 kernels); read at trace time (False: two, kept to compare). Alone (bench
#: rollouts, paired in one process): XLA compile ant 1.004 [0.870, 1.042], humanoid
#: 0.981 [0.899, 1.109] (8 rounds); run, process CPU, ant 0.967 [0.930, 1.028],
#: humanoid 0.946 [0.795, 1.092] (12), barkour 1.004 [0.871, 1.321] (16): noise.
#: Float64 bench outputs bit-identical (the four bench models)
_ONE_JT = True


def _cone_hessian(spec, p, J, jar, state, H):
    """H plus the elliptic cone Hessians of the rows of ``p`` (HessianCone)."""
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
    force, _, _ = update(spec, p, jar, "f")
    return p["M"] @ qacc - p["qfrc_smooth"] - p["J"].T @ force
