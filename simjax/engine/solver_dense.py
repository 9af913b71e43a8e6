"""Dense linear algebra of the constraint solvers (:mod:`simjax.engine.solver`): the
Cholesky factor of the constraint Hessian M + J' D J (MuJoCo's mju_cholFactor in
mj_solNewton; LAPACK potrf, called directly on CPU), its solves (mju_cholSolve), and
products with a few columns (the warm start's two points)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline, lapack_chol
from simjax.engine.math import where


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
    return jax.lax.linalg.cholesky(_sym_t(a), symmetrize_input=False)


def _sym_t(a):
    """The symmetrised ``a`` (..., n, n), transposed (the same matrix, bit for bit):
    what LAPACK, reading column-major, is handed (see :func:`spd_factor`)."""
    t = jnp.swapaxes(a, -1, -2)
    return jnp.swapaxes(0.5 * (a + t), -1, -2)


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


def factor_t(a):
    """:func:`spd_factor` of ``a`` (..., n, n) transposed: the upper factor U = L',
    row-major (the layout XLA gives loop-carried and conditional values), NaN in U[0, 0]
    where the factorisation failed (:func:`spd_solve` then gives NaN). On CPU LAPACK is
    called directly (:func:`_potrf`): jax's cholesky zeroes the upper triangle and
    selects NaN on failure in the factor's column-major layout, and XLA made those
    selects two transposing passes over the factors (kernels slow to compile as well);
    U's strictly lower triangle is not zeroed (:func:`spd_solve` reads U's upper
    triangle, L's lower, only). The same bits as :func:`spd_factor`."""
    def t(x):
        return jnp.swapaxes(x, -1, -2)

    if not lapack_chol.enabled(a.shape[-1]):
        return t(spd_factor(a))
    return _potrf_marked(0.5 * (a + t(a)))


@jax.custom_batching.custom_vmap
def _potrf_marked(a):
    """:func:`_potrf`'s U with NaN in U[..., 0, 0] where the factorisation failed
    (failure marked by one NaN on the diagonal: a whole NaN factor is a pass of its
    own). Under ``vmap`` the batch is factorised in chunks small enough that jaxlib
    runs each LAPACK call on the calling thread (:func:`simjax.engine.lapack_chol.
    chunked`): one call on the whole batch (the humanoid's 128 worlds of a Newton trip,
    27 dofs) was split by jaxlib over XLA's thread pool, the calling pool thread
    blocked until the pieces ran, and two such calls at once (two CPU devices, or two
    programs side by side, on two cores) hung the process.

    The mark is a dynamic update slice of the corners of the chunk, written in place,
    done here where the batch is explicit: ``.at[..., 0, 0].set`` (or a slice
    update batched by vmap) is a scatter, which XLA CPU expands into a loop of its own
    before running its simplification fixpoint over the whole program again (see
    :func:`simjax.engine.data.count_warning` for what the ant's rollout saved)."""
    up, info = _potrf(a)
    first = where(info == 0, up[..., 0, 0], jnp.nan)
    return jax.lax.dynamic_update_slice(up, first[..., None, None], (0,) * up.ndim)


@_potrf_marked.def_vmap
@inline.inlined
def _potrf_marked_rule(size, flags, a):
    del size
    if not flags[0]:
        return _potrf_marked(a), False
    n = a.shape[-1]
    out = lapack_chol.chunked(_potrf_marked, a.reshape((-1, n, n)), chunk=_per_call(
        n * n * n // 3))
    return out.reshape(a.shape), True


def _per_call(cost):
    """Matrices per LAPACK call: as many as stay below jaxlib's threshold (the ant's
    128 worlds of a Newton trip, 14 dofs, in one call, as without chunks)."""
    return lapack_chol.per_call(cost, lapack_chol.POOL_WORK - 1)


def spd_solve(low, b):
    """Solve (L L') x = b for a factor of :func:`spd_factor`; b (n,). Differentiable
    (the implicit gradient of the solver); under ``vmap`` one LAPACK call per
    triangular solve on CPU, on the whole batch (see :func:`factor_solve`)."""
    tri = jax.lax.linalg.triangular_solve
    y = tri(low, b[..., None], left_side=True, lower=True)
    return tri(low, y, left_side=True, lower=True, transpose_a=True)[..., 0]


def factor_solve(lowt, b):
    """Solve (U' U) x = b for a factor U of :func:`factor_t` (n, n); b (n,). Not
    differentiable in reverse mode (the solver's own passes, which gradients bypass).
    On CPU with :mod:`~simjax.engine.lapack_chol`'s jaxlib, under ``vmap`` the two
    triangular solves run in chunks small enough that each LAPACK call stays on the
    calling thread (see :func:`_potrf_marked`: jaxlib splits a call whose work, n^2
    per matrix, reaches its threshold: 40 dofs at 128 worlds, 20 at 512)."""
    low = jnp.swapaxes(lowt, -1, -2)
    if not lapack_chol.enabled(lowt.shape[-1]):
        return spd_solve(low, b)
    return _solve_chunked(low, b)


def sym_solve(h, b):
    """h^-1 b for the symmetric positive definite ``h`` (n, n) (read symmetrised, as
    :func:`spd_factor` reads it); b (n,). Differentiable in ``b`` and ``h`` in both modes
    (``jax.lax.custom_linear_solve``, symmetric: its transpose is the same solve; the
    factor is made from ``h`` with the gradient stopped). On CPU with
    :mod:`~simjax.engine.lapack_chol`'s jaxlib, under ``vmap`` the factorisation and the
    triangular solves run in chunks that keep each LAPACK call on its calling thread
    (as :func:`factor_solve`: the implicit gradient of the solver, for 1024
    humanoids, factorised and solved on the whole batch in one call each)."""
    if not lapack_chol.enabled(h.shape[-1]):
        return spd_solve(spd_factor(h), b)
    sym = _sym_t(h)
    # spd_factor's LAPACK call, chunked under vmap
    low = lapack_chol.cholesky(jax.lax.stop_gradient(sym))
    return jax.lax.custom_linear_solve(lambda x: sym @ x, b,
                                       lambda _, y: _solve_chunked(low, y), symmetric=True)


@jax.custom_batching.custom_vmap
def _solve_chunked(low, b):
    """:func:`spd_solve` of ``low`` (..., n, n), ``b`` (..., n); under ``vmap`` chunk
    by chunk (:func:`factor_solve`)."""
    return spd_solve(low, b)


@_solve_chunked.def_vmap
@inline.inlined
def _solve_chunked_rule(size, flags, low, b):
    if not any(flags):
        return _solve_chunked(low, b), False
    low, b = (x if f else jnp.broadcast_to(x, (size,) + x.shape)
              for x, f in zip((low, b), flags))
    n = low.shape[-1]
    out = lapack_chol.chunked(lambda y, lo: _solve_chunked(lo, y), b.reshape((-1, n)),
                              low.reshape((-1, n, n)), chunk=_per_call(n * n))
    return out.reshape(b.shape), True


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
