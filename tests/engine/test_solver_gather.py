"""The row chunks' index search (simjax.engine.solver_gather)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.mark.parametrize("n", [40, 341, 1500])
def test_first_true_matches_nonzero(n):
    """The compaction's index search (blocked triangular products up to _TRIU_MAX rows,
    the last block partial at 40 and 341 rows; a scan beyond) returns jnp.nonzero's
    first k indices, padded with n, and the cumulative count; the later chunks' search
    (from that count) the next k indices each."""
    from simjax.engine.solver_gather import _chunk_positions
    from simjax.engine.solver_gather import first_true as _first_true
    rng = np.random.default_rng(n)
    k = 32
    for p in (0.0, 0.05, 0.5, 1.0):
        a = rng.random(n) < p
        pos, cs = jax.jit(_first_true, static_argnums=1)(jnp.asarray(a), k)
        on = np.nonzero(a)[0]
        want = np.concatenate([on, np.full(4 * k, n)])
        np.testing.assert_array_equal(np.asarray(pos), want[:k])
        np.testing.assert_array_equal(np.asarray(cs), np.cumsum(a))
        for c in (1, 3):
            got = jax.jit(lambda cs: _chunk_positions((cs,), (k, ()), c)[0])(cs)
            np.testing.assert_array_equal(np.asarray(got), want[c * k:(c + 1) * k])


@pytest.mark.parametrize("n", [0, 1, 30, 33, 120, 200])
def test_count_below_matches_searchsorted(n):
    """count_below's blocked count is searchsorted's left position, including a kind of
    row the model does not have (n = 0: every count 0)."""
    from simjax.engine.solver_gather import count_below
    rng = np.random.default_rng(n)
    cs = np.cumsum(rng.random(n) < 0.5).astype(np.int32)
    q = np.arange(1, 41, dtype=np.int32)
    got = jax.jit(count_below)(jnp.asarray(cs), jnp.asarray(q))
    np.testing.assert_array_equal(np.asarray(got), np.searchsorted(cs, q, side="left"))
