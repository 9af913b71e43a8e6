"""Batched Cholesky through LAPACK that never waits on XLA's CPU thread pool.

jaxlib's CPU LAPACK kernels (0.10, 0.11) split a batch whose estimated work
(batch x cost per matrix, cost n^3/3 for potrf) reaches 200000 flops into chunks,
schedule the chunks on XLA's intra-op thread pool and block the calling pool thread
until they finish. When as many such calls run at once as the pool has threads (two
independent factorisations of one step on a two-core machine suffice) every pool
thread waits for chunks that no thread is left to run: the program hangs. Below the
threshold a kernel runs its whole batch inline on the calling thread and never
touches the pool.

So :func:`cholesky` and :func:`ld_reversed` keep every LAPACK call below the
threshold by construction: under ``vmap`` (any nesting) the batch is flattened and
factorised in chunks of at most ``_WORK`` flops (:func:`chunked`: one sequential
loop, a few XLA kernels whatever the batch, or up to ``_UNROLL`` separate calls). No
ordering between calls is needed, so independent factorisations in one program, or
programs running side by side, stay safe. The constraint solver's factorisations and
triangular solves, and those of its implicit gradient (:mod:`simjax.engine.
solver_dense`; the gradient's solve transposes through ``jax.lax.custom_linear_solve``),
use the same chunks. Not covered: jax's own linear algebra in users' code.
:func:`ld_reversed` also does the work around the factorisation (reversing the dofs,
turning the Cholesky factor into MuJoCo's L'DL) chunk by chunk inside the loop: as
separate passes over the whole batch (with a padded copy of it) they took about a
third of the time of the humanoid's factorisation.

The path is used only where this analysis was checked: the CPU backend and jaxlib
0.10 / 0.11 (:func:`enabled`); elsewhere callers keep their pure-JAX factorisation.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jax import lax

from simjax.engine import inline

#: jaxlib's kMinWorkPerTask: a call whose batch x cost per matrix reaches it goes to
#: the thread pool
POOL_WORK = 200_000
# the mass matrix factorisations' chunks stay at half of it
_WORK = 100_000


def _jaxlib_checked() -> bool:
    major_minor = tuple(int(x) for x in jaxlib.__version__.split(".")[:2])
    return major_minor in ((0, 10), (0, 11))


_CHECKED = _jaxlib_checked()


def enabled(nv: int) -> bool:
    """Whether :func:`cholesky` should be used for an (nv, nv) matrix (decided at
    trace time from the default backend). Not bounded in nv, so that the program's
    size does not depend on the model's; past nv ~ 84 each call factorises one matrix."""
    return _CHECKED and nv >= 2 and jax.default_backend() == "cpu"


