"""Fluid forces of the ellipsoid model (simjax.engine.passive) against mujoco 4.0.0,
float64, at speeds from 1 m/s down past mjMINVAL.

Thin ellipsoids (a playing card's 0.25 mm x 64 mm x 94 mm) at low speed are where
MuJoCo 4.0.0's projected area and Kutta lift differ from a clamped formula; below a speed
of mjMINVAL both are zero. The forces scale as speed^2, so each case is compared relative
to its own largest force (agreement seen: ~1e-15 relative).
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
