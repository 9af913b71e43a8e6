"""Fluid forces of the ellipsoid model (simjax.engine.passive) against mujoco 4.0.0,
float64, at speeds from 1 m/s down past mjMINVAL.

Thin ellipsoids (a playing card's 0.25 mm x 64 mm x 94 mm) at low speed are where
MuJoCo 4.0.0's projected area and Kutta lift differ from a clamped formula; below a speed
of mjMINVAL both are zero. The forces scale as speed^2, so each case is compared relative
to its own largest force (agreement seen: ~1e-15 relative). Their derivatives with
respect to density and viscosity at zero, where a traced model skips them at run time.
"""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from mujoco_oracle import model_from_mujoco
from simjax.engine import forward, make_data

XML = """<mujoco><option density="1.225" viscosity="1.8e-5" gravity="0 0 0"/>
<default><geom type="ellipsoid" fluidshape="ellipsoid" fluidcoef="0.5 0.25 0.5 2.0 1.0"/>
</default>
<worldbody>
  <body><freejoint/><geom size="0.000125 0.032 0.047" mass="2e-4"/></body>
  <body pos="1 0 0" euler="30 10 0"><freejoint/><geom size=".001 .002 .003"/></body>
  <body pos="2 0 0"><freejoint/><geom size=".1 .2 .3"/></body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e-9, 8e-16, 1e-16])
def test_ellipsoid_fluid_at_low_speed(scale):
    mjm = mujoco.MjModel.from_xml_string(XML)
    m = model_from_mujoco(mjm)
    fwd = jax.jit(forward)
    rng = np.random.default_rng(0)
    mjd = mujoco.MjData(mjm)
    for _ in range(4):
        v = rng.normal(size=(3, 6))
        v[:, :3] /= np.linalg.norm(v[:, :3], axis=1, keepdims=True)   # unit linear part
        mjd.qvel[:] = scale * v.ravel()
        mujoco.mj_forward(mjm, mjd)
        d = fwd(m, make_data(m).replace(qpos=jnp.asarray(mjd.qpos),
                                        qvel=jnp.asarray(mjd.qvel)))
        ref = mjd.qfrc_fluid.reshape(3, 6)
        ours = np.asarray(d.qfrc_fluid).reshape(3, 6)
        for b in range(3):
            lin = np.abs(ref[b, :3]).max()
            if scale >= 1e-15:
                assert lin > 0
            np.testing.assert_allclose(ours[b, :3], ref[b, :3], rtol=0,
                                       atol=1e-12 * max(lin, 1e-300))
            np.testing.assert_allclose(ours[b, 3:], ref[b, 3:], rtol=0,
                                       atol=1e-12 * np.abs(ref[b, 3:]).max())


@pytest.mark.parametrize("field", ["density", "viscosity"])
def test_fluid_derivative_at_zero(field):
    """Density and viscosity zero (the fluid skipped at run time): the derivative of
    the ellipsoid model's force, linear in each, is the force at 1 (the other 0); the
    skipped branch alone would give zero."""
    mjm = mujoco.MjModel.from_xml_string(XML)
    m = model_from_mujoco(mjm)
    rng = np.random.default_rng(1)
    d = make_data(m).replace(qvel=jnp.asarray(rng.normal(size=m.nv)))
    zero = m.opt.replace(density=jnp.zeros(()), viscosity=jnp.zeros(()))

    def force(x):
        return forward(m.replace(opt=zero.replace(**{field: x})), d).qfrc_fluid
    deriv = jax.jit(jax.jacfwd(force))(jnp.zeros(()))
    ref = np.asarray(jax.jit(force)(jnp.ones(())))
    assert np.abs(ref).max() > 1e-3
    np.testing.assert_allclose(deriv, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    grad = jax.jit(jax.grad(lambda x: force(x) @ jnp.arange(m.nv, dtype=ref.dtype)))
    np.testing.assert_allclose(grad(jnp.zeros(())), ref @ np.arange(m.nv),
                               rtol=1e-12, atol=0)
