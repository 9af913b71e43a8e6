"""The per-world rules under vmap (simjax.engine.solver_worlds): where_needed,
any_world."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.mark.parametrize("branches", ["blocks", "both"])
@pytest.mark.parametrize("size", [5, 300])
def test_where_needed_under_vmap(size, branches, monkeypatch):
    """where_needed under vmap: fn's result on the worlds in need (gathered in blocks, a
    batch not a multiple of the block; with ``branches`` "both" the whole batch where
    most need it), the old value elsewhere, bit for bit as the vmapped fn on a CPU; one
    world: a conditional.
    On a GPU the kernels picked for a block of worlds and for the whole batch can round
    differently (the last bit of a float64 product, seen on an H200), so there the
    values are compared to rounding."""
    from simjax.engine import solver_worlds as R
    monkeypatch.setattr(R, "_BRANCHES", branches)

    def same(got, want):
        if jax.default_backend() == "cpu":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)

    rng = np.random.default_rng(size)
    a = jnp.asarray(rng.standard_normal((size, 6, 6)))
    b = jnp.asarray(rng.standard_normal(6))
    old = jnp.asarray(rng.standard_normal((size, 6)))

    def fn(x, y):
        return jnp.tanh(x @ y) * jnp.sum(x * x)

    run = jax.jit(jax.vmap(lambda n, x, o: R.where_needed(fn, n, (x, b), o)))
    full = np.asarray(jax.jit(jax.vmap(fn, in_axes=(0, None)))(a, b))
    for p in (0.0, 0.02, 0.5, 0.9, 1.0):
        need = rng.random(size) < p
        got = np.asarray(run(jnp.asarray(need), a, old))
        same(got, np.where(need[:, None], full, np.asarray(old)))
    # the same flag for every world (not batched)
    all_on = jax.jit(jax.vmap(lambda x, o: R.where_needed(fn, jnp.asarray(True), (x, b), o)))
    same(np.asarray(all_on(a, old)), full)
    one = jax.jit(lambda n, x, o: R.where_needed(fn, n, (x, b), o))
    same(np.asarray(one(True, a[0], old[0])), full[0])
    np.testing.assert_array_equal(np.asarray(one(False, a[0], old[0])), np.asarray(old[0]))


def test_any_world_loop():
    """any_world: a loop flag true while any world's is (unbatched under vmap, nested
    vmaps included); a loop whose body leaves finished worlds as they are then gives
    every world the result of its own loop."""
    from simjax.engine import solver_worlds as R

    def count(n):
        # doubles x until it passes n; the body leaves x alone once it has
        def body(x):
            return jnp.where(x > n, x, 2.0 * x)
        return jax.lax.while_loop(lambda x: R.any_world(x <= n), body, jnp.ones(()))

    n = jnp.asarray([0.5, 3.0, 100.0, 7.0])
    want = np.asarray([1.0, 4.0, 128.0, 8.0])
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(count))(n)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(count)(n[2])), want[2])
    nested = jax.jit(jax.vmap(jax.vmap(count)))(n.reshape(2, 2))
    np.testing.assert_array_equal(np.asarray(nested), want.reshape(2, 2))
    flags = jax.jit(jax.vmap(R.any_world))(jnp.asarray([False, True, False]))
    assert np.asarray(flags).all()
    assert not np.asarray(jax.jit(jax.vmap(R.any_world))(jnp.zeros(3, bool))).any()
