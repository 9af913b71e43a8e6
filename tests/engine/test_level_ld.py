"""mj_factorM / mj_solveM of a batch level by level (level_ld)."""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import load
from simjax.engine import level_ld, make_data, smooth, support, tree_linalg

# two trees: a wrist with five finger chains, a free object
_MODELS = ["mjx_shadow_hand/scene_right.xml"]


def _qm(m, d):
    d = smooth.kinematics(m, d)
    d = smooth.com_pos(m, d)
    return smooth.crb(m, d).qM


def _batch(mjm, m, seed):
    rng = np.random.default_rng(seed)
    qpos = jnp.asarray(mjm.qpos0[None] + 0.3 * rng.standard_normal((6, mjm.nq)))
    d0 = make_data(m)
    qm = jax.jit(jax.vmap(lambda q: _qm(m, d0.replace(qpos=q))))(qpos)
    return rng, qpos, d0, qm


@pytest.mark.parametrize("packed_solve", [pytest.param(False, marks=pytest.mark.slow),
                                          True])
@pytest.mark.parametrize("path", _MODELS)
def test_factor_solve_packed(path, packed_solve, monkeypatch):
    """factor_ld_packed and solve_ld_packed (vmapped: a batch not a multiple of the
    lane block, nested vmap, unbatched, one right-hand side for all worlds) equal
    factor_ld and solve_ld and MuJoCo's qLD; their gradient is the pure-JAX one."""
    monkeypatch.setattr(level_ld, "_SOLVE", packed_solve)
    mjm, m = load(path)
    assert level_ld.use_level(m)
    rng, qpos, d0, qm = _batch(mjm, m, 3)
    rhs = jnp.asarray(rng.standard_normal((6, mjm.nv)))

    def both(a, b):
        q, packed = level_ld.factor_ld_packed(m, a)
        assert packed is not None
        return q, level_ld.solve_ld_packed(m, packed, q, b)

    def ref(a, b):
        q = tree_linalg.factor_ld(m, a)
        return q, tree_linalg.solve_ld(m, q, b)

    def close(got, want, rtol=1e-10):
        for x, y in zip(got, want):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max())
    want = jax.jit(jax.vmap(ref))(qm, rhs)
    close(jax.jit(jax.vmap(both))(qm[:5], rhs[:5]), [w[:5] for w in want])
    nested = jax.jit(jax.vmap(jax.vmap(both)))(qm.reshape((2, 3) + qm.shape[1:]),
                                               rhs.reshape(2, 3, -1))
    close([x.reshape(y.shape) for x, y in zip(nested, want)], want)
    close(jax.jit(both)(qm[0], rhs[0]), [w[0] for w in want], 1e-12)
    close(jax.jit(jax.vmap(both, in_axes=(0, None)))(qm, rhs[0]),
          jax.jit(jax.vmap(ref, in_axes=(0, None)))(qm, rhs[0]))
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = np.asarray(qpos[0])
    mujoco.mj_forward(mjm, mjd)
    np.testing.assert_allclose(support.pack_m(m, want[0][0]), mjd.qLD, rtol=1e-10,
                               atol=1e-12)

    def loss(fn, q, b):
        qld, x = fn(_qm(m, d0.replace(qpos=q)), b)
        return jnp.sum(x ** 2) + jnp.sum(jnp.sin(qld))
    g = jax.jit(jax.vmap(jax.grad(lambda *a: loss(both, *a), argnums=(0, 1))))(qpos, rhs)
    g_ref = jax.jit(jax.vmap(jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1))))(qpos, rhs)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8 * np.abs(b).max())


@pytest.mark.parametrize("path", ["mujoco_humanoid/humanoid.xml", "gym_ant/ant.xml"])
def test_root_chain_keeps_lapack(path):
    """Trees with a root chain (a free joint's dofs and hinges below it) keep LAPACK."""
    _, m = load(path)
    assert not level_ld.use_level(m)
    assert level_ld.factor_ld_packed(m, jnp.eye(m.nv))[1] is None


