"""Reference-pose constants computed at load time against MuJoCo's compiled model."""
import mujoco
import numpy as np

import simjax

_DAMPRATIO = """<mujoco><worldbody>
  <body><joint name="a" axis="0 1 0" armature="0.05"/>
    <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.05"/>
    <body pos="0 0 -0.5"><joint name="b" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 -0.5" size="0.05"/>
      <body pos="0.3 0 -0.5"><joint name="c" type="ball"/><geom type="box" size="0.1 0.2 0.05"/>
      </body></body></body></worldbody>
  <tendon><fixed name="t"><joint joint="a" coef="1.5"/><joint joint="b" coef="-0.7"/></fixed>
  </tendon>
  <actuator>
    <position joint="a" kp="10" dampratio="1" gear="2"/>
    <position tendon="t" kp="10" dampratio="0.7"/>
    <position joint="c" kp="10" dampratio="1" gear="0.3 0.5 0.1 0 0 0"/>
    <position joint="b" kp="10" dampratio="1" gear="0"/>
    <position joint="b" kp="10" kv="3"/>
  </actuator></mujoco>"""


def test_dampratio_uses_reflected_inertia():
    """kv = dampratio 2 sqrt(kp m) with m = 1 / (moment M^-1 moment') at qpos0 (MuJoCo
    4.0): through a gear, a two-joint fixed tendon and a ball joint (where the sum of
    dof_M0 / moment^2 would differ by a factor up to 60); zero moment gives zero kv; an
    explicit kv is kept."""
    mjm = mujoco.MjModel.from_xml_string(_DAMPRATIO)
    model = simjax.load_model(_DAMPRATIO)
    np.testing.assert_allclose(np.asarray(model.actuator_biasprm), mjm.actuator_biasprm,
                               rtol=1e-12, atol=1e-12)
    assert mjm.actuator_biasprm[3, 2] == 0 and mjm.actuator_biasprm[4, 2] == -3


_TENDON_ARMATURE = """<mujoco><worldbody><site name="w"/>
  <body pos="1 0 0"><joint name="x" type="slide" axis="1 0 0"/>
    <joint name="z" type="slide" axis="0 0 1"/><geom size=".1" mass="1"/><site name="s"/>
    <body pos=".3 0 0"><joint name="h" axis="0 1 0"/><geom size=".05" mass=".5"/>
      <site name="t"/></body></body>
  <body pos="-1 0 0"><joint name="y" type="slide" axis="0 1 0"/><geom size=".1"/>
    <site name="u"/></body></worldbody>
  <tendon><spatial armature="5"><site site="w"/><site site="s"/></spatial>
    <spatial name="cross" armature="2"><site site="t"/><site site="u"/></spatial>
    <fixed name="f"><joint joint="x" coef="1"/><joint joint="h" coef="-.5"/></fixed>
  </tendon>
  <actuator><motor tendon="f" armature=".7" gear="2"/></actuator></mujoco>"""


def test_tendon_armature_in_reference_weights():
    """The inverse weights, actuator_acc0 and the mean inertia see the tendons' armature
    (and an actuator's on a tendon, times gear squared), only where the mass matrix's
    tree sparsity has room (the tendon across two trees adds no cross term); dof_M0
    does not (MuJoCo 4.0's mj_setConst)."""
    mjm = mujoco.MjModel.from_xml_string(_TENDON_ARMATURE)
    model = simjax.load_model(_TENDON_ARMATURE)
    for f in ("body_invweight0", "dof_invweight0", "tendon_invweight0", "actuator_acc0",
              "dof_M0"):
        np.testing.assert_allclose(np.asarray(getattr(model, f)), getattr(mjm, f),
                                   rtol=1e-10, atol=1e-12, err_msg=f)
    np.testing.assert_allclose(float(model.stat.meaninertia), mjm.stat.meaninertia,
                               rtol=1e-10)
