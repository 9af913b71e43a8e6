"""Support queries (Jacobians, inertia helpers, energies, qpos algebra, resets)."""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import load, random_state, set_state, to_data
from simjax.engine import (differentiate_pos, forward, integrate_pos, jac, jac_body,
                           jac_body_com, jac_geom, jac_site, jac_subtree_com, make_data,
                           mul_m, reset, reset_keyframe, solve_m, support)
from simjax.engine import smooth


@pytest.fixture(scope="module")
def features():
    mjm, m = load("features", edit=lambda mm: setattr(mm.opt, "enableflags",
                                                       mujoco.mjtEnableBit.mjENBL_ENERGY))
    rng = np.random.default_rng(3)
    state = random_state(mjm, rng)
    mjd = mujoco.MjData(mjm)
    set_state(mjm, mjd, state)
    mujoco.mj_forward(mjm, mjd)
    d = jax.jit(forward)(m, to_data(make_data(m), state))
    return mjm, mjd, m, d


def test_jacobians(features):
    mjm, mjd, m, d = features
    jp, jr = np.zeros((3, mjm.nv)), np.zeros((3, mjm.nv))
    for b in range(mjm.nbody):
        point = np.array([0.1, -0.2, 0.3])
        mujoco.mj_jac(mjm, mjd, jp, jr, point, b)
        p, r = jac(m, d, jnp.asarray(point), b)
        np.testing.assert_allclose(p, jp, atol=1e-12)
        np.testing.assert_allclose(r, jr, atol=1e-12)
        for ours, theirs in ((jac_body, mujoco.mj_jacBody), (jac_body_com, mujoco.mj_jacBodyCom)):
            theirs(mjm, mjd, jp, jr, b)
            p, r = ours(m, d, b)
            np.testing.assert_allclose(p, jp, atol=1e-12)
            np.testing.assert_allclose(r, jr, atol=1e-12)
        mujoco.mj_jacSubtreeCom(mjm, mjd, jp, b)
        np.testing.assert_allclose(jac_subtree_com(m, d, b), jp, atol=1e-12)
    for g in range(mjm.ngeom):
        mujoco.mj_jacGeom(mjm, mjd, jp, jr, g)
        p, r = jac_geom(m, d, g)
        np.testing.assert_allclose(p, jp, atol=1e-12)
    for s in range(mjm.nsite):
        mujoco.mj_jacSite(mjm, mjd, jp, jr, s)
        p, r = jac_site(m, d, s)
        np.testing.assert_allclose(r, jr, atol=1e-12)
    # traced body ids work too
    p, _ = jax.jit(lambda b: jac_body(m, d, b))(jnp.int32(3))
    mujoco.mj_jacBody(mjm, mjd, jp, jr, 3)
    np.testing.assert_allclose(p, jp, atol=1e-12)


def test_inertia_helpers(features):
    mjm, mjd, m, d = features
    vec = np.random.default_rng(0).standard_normal(mjm.nv)
    res = np.zeros(mjm.nv)
    mujoco.mj_mulM(mjm, mjd, res, vec)
    np.testing.assert_allclose(mul_m(m, d, jnp.asarray(vec)), res, rtol=1e-10)
    mujoco.mj_solveM(mjm, mjd, res.reshape(1, -1), vec.reshape(1, -1))
    np.testing.assert_allclose(solve_m(m, d, jnp.asarray(vec)), res, rtol=1e-9)
    mat = np.random.default_rng(1).standard_normal((mjm.nv, 3))
    np.testing.assert_allclose(solve_m(m, d, jnp.asarray(mat)),
                               np.linalg.solve(np.asarray(d.qM), mat), rtol=1e-8)


def test_energy_and_subtree_vel(features):
    mjm, mjd, m, d = features
    np.testing.assert_allclose(d.energy, mjd.energy, rtol=1e-9, atol=1e-12)
    mujoco.mj_subtreeVel(mjm, mjd)
    dv = smooth.subtree_vel(m, d)
    np.testing.assert_allclose(dv.subtree_linvel, mjd.subtree_linvel, atol=1e-10)
    np.testing.assert_allclose(dv.subtree_angmom, mjd.subtree_angmom, atol=1e-10)