def test_wide_lane_blocks(monkeypatch):
    """A batch of at least four of level_ld's lane blocks (32 worlds each, the last
    padded) gives the same factors as the 8-world blocks of smaller batches, bit for
    bit (the same operations per world), and factor_ld's up to rounding."""
    mjm, m = load(_MODELS[0])
    _, _, _, qm = _batch(mjm, m, 5)
    nb = 4 * level_ld._LANES + 3
    assert level_ld._lanes(nb) == level_ld._LANES > level_ld._lanes(6)
    a = jnp.asarray(np.resize(np.asarray(qm), (nb,) + qm.shape[1:]))
    a = a * (1.0 + 0.01 * jnp.arange(nb))[:, None, None]
    fn = jax.jit(jax.vmap(lambda x: level_ld.factor_ld_packed(m, x)))
    wide = fn(a)
    monkeypatch.setattr(level_ld, "_LANES", 8)
    narrow = jax.jit(jax.vmap(lambda x: level_ld.factor_ld_packed(m, x)))(a)
    for x, y in zip(wide, narrow):
        np.testing.assert_array_equal(x, y)
    want = jax.jit(jax.vmap(lambda x: tree_linalg.factor_ld(m, x)))(a)
    np.testing.assert_allclose(wide[0], want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


@pytest.mark.parametrize("nb", [5, 4 * level_ld._LANES + 3])
def test_lower_factors(nb):
    """qM's lower triangle given as its factors (smooth.crb_lower, ``a`` None): the
    batched level factorisation (padded lane blocks of 8 and of level_ld._LANES
    worlds) gives qLD, its solve and qM equal to the dense path's up to rounding;
    unbatched, qM is crb's bit for bit; qM's and qLD's derivatives are the dense
    path's."""
    mjm, m = load(_MODELS[0])
    rng, qpos, d0, _ = _batch(mjm, m, 7)
    qpos = jnp.asarray(np.resize(np.asarray(qpos), (nb, mjm.nq)))
    qpos = qpos + 0.01 * jnp.asarray(rng.standard_normal(qpos.shape))
    rhs = jnp.asarray(rng.standard_normal((nb, mjm.nv)))

    def fwd(q, b, factors):
        d = smooth.com_pos(m, smooth.kinematics(m, d0.replace(qpos=q)))
        d, lower = smooth.crb_lower(m, d, factors=factors)
        assert isinstance(lower, tuple) == factors
        a = None if factors else d.qM
        qld, packed, qm = level_ld.factor_ld_packed(m, a, lower, with_matrix=True)
        return qld, qm, level_ld.solve_ld_packed(m, packed, qld, b)

    got = jax.jit(jax.vmap(lambda q, b: fwd(q, b, True)))(qpos, rhs)
    want = jax.jit(jax.vmap(lambda q, b: fwd(q, b, False)))(qpos, rhs)
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12 * np.abs(y).max())
    if nb > 8:
        # the unbatched and gradient checks below read the first worlds alone, which
        # are the small batch's (the same draws): made once, there
        return
    one = jax.jit(lambda q, b: fwd(q, b, True))(qpos[0], rhs[0])
    np.testing.assert_array_equal(one[1], jax.jit(lambda q: _qm(m, d0.replace(qpos=q)))(
        qpos[0]))

    def loss(factors, q, b):
        qld, qm, x = fwd(q, b, factors)
        return jnp.sum(jnp.sin(qld)) + jnp.sum(qm ** 2) + jnp.sum(x ** 2)
    g = jax.jit(jax.vmap(jax.grad(lambda q, b: loss(True, q, b))))(qpos[:6], rhs[:6])
    g_ref = jax.jit(jax.vmap(jax.grad(lambda q, b: loss(False, q, b))))(qpos[:6], rhs[:6])
    np.testing.assert_allclose(g, g_ref, rtol=1e-8, atol=1e-8 * np.abs(g_ref).max())