def per_call(cost: int, work: int = _WORK) -> int:
    """Matrices per LAPACK call for a kernel of ``cost`` flops per matrix in jaxlib's
    cost model (potrf n^3/3, trsm with one right-hand side n^2): total work at most
    ``work`` (below :data:`POOL_WORK`)."""
    return max(1, work // max(1, cost))


def _chunk(n: int) -> int:
    """Matrices per LAPACK Cholesky (potrf) call of (n, n) matrices."""
    return per_call(n * n * n // 3)


#: :func:`chunked` makes up to this many chunks as separate calls on static slices,
#: with no loop (read at trace time; 0: always the loop, kept to compare): XLA may run
#: independent calls on two threads at once, each on its own thread (the Newton trips'
#: factorisations, 128 worlds: the humanoid's 5 chunks of 30, as one parallel call
#: did before the chunks). Bench rollouts (batch 1024, float32, paired in one
#: process, 12 rounds, wall): humanoid 8 / 0 0.969 and 0.982, barkour 0.976; outputs
#: bit-identical
_UNROLL = 8


def chunked(fn, flat, *extra, chunk=None):
    """``fn`` over the matrices of ``flat`` (total, ...) in chunks of at most ``chunk``
    (default: ``_chunk(n)``, n = flat.shape[-1], for potrf);
    ``extra`` arrays (total, ...) are sliced alongside and passed after the chunk; fn's
    output has the chunk's shape. Up to :data:`_UNROLL` chunks are separate calls on
    static slices, concatenated. Otherwise each chunk is read from and written back to
    the loop's buffer, which starts as ``flat`` (no zero-filled output buffer: it cost
    a pass over the batch, and a copy of it per loop). The last chunk starts early
    enough to end at ``total`` (no padded copy of the batch is made); its first rows,
    done by the chunk before, are kept as they are."""
    total, n = flat.shape[0], flat.shape[-1]
    c = _chunk(n) if chunk is None else chunk
    if total <= c:
        return fn(flat, *extra)
    if -(-total // c) <= _UNROLL:
        parts = [fn(flat[i:i + c], *(e[i:i + c] for e in extra))
                 for i in range(0, total, c)]
        return jnp.concatenate(parts, 0)
    rows = np.arange(c)

    def body(carry):
        i, out = carry
        start = jnp.minimum(i * c, total - c)
        x = lax.dynamic_slice_in_dim(out, start, c)
        y = fn(x, *(lax.dynamic_slice_in_dim(e, start, c) for e in extra))
        new = (start + rows >= i * c).reshape((c,) + (1,) * (flat.ndim - 1))
        return i + 1, lax.dynamic_update_slice_in_dim(out, lax.select(
            jnp.broadcast_to(new, y.shape), y, x), start, 0)
    # a while loop, not fori_loop: with static bounds fori_loop is a scan, whose loop
    # carries the scan's counter besides fori_loop's (XLA merges and drops the second
    # only in late rounds of its simplification fixpoint)
    n = -(-total // c)
    if not inline.LEAN:
        return inline.fori_loop(0, n, lambda i, out: body((i, out))[1], flat)
    return inline.while_loop(lambda cr: cr[0] < n, body, (jnp.zeros((), jnp.int32), flat))[1]


@jax.custom_batching.custom_vmap
def cholesky(a):
    """Lower Cholesky factor of symmetric positive definite ``a`` (..., n, n), read
    from its lower triangle; unbatched callers pass few matrices (one, normally)."""
    return lax.linalg.cholesky(a, symmetrize_input=False)


@cholesky.def_vmap
@inline.inlined
def _cholesky_vmap(axis_size, in_batched, a):
    del axis_size
    if not in_batched[0]:
        return cholesky(a), False
    n = a.shape[-1]
    return chunked(cholesky, a.reshape((-1, n, n))).reshape(a.shape), True


def _ld_block(a, mask, diag):
    """MuJoCo's qLD (strictly lower L masked by ``mask``, D on the diagonal) of the
    matrices ``a`` (..., n, n) plus ``diag`` (..., n) on their diagonal, from one
    Cholesky of the dof-reversed matrix: with P the reversal, P a P = C C' (C lower)
    gives a = U U' with U = P C P upper, i.e. a = L' D L with L' = U diag(U)^-1 and
    D = diag(U)^2. Eliminating the reversed dofs in order goes from the leaves up, so C
    keeps the tree's zero pattern."""
    n = a.shape[-1]
    eye = jnp.asarray(np.eye(n), a.dtype)
    a = a + eye * diag[..., None, :]
    # LAPACK reads column-major storage: handing it the transpose of the row-major
    # symmetric ``a`` saves XLA a layout copy of the batch (the factor is the same)
    c = cholesky(jnp.swapaxes(a[..., ::-1, ::-1], -1, -2))
    u_t = jnp.swapaxes(c, -1, -2)[..., ::-1, ::-1]           # U' = P C' P, lower
    # the diagonal by a static gather: a reduction or jnp.diagonal costs a kernel
    s = u_t.reshape(u_t.shape[:-2] + (n * n,))[..., np.arange(n) * (n + 1)]
    return mask * (u_t / s[..., :, None]) + eye * (s * s)[..., :, None]


@jax.custom_batching.custom_vmap
def ld_reversed(a, mask, diag):
    """qLD of symmetric positive definite ``a`` (n, n) plus ``diag`` (n,) on its
    diagonal, whose elimination from the last dof to the first makes no fill-in outside
    ``mask`` (MuJoCo's L'DL of a tree's inertia); ``mask`` (n, n) 0/1 marks L's strictly
    lower entries. Under ``vmap`` the sum, the reversal, the factorisation and the
    assembly run chunk by chunk in one loop, so no pass over the whole batch is made
    but the output's (adding ``diag`` as a pass of its own cost the humanoid's damped
    Euler factorisation about 10% more run time)."""
    return _ld_block(a, mask, diag)


@ld_reversed.def_vmap
@inline.inlined
def _ld_reversed_vmap(axis_size, in_batched, a, mask, diag):
    if in_batched[1]:
        a, diag = (x if b else jnp.broadcast_to(x, (axis_size,) + x.shape)
                   for x, b in zip((a, diag), (in_batched[0], in_batched[2])))
        return jax.vmap(_ld_block)(a, mask, diag), True
    if not (in_batched[0] or in_batched[2]):
        return ld_reversed(a, mask, diag), False
    n = a.shape[-1]
    if not in_batched[0]:
        a = jnp.broadcast_to(a, (axis_size,) + a.shape)
    diag = jnp.broadcast_to(diag, a.shape[:-1])
    out = chunked(lambda x, dg: _ld_block(x, mask, dg), a.reshape((-1, n, n)),
                  diag.reshape((-1, n)))
    return out.reshape(a.shape), True