def test_apply_ft(features):
    mjm, mjd, m, d = features
    force, torque, point = np.array([1.0, -2, 0.5]), np.array([0.3, 0.1, -0.7]), np.ones(3)
    qfrc = np.zeros(mjm.nv)
    mujoco.mj_applyFT(mjm, mjd, force, torque, point, 4, qfrc)
    ours = support.apply_ft(m, d, jnp.asarray(force)[None], jnp.asarray(torque)[None],
                            jnp.asarray(point)[None], np.array([4]))
    np.testing.assert_allclose(ours, qfrc, atol=1e-12)


def test_qpos_algebra(features):
    mjm, mjd, m, d = features
    rng = np.random.default_rng(5)
    qpos, qvel = mjd.qpos.copy(), rng.standard_normal(mjm.nv)
    ref = qpos.copy()
    mujoco.mj_integratePos(mjm, ref, qvel, 0.01)
    ours = integrate_pos(m, jnp.asarray(qpos), jnp.asarray(qvel), 0.01)
    np.testing.assert_allclose(ours, ref, atol=1e-14)
    vel = np.zeros(mjm.nv)
    mujoco.mj_differentiatePos(mjm, vel, 0.01, qpos, ref)
    np.testing.assert_allclose(differentiate_pos(m, jnp.asarray(qpos), ours, 0.01), vel,
                               atol=1e-9)


def test_reset_and_keyframe():
    mjm, m = load("features")
    mjd = mujoco.MjData(mjm)
    d = reset(m)
    np.testing.assert_allclose(d.qpos, mjm.qpos0)
    np.testing.assert_allclose(d.mocap_pos, mjd.mocap_pos)
    np.testing.assert_allclose(d.mocap_quat, mjd.mocap_quat)
    mujoco.mj_resetDataKeyframe(mjm, mjd, 0)
    for k in (0, "k0"):
        dk = reset_keyframe(m, d, k)
        for f in ("time", "qpos", "qvel", "act", "ctrl", "mocap_pos", "mocap_quat"):
            np.testing.assert_allclose(getattr(dk, f), getattr(mjd, f), err_msg=f)
    batched = jax.vmap(lambda k: reset_keyframe(m, d, k))(jnp.zeros(3, jnp.int32))
    assert batched.qpos.shape == (3, mjm.nq)


def test_ids_out_of_range_raise():
    """A concrete id outside 0..n-1 raises IndexError (jax would clamp it to another
    object, silently; a negative one would count from the end); traced ids pass."""
    import jax
    import jax.numpy as jnp
    import simjax
    xml = ('<mujoco><worldbody><body><joint type="hinge"/><geom size=".1"/>'
           '<site name="s"/></body></worldbody></mujoco>')
    m = simjax.load_model(xml)
    d = jax.jit(simjax.forward)(m, simjax.make_data(m))
    for fn, bad, what in ((simjax.jac_body, 2, "body"), (simjax.jac_body_com, -1, "body"),
                          (simjax.jac_geom, 1, "geom"), (simjax.jac_site, 1, "site"),
                          (simjax.jac_subtree_com, 5, "body")):
        with pytest.raises(IndexError, match=f"{what} id {bad} out of range"):
            fn(m, d, bad)
    with pytest.raises(IndexError, match="body id 2 out of range: the model has 2"):
        simjax.apply_ft(m, d, jnp.ones((1, 3)), None, jnp.zeros((1, 3)), [2])
    with pytest.raises(IndexError, match="keyframe id 0 out of range: the model has none"):
        simjax.reset_keyframe(m, d, 0)
    # concrete in range, numpy and jax scalars, and traced ids
    ref = simjax.jac_body(m, d, 1)[0]
    for body in (np.int32(1), jnp.int32(1)):
        np.testing.assert_array_equal(simjax.jac_body(m, d, body)[0], ref)
    np.testing.assert_array_equal(jax.jit(lambda b: simjax.jac_body(m, d, b)[0])(1), ref)
