"""Factorisations of inertia-like matrices that exploit the kinematic tree.

MuJoCo factorises M = L' D L with L unit lower-triangular whose non-zeros are a dof's
ancestors (mj_factorI): eliminating dofs from the leaves up causes no fill-in. Dofs of
equal *height* (distance to their deepest descendant) are never ancestors of one
another, so a whole height level is eliminated at once. With the dofs permuted by
decreasing height, every level is a contiguous block whose ancestors all come before
it, so elimination only ever touches a shrinking leading block: per level one rank-k
update written as a sum of k outer products (elementwise, fused) and no scatters. The
solves run one level at a time as well, or (:func:`solve_ld` on deep trees) one dof at a
time in a scan. Everything here is pure JAX, so it batches and differentiates;
:func:`factor_ld` may instead factorise with LAPACK (see ``lapack_chol``) or, for a few
dofs, entry by entry. :mod:`simjax.engine.tree_level` factorises a CPU batch level by
level with the worlds on the minor axis (factor_ld_pair, solve_ld_pair).

Matrices are dense (nv, nv) with the tree sparsity of ``tables.m_mask`` (and its
transpose); entries outside it are ignored.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simjax.engine import inline, lapack_chol, tables
from simjax.engine.math import take, where

_CACHE: dict = {}


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    perm: np.ndarray        # dofs by decreasing height (ancestors before descendants)
    inv: np.ndarray         # inverse permutation
    blocks: tuple           # (start, end) of each height level in permuted order
    anc: np.ndarray         # strict-ancestor mask in permuted order (row: dof, col: anc)


def _plan(m) -> _Plan:
    parent = np.asarray(m.dof_parentid)
    key = parent.tobytes()
    plan = _CACHE.get(key)
    if plan is not None:
        return plan
    nv = len(parent)
    height = np.zeros(nv, np.int64)
    for k in range(nv - 1, -1, -1):      # children have larger indices than parents
        if parent[k] >= 0:
            height[parent[k]] = max(height[parent[k]], height[k] + 1)
    perm = np.argsort(-height, kind="stable")
    inv = np.argsort(perm)
    hs = height[perm]
    blocks = []
    start = 0
    for end in range(1, nv + 1):
        if end == nv or hs[end] != hs[start]:
            blocks.append((start, end))
            start = end
    anc = tables.get(m).m_mask - np.eye(nv)
    plan = _Plan(perm=perm, inv=inv, blocks=tuple(blocks), anc=anc[perm][:, perm])
    _CACHE[key] = plan
    return plan


def factor(m, a, symmetric=True):
    """Tree factorisation a = U diag(D) L (U = L' if symmetric), in the original order.

    Returns (L, U, D): L (nv, nv) strictly lower (row k: k's ancestors), U strictly
    upper (column k), D (nv,). For symmetric ``a`` this is MuJoCo's L'DL (mj_factorI);
    otherwise the no-fill-in LU MuJoCo uses for the implicit integrator.
    """
    low_p, up_p, diag_p = factor_permuted(m, a, symmetric)
    plan = _plan(m)

    def unperm(x):
        return x[plan.inv[:, None], plan.inv[None, :]]
    low = unperm(low_p)
    return low, (low.T if symmetric else unperm(up_p)), diag_p[plan.inv]


def _sum0(x):
    """Sum over axis 0 by halving: O(log n) elementwise adds that XLA fuses into one
    loop (a reduce over a short leading axis, or a dot with a short inner dimension,
    is several times slower on CPU for the small matrices of the tree)."""
    rest = []
    while x.shape[0] > 1:
        n = x.shape[0]
        if n % 2:
            rest.append(x[n - 1])
            n -= 1
        x = x[:n // 2] + x[n // 2:n]
    out = x[0]
    for r in rest:
        out = out + r
    return out


def factor_permuted(m, a, symmetric=True, add_diag=None):
    """As :func:`factor`, but (L, U, D) stay in the plan's permuted order.

    ``add_diag`` (nv,), if given, is added to the diagonal of ``a`` first.
    """
    plan = _plan(m)
    nv = m.nv
    dtype = a.dtype
    anc = jnp.asarray(plan.anc, dtype)
    a = a[plan.perm[:, None], plan.perm[None, :]]
    if add_diag is not None:
        a = a + jnp.diag(add_diag[plan.perm])
    lows, ups, diags = [], [], []
    for s, e in reversed(plan.blocks):                    # leaves first
        # the level's pivots (``a`` is the leading e x e block): a static gather, where
        # jnp.diagonal adds a conditional under vmap
        dk = a.reshape(-1)[np.arange(s, e) * (e + 1)]
        rows = a[s:e, :s] * anc[s:e, :s]                  # (nl, s) ancestor entries
        lk = rows / dk[:, None]
        if symmetric:
            uk = lk
            cols = rows
        else:
            cols = a[:s, s:e].T * anc[s:e, :s]            # column entries, as rows
            uk = cols / dk[:, None]
        lows.append(jnp.pad(lk, ((0, 0), (0, nv - s))))
        ups.append(jnp.pad(uk, ((0, 0), (0, nv - s))))
        diags.append(dk)
        if s:
            # rank-(e-s) update as a reduction over the level (not unrolled per dof, so
            # the program does not grow with the number of dofs in a level; the reduce
            # also keeps XLA from fusing, and so recomputing, levels into each other)
            a = a[:s, :s] - jnp.sum(cols[:, :, None] * lk[:, None, :], axis=0)
    low = jnp.concatenate(lows[::-1])
    up = jnp.concatenate(ups[::-1]).T
    return low, up, jnp.concatenate(diags[::-1])


def _solve_blocks(plan, low, up_rows, diag, x):
    """Solve U diag(D) L x = b in permuted order; x (nv, k) permuted right-hand side.

    Only the off-diagonal level blocks ``low[s:e, :s]`` and ``up_rows[s:e, :s]``
    (U's columns of the level, as rows) are read.
    """
    for s, e in reversed(plan.blocks):                    # U^-1, leaves first
        if s:
            x = jnp.concatenate([x[:s] - up_rows[s:e, :s].T @ x[s:e], x[s:]])
    x = x / diag[:, None]
    for s, e in plan.blocks:                              # L^-1, root first
        if s:
            x = jnp.concatenate([x[:s], x[s:e] - low[s:e, :s] @ x[:s], x[e:]])
    return x


def solve_permuted(m, low, up, diag, b):
    """Solve with permuted factors; b, result in the original order."""
    plan = _plan(m)
    x = b[plan.perm]
    vec = x.ndim == 1
    if vec:
        x = x[:, None]
    x = _solve_blocks(plan, low, up.T, diag, x)
    x = x[plan.inv]
    return x[:, 0] if vec else x


def solve(m, low, up, diag, b):
    """Solve (U diag(D) L) x = b with factors from :func:`factor`; b (nv,) or (nv, k)."""
    plan = _plan(m)

    def perm(x):
        return x[plan.perm][:, plan.perm]
    return solve_permuted(m, perm(low), perm(up), diag[plan.perm], b)


def from_factors(m, f, cdof, arm):
    """The inertia matrix from its factors (smooth.crb_lower): f and cdof (nv, 6), arm
    (nv,); entry (i, j) within the tree sparsity on and below the diagonal is f_i .
    cdof_j, plus arm_i where i = j. Returns (the full symmetric matrix, its lower
    triangle: zero above the diagonal)."""
    dtype = f.dtype
    low = (f @ cdof.T) * jnp.asarray(tables.get(m).m_mask, dtype)
    # mirror the lower triangle and add armature on the diagonal with static masks
    # (elementwise, one kernel; jnp.diag of a traced matrix adds a conditional)
    eye = np.eye(m.nv)
    arm = jnp.asarray(eye, dtype) * arm[:, None]
    return low + low.T * jnp.asarray(1.0 - eye, dtype) + arm, low + arm


def pack_ld(low, diag):
    """Dense qLD in MuJoCo's convention: strictly lower L, diagonal D."""
    return low + jnp.diag(diag)


def factor_ld(m, a, add_diag=None):
    """Dense qLD (MuJoCo's L'DL of symmetric ``a``, as :func:`pack_ld`) of ``a`` plus
    ``diag(add_diag)`` if given. Uses one LAPACK Cholesky where :mod:`lapack_chol`
    says it is safe and pays (a few XLA kernels instead of one or two per tree level);
    the derivative is always the pure-JAX factorisation's."""
    if lapack_ok(m):
        # the diagonal is added chunk by chunk inside the factorisation's loop
        diag = jnp.zeros(m.nv, a.dtype) if add_diag is None else add_diag.astype(a.dtype)
        return _factor_ld_lapack(m, a, diag)
    if add_diag is not None:
        a = a + jnp.asarray(np.eye(m.nv), a.dtype) * add_diag[:, None]
    if m.nv <= _UNROLL_NV:
        return _factor_ld_unrolled(m, a)
    return _factor_ld_pure(m, a)


#: matrices up to this size factorise entry by entry (one fused XLA kernel; a LAPACK
#: call costs about three times as much run time for nv = 2, the level-by-level
#: factorisation more kernels)
_UNROLL_NV = 4


def _factor_ld_unrolled(m, a):
    """qLD of a small ``a`` by eliminating its tree entries one by one, leaves first
    (mj_factorI on scalars). The unrolled program grows as nv^3: small nv only."""
    n = m.nv
    anc = tables.get(m).m_mask                     # ancestors and self
    flat = a.reshape(-1)
    ent = {(i, j): flat[i * n + j] for i in range(n) for j in range(i + 1) if anc[i, j]}
    for k in range(n - 1, -1, -1):
        above = [j for j in range(k) if anc[k, j]]  # k's ancestors (a chain)
        row = {j: ent[k, j] for j in above}
        for j in above:
            ent[k, j] = row[j] / ent[k, k]
            for i in above:
                if i <= j:
                    ent[j, i] = ent[j, i] - ent[k, j] * row[i]
    zero = jnp.zeros_like(flat[0])
    return jnp.stack([ent.get((i, j), zero) if j <= i else zero
                      for i in range(n) for j in range(n)]).reshape(n, n)


def _factor_ld_pure(m, a):
    low, _, diag = factor(m, a)
    return pack_ld(low, diag)


def factor_ld_tangent(m, a, da, diag=None, ddiag=None):
    """The tangent of qLD of ``a + diag(diag)`` (``diag`` None: of ``a``) along ``da``
    (and ``ddiag``), from the pure-JAX factorisation: the derivative of every
    factorisation path (LAPACK's and the level-by-level ones produce the same qLD)."""
    if diag is None:
        return jax.jvp(lambda x: _factor_ld_pure(m, x), (a,), (da,))[1]
    eye = jnp.asarray(np.eye(m.nv), a.dtype)
    return jax.jvp(lambda x, y: _factor_ld_pure(m, x + eye * y[:, None]), (a, diag),
                   (da, ddiag))[1]


def _chol_ld(a, mask, diag):
    """qLD of ``a + diag(diag)`` from one Cholesky of the dof-reversed matrix (see
    lapack_chol.ld_reversed): eliminating the reversed dofs in order goes from the
    leaves up, so the factor has the tree's zero pattern."""
    return lapack_chol.ld_reversed(a, mask, diag)


def _factor_ld_lapack(m, a, diag):
    return _chol_ld_bound(m)(a, _strict_anc(m, a.dtype), diag)


def _strict_anc(m, dtype):
    """0/1 mask (nv, nv) of L's strictly lower entries: each dof's proper ancestors."""
    return jnp.asarray(tables.get(m).m_mask - np.eye(m.nv), dtype)


def _chol_ld_bound(m):
    return _jvp_bound(m, "jvp", _chol_ld, lambda a, da, diag, ddiag: factor_ld_tangent(
        m, a, da, diag, ddiag))


def _jvp_bound(m, name, primal, tangent):
    """``primal(a, mask, diag)`` with a custom jvp ``tangent(a, da, diag, ddiag)``
    (``mask`` is constant), bound once per model and ``name``: the tangent needs the
    model's tree (a static plan)."""
    key = (name, np.asarray(m.dof_parentid).tobytes())
    fn = _CACHE.get(key)
    if fn is None:
        fn = jax.custom_jvp(primal)

        @fn.defjvp
        def _jvp(primals, tangents):
            a, mask, diag = primals
            da, _, ddiag = tangents
            return fn(a, mask, diag), tangent(a, da, diag, ddiag)
        _CACHE[key] = fn
    return fn


def lapack_ok(m) -> bool:
    """Whether :func:`factor_ld` factorises with LAPACK, and :func:`factor_ld_pair` may
    be used (decided at trace time: see lapack_chol.enabled)."""
    return m.nv > _UNROLL_NV and lapack_chol.enabled(m.nv)


def factor_ld_pair(m, a, diag):
    """qLD of ``a`` and of ``a + diag(diag)`` (mj_factorM's and mj_Euler's damped
    factor), both (nv, nv) as :func:`pack_ld`, from one LAPACK call on the two
    matrices (only where :func:`lapack_ok`). Under ``vmap`` the pair is one more
    axis of the batch that lapack_chol.ld_reversed flattens and factorises in chunks:
    one loop and its bookkeeping instead of two (an inner vmap over the pair instead
    made the step about twice as slow). Derivative: the pure-JAX factorisation's."""
    return _pair_bound(m)(a, _strict_anc(m, a.dtype), diag.astype(a.dtype))


def _ld_pair(a, mask, diag):
    both = lapack_chol.ld_reversed(jnp.stack([a, a]), mask,
                                   jnp.stack([jnp.zeros_like(diag), diag]))
    return both[0], both[1]


def _pair_bound(m):
    return _jvp_bound(m, "pair_jvp", _ld_pair, lambda a, da, diag, ddiag: (
        factor_ld_tangent(m, a, da), factor_ld_tangent(m, a, da, diag, ddiag)))


def solve_ld(m, qld, b):
    """Solve qM x = b given dense qLD (L strictly lower, D on the diagonal)."""
    plan = _plan(m)
    if len(plan.blocks) > _SCAN_LEVELS:
        return _solve_ld_scan(qld, b)
    qp = qld[plan.perm[:, None], plan.perm[None, :]]      # still strictly lower + D
    x = b[plan.perm]
    vec = x.ndim == 1
    if vec:
        x = x[:, None]
    x = _solve_blocks(plan, qp, qp, qp.reshape(-1)[np.arange(m.nv) * (m.nv + 1)], x)
    x = x[plan.inv]
    return x[:, 0] if vec else x


#: trees with more height levels than this solve with qLD one dof at a time in a scan:
#: the level-by-level solve costs XLA a few kernels per level (about 1.3 s to compile
#: for the humanoid's 15 levels, against 0.25 s for the scan, which also runs as fast)
_SCAN_LEVELS = 4


def _solve_ld_scan(qld, b):
    """Solve qM x = b from dense qLD in the original dof order (ancestors have smaller
    indices), one dof per scan step: the program does not grow with the tree.

    Both passes subtract a multiple of one vector of L from x: L' x = b takes row k
    (x[:k] -= L[k, :k] x[k], leaves first), L x = y column k once x[k] is final
    (x[k+1:] -= L[k+1:, k] x[k], root first). As a dot product and an update of x[k]
    per step the second pass cost XLA CPU more kernels (a reduction and a bounds-checked
    dynamic update) and about 20% more run time for the humanoid."""
    n = qld.shape[0]
    col = np.arange(n)
    tail = (1,) * (b.ndim - 1)

    def masked(vec, keep):
        return where(keep, vec, 0).reshape((n,) + tail)

    def up(x, k):          # L' x = b, leaves first
        row = lax.dynamic_index_in_dim(qld, k, 0, keepdims=False)
        return x - masked(row, col < k) * lax.dynamic_index_in_dim(x, k, 0), None

    def down(x, k):        # L x = y, root first
        column = lax.dynamic_index_in_dim(qld, k, 1, keepdims=False)
        return x - masked(column, col > k) * lax.dynamic_index_in_dim(x, k, 0), None

    # the dof indices as constants (jnp.arange would compute them in kernels), padded
    # to whole loop iterations with steps that change nothing (up: k = 0, nothing
    # below it; down: k = n - 1, nothing above it), so that no remainder step is
    # compiled outside the loop
    u = _SOLVE_UNROLL
    x, _ = inline.scan(up, b, _padded(np.arange(n - 1, 0, -1), 0, u), unroll=u)
    x = x / take(qld.reshape(-1), np.arange(n) * (n + 1)).reshape((n,) + tail)
    x, _ = inline.scan(down, x, _padded(np.arange(0, n - 1), n - 1, u), unroll=u)
    return x


#: dofs per iteration of :func:`_solve_ld_scan`'s loops. An iteration's work is small
#: (one row of the batch) and XLA CPU's per-iteration cost dominates: for the humanoid
#: (26 steps per pass, batch 1024) the solve alone took min 0.95 / median 2.2 us per
#: world with 1 dof per iteration, 0.41 / 1.3 with 2 and 0.70 / 1.05 with 4; 2 keeps
#: the loop body, and so the compile time, nearly as it was (4 added 3% HLO ops to the
#: smooth step and 4% to the contact step)
_SOLVE_UNROLL = 2


def _padded(steps, noop, unroll):
    """``steps`` (int32) padded with ``noop`` to a multiple of ``unroll``."""
    pad = -len(steps) % unroll
    return np.concatenate([steps, np.full(pad, noop)]).astype(np.int32)


def solve_dense_small(a, b):
    """Solve a x = b for small batches of dense matrices (..., n, n) by Gaussian
    elimination without pivoting (used for the 6x6 free-body blocks, which are close
    to symmetric positive definite)."""
    n = a.shape[-1]
    for k in range(n):
        piv = a[..., k:k + 1, k:k + 1]
        f = a[..., k + 1:, k:k + 1] / piv
        a = a.at[..., k + 1:, :].add(-f * a[..., k:k + 1, :])
        b = b.at[..., k + 1:].add(-f[..., 0] * b[..., k:k + 1])
    x = jnp.zeros_like(b)
    for k in range(n - 1, -1, -1):
        s = b[..., k] - jnp.sum(a[..., k, k + 1:] * x[..., k + 1:], -1)
        x = x.at[..., k].set(s / a[..., k, k])
    return x
