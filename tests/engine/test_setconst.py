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
