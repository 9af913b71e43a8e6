"""Factorisations of inertia-like matrices that exploit the kinematic tree.

MuJoCo factorises M = L' D L with L unit lower-triangular whose non-zeros are a dof's
ancestors (mj_factorI): eliminating dofs from the leaves up causes no fill-in. Dofs of
equal *height* (distance to their deepest descendant) are never ancestors of one
another, so a whole height level is eliminated at once with one rank-k update; the
solves likewise run one level at a time. The work is a few dense ops per tree level,
in pure JAX (no LAPACK custom calls), so it batches, differentiates and compiles small.

Matrices are dense (nv, nv) with the tree sparsity pattern of ``tables.m_mask`` (and
its transpose); entries outside it are ignored.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from simjax.engine import tables


@functools.lru_cache(maxsize=256)
def _levels_cached(key, dof_parentid):
    parent = np.asarray(dof_parentid)
    nv = len(parent)
    height = np.zeros(nv, np.int64)
    for k in range(nv - 1, -1, -1):      # children have larger indices than parents
        p = parent[k]
        if p >= 0:
            height[p] = max(height[p], height[k] + 1)
    return tuple(np.nonzero(height == h)[0] for h in range(int(height.max(initial=-1)) + 1))


def levels(m):
    """Dof index arrays grouped by height (leaves first)."""
    parent = np.asarray(m.dof_parentid)
    return _levels_cached(parent.tobytes(), tuple(parent.tolist()))


def factor(m, a, symmetric=True):
    """Tree LDU factorisation of ``a`` (nv, nv): a = U diag(D) L, U = L' if symmetric.

    Returns (L, U, D): L (nv, nv) strictly lower (row k holds k's ancestors), U strictly
    upper (column k), D (nv,). For symmetric ``a`` this is MuJoCo's L'DL (mj_factorI).
    """
    anc = jnp.asarray(tables.get(m).m_mask - np.eye(m.nv), a.dtype)   # strict ancestors
    low = jnp.zeros_like(a)
    up = jnp.zeros_like(a)
    diag = jnp.zeros(m.nv, a.dtype)
    for ks in levels(m):
        dk = a[ks, ks]                                        # pivots of this level
        rows = a[ks] * anc[ks]                                # (nl, nv) ancestor columns
        lk = rows / dk[:, None]
        low = low.at[ks].set(lk)
        diag = diag.at[ks].set(dk)
        if symmetric:
            a = a - rows.T @ lk
        else:
            cols = a[:, ks] * anc[ks].T                       # (nv, nl) ancestor rows
            up = up.at[:, ks].set(cols / dk[None, :])
            a = a - (cols / dk[None, :]) @ rows
    if symmetric:
        up = low.T
    return low, up, diag


def solve(m, low, up, diag, b):
    """Solve (U diag(D) L) x = b with factors from :func:`factor`; b (nv,) or (nv, k)."""
    x = b
    lv = levels(m)
    vec = x.ndim == 1
    if vec:
        x = x[:, None]
    for ks in lv:                          # U^-1, leaves first
        x = x - up[:, ks] @ x[ks]
    x = x / diag[:, None]
    for ks in reversed(lv):                # L^-1, root first
        x = x.at[ks].add(-(low[ks] @ x))
    return x[:, 0] if vec else x


def pack_ld(low, diag):
    """Dense qLD in MuJoCo's convention: strictly lower L, diagonal D."""
    return low + jnp.diag(diag)


def solve_ld(m, qld, b):
    """Solve qM x = b given dense qLD (L strictly lower, D on the diagonal)."""
    diag = jnp.diagonal(qld)
    low = qld - jnp.diag(diag)
    return solve(m, low, low.T, diag, b)


def solve_dense_small(a, b):
    """Solve a x = b for small batches of dense matrices (..., n, n) by Gaussian
    elimination without pivoting (used for the 6x6 free-body blocks, which are close
    to symmetric positive definite)."""
    n = a.shape[-1]
    a = a
    b = b
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
