"""Batched Cholesky through LAPACK that never waits on XLA's CPU thread pool.

jaxlib's CPU LAPACK kernels (0.10, 0.11) split a batch whose estimated work
(batch x cost per matrix, cost n^3/3 for potrf) reaches 200000 flops into chunks,
schedule the chunks on XLA's intra-op thread pool and block the calling pool thread
until they finish. When as many such calls run at once as the pool has threads (two
independent factorisations of one step on a two-core machine suffice) every pool
thread waits for chunks that no thread is left to run: the program hangs. Below the
threshold a kernel runs its whole batch inline on the calling thread and never
touches the pool.

So :func:`cholesky` keeps every LAPACK call below the threshold by construction:
under ``vmap`` (any nesting) the batch is flattened and factorised in chunks of at
most ``_WORK`` flops by a sequential ``lax.map`` (a while loop: a few XLA kernels
whatever the batch). No ordering between calls is needed, so independent
factorisations in one program, or programs running side by side, stay safe.

The path is used only where this analysis was checked: the CPU backend and jaxlib
0.10 / 0.11 (:func:`enabled`); elsewhere callers keep their pure-JAX factorisation.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxlib
from jax import lax

# jaxlib's kMinWorkPerTask is 200000; stay at half of it
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


def _chunk(n: int) -> int:
    """Matrices per LAPACK call: total work below ``_WORK`` (jaxlib's cost model)."""
    return max(1, _WORK // max(1, n * n * n // 3))


@jax.custom_batching.custom_vmap
def cholesky(a):
    """Lower Cholesky factor of symmetric positive definite ``a`` (..., n, n), read
    from its lower triangle; unbatched callers pass few matrices (one, normally)."""
    return lax.linalg.cholesky(a, symmetrize_input=False)


@cholesky.def_vmap
def _cholesky_vmap(axis_size, in_batched, a):
    del axis_size
    if not in_batched[0]:
        return cholesky(a), False
    n = a.shape[-1]
    flat = a.reshape((-1, n, n))
    total, c = flat.shape[0], _chunk(n)
    full = -(-total // c)
    if full == 1:
        out = cholesky(flat)
    else:
        # pad with identities to whole chunks: one loop, no separate call for a tail
        pad = full * c - total
        if pad:
            eye = jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), (pad, n, n))
            flat = jnp.concatenate([flat, eye])
        out = lax.map(cholesky, flat.reshape((full, c, n, n)))
        out = out.reshape((full * c, n, n))[:total]
    return out.reshape(a.shape), True
