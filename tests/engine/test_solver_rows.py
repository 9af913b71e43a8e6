"""The loops over the row chunks (simjax.engine.solver_rows): the tables of bits of
the later chunks' blocks of worlds."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def test_pack_round_trip():
    """The later chunks' blocks gather their worlds' inputs as one table of bits
    (solver_rows._pack): every leaf (booleans, integers, floats) comes back from the
    gathered columns as it was, bit for bit (negative zero, NaN and tiny values
    included)."""
    from simjax.engine.solver_rows import _pack, _unpack
    rng = np.random.default_rng(0)
    size = 7
    f = rng.standard_normal((size, 3, 2)).astype(np.float32)
    f[0, 0, 0], f[1, 0, 0], f[2, 0, 0] = -0.0, np.nan, 1e-42
    leaves = [f, rng.integers(-5, 300, (size, 4)).astype(np.int32),
              rng.random((size, 5)) < 0.5, rng.standard_normal((size,)).astype(np.float32)]
    ids = np.array([4, 0, 6])

    def run(*leaves):
        tab = jnp.take(_pack(list(leaves), size), jnp.asarray(ids), axis=1)
        like = [jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for v in leaves]
        return jax.vmap(lambda col: _unpack(col, like), in_axes=1)(tab)

    for got, want in zip(jax.jit(run)(*leaves), leaves):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8),
                                      want[ids].view(np.uint8))


def test_pack_stacked_round_trip():
    """Leaves with as many entries per world are one stacked operand of their table
    (solver_rows._tables): every leaf comes back bit for bit, in the tables' order."""
    from simjax.engine.solver_rows import _pack, _tables, _unpack
    rng = np.random.default_rng(1)
    size = 5
    f = rng.standard_normal((size, 3, 2)).astype(np.float32)
    f[0, 0, 0], f[1, 0, 0] = -0.0, np.nan
    leaves = [f, rng.integers(-5, 300, (size, 6)).astype(np.int32),
              rng.random((size, 4)) < 0.5, rng.standard_normal((size, 4)).astype(np.float32),
              rng.standard_normal((size,)).astype(np.float32), rng.random((size,)) < 0.5,
              rng.standard_normal((size, 6)).astype(np.float32)]
    ids = np.array([3, 0, 4, 4])
    like = [jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for v in leaves]
    tables = _tables(like)
    assert len(tables) == 1 and len(tables[0]) == 3     # sizes 6, 4 and 1

    def run(*leaves):
        got = [None] * len(leaves)
        for t in tables:
            tab = jnp.take(_pack([[leaves[i] for i in op] for op in t], size),
                           jnp.asarray(ids), axis=1)
            order = [i for op in t for i in op]
            out = jax.vmap(lambda col: _unpack(col, [like[i] for i in order]),
                           in_axes=1)(tab)
            for i, x in zip(order, out):
                got[i] = x
        return got

    for got, want in zip(jax.jit(run)(*leaves), leaves):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8),
                                      want[ids].view(np.uint8))
