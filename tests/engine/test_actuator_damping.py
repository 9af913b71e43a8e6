"""Actuator damping and armature (MuJoCo 4.0 actuator attributes added to the target
joint's or tendon's damping and armature) on actuators without controls: a DC motor with
input="none" has ctrlnum 0, so the model can have nu == 0 < nactuator. Its damping and
armature must still reach qM, qfrc_passive, dof_M0 and the trajectory (float64, against
MuJoCo 4.0.0; through model_from_mujoco and through simjax's compiler)."""
import jax
import mujoco
import numpy as np
import pytest

import simjax
from engine_helpers import rel_err
from mujoco_oracle import model_from_mujoco
from simjax.engine import make_data

XML = """<mujoco><option timestep="0.005"><flag constraint="disable"/></option>
  <worldbody><body><joint name="h" type="hinge" axis="0 1 0"/>
    <geom type="capsule" size=".05" fromto="0 0 0 .3 0 0" mass="1"/>
    <body pos=".3 0 0"><joint name="s" type="slide" axis="1 0 0"/><geom size=".05" mass=".5"/>
      <site name="a"/></body></body><site name="o" pos="0 0 .2"/></worldbody>
  <tendon><fixed name="t"><joint joint="s" coef="2"/></fixed></tendon>
  <actuator>
    <dcmotor joint="h" motorconst="0.4" resistance="2" input="none" damping="0.3" armature="0.05"/>
    <dcmotor tendon="t" motorconst="0.2" resistance="1" input="none" damping="0.2 0.1" armature="0.02"/>
  </actuator></mujoco>"""


_STEP = jax.jit(simjax.step)


@pytest.mark.parametrize("compiler", ["mujoco", "simjax"])
def test_damping_armature_without_controls(compiler):
    mjm = mujoco.MjModel.from_xml_string(XML)
    assert mjm.nu == 0 and mjm.nactuator == 2
    m = model_from_mujoco(mjm) if compiler == "mujoco" else simjax.load_model(XML)
    np.testing.assert_allclose(np.asarray(m.dof_M0), mjm.dof_M0, rtol=1e-12)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = [0.3, 0.1]
    mjd.qvel[:] = [-1.0, 2.0]
    d = make_data(m).replace(qpos=jax.numpy.asarray(mjd.qpos), qvel=jax.numpy.asarray(mjd.qvel))
    worst = 0.0
    for i in range(20):
        mujoco.mj_step(mjm, mjd)
        d = _STEP(m, d)
        if i == 0:   # qM and passive forces of the initial state, where both evaluated them
            full = np.zeros((mjm.nv, mjm.nv))
            mujoco.mj_fullM(mjm, mjd, full)
            assert rel_err(d.qM, full) < 1e-12
            assert rel_err(d.qfrc_passive, mjd.qfrc_passive) < 1e-12
        worst = max(worst, rel_err(d.qpos, mjd.qpos), rel_err(d.qvel, mjd.qvel))
    assert worst < 1e-10
