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


_RESTING = """<mujoco><option cone="{cone}"/><worldbody>
  <geom type="plane" size="5 5 .1" condim="1"/>
  <body pos="0 0 .2"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
  <body pos="1 0 .2"><freejoint/><geom type="box" size=".1 .1 .1" condim="1"/></body>
  <body pos="2 0 .2"><freejoint/><geom type="sphere" size=".1"/></body>
  <body pos="3 0 .2"><freejoint/><geom type="box" size=".1 .1 .1"/>
    <geom type="sphere" size=".15" pos="0 0 .1"/></body>
  <body pos="0 2 .5"><joint type="hinge"/><geom type="capsule" size=".05 .2"/>
    <body pos="0 0 .5"><joint type="hinge"/><geom type="capsule" size=".05 .2"/></body>
  </body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("cone,rows", [("pyramidal", 40), ("elliptic", 4)])
def test_resting_rows_size_chunk_zero(cone, rows):
    """Rigid objects (trees of one body) on the plane count their largest patch against
    it (a box 4 contacts: 16 pyramidal rows of condim 3, 4 of condim 1, the pair's
    condim the larger of the two; a sphere 1 contact: 4 rows; a body of a box and a
    sphere its box's 16), an articulated arm nothing, elliptic contacts of condim 3
    nothing (their rows are blocks); chunk 0 holds them."""
    import dataclasses
    import simjax
    from simjax.engine import constraint as C
    from simjax.engine.collision.pairs import resting_rows
    from simjax.engine.solver_cost import spec_from_layout
    from simjax.engine.solver_gather import row_capacity
    m = simjax.load_model(_RESTING.format(cone=cone))
    assert resting_rows(m) == rows
    spec = spec_from_layout(C.data_layout(m, simjax.make_data(m)), m.nv)
    base = row_capacity(spec)[0]
    assert base < 40
    got = row_capacity(dataclasses.replace(spec, resting=rows))[0]
    assert got == max(base, rows)
