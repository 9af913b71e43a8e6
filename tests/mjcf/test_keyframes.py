"""Keyframes against MuJoCo 4.0.0: quaternions normalized; vectors shorter than the
model's sizes keep the defaults after them (mjCModel::ExpandKeyframe: qpos0, zero
velocities, activations and controls, the mocap bodies' own poses, whole mocap bodies
only); longer ones are rejected."""
from __future__ import annotations

import mujoco
import numpy as np
import pytest

import simjax

BASE = """<mujoco><worldbody>
  <body pos="0 0 1"><joint name="j" ref=".5"/><geom size=".1"/>
    <body pos="0 0 1"><joint ref=".7"/><geom size=".1"/></body></body>
  <body mocap="true" pos="1 2 3" quat="0 1 0 0"/><body mocap="true" pos="4 5 6"/>
</worldbody><actuator><motor joint="j"/><motor joint="j"/></actuator>
<keyframe><key {key}/></keyframe></mujoco>"""
FIELDS = ("key_qpos", "key_qvel", "key_act", "key_ctrl", "key_mpos", "key_mquat")


@pytest.mark.parametrize("key", ['qpos="1" qvel="3"', 'mpos="7 8 9"', 'mquat="0 0 1 0"',
                                 'mpos="1 2"', 'ctrl="4"', 'ctrl=""',
                                 'qpos="1 2" mpos="7 8 9 10 11 12"'])
def test_short_keyframes_expanded(key):
    xml = BASE.format(key=key)
    mjm = mujoco.MjModel.from_xml_string(xml)
    m = simjax.load_model(xml)
    for f in FIELDS:
        np.testing.assert_allclose(np.asarray(getattr(m, f)), getattr(mjm, f), rtol=0,
                                   atol=1e-12, err_msg=f)


@pytest.mark.parametrize("key", ['qpos="1 2 3"', 'qvel="1 2 3"', 'ctrl="1 2 3"'])
def test_long_keyframes_rejected(key):
    xml = BASE.format(key=key)
    with pytest.raises(ValueError, match="invalid"):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(simjax.MJCFError, match="invalid .* size"):
        simjax.load_model(xml)


def test_keyframe_quaternions_normalized():
    """Free and ball joint quaternions and mocap quaternions of a key are normalized
    (a zero one becomes the identity), as MuJoCo does."""
    xml = """<mujoco><worldbody><body mocap="true"><geom size=".1"/></body>
      <body><freejoint/><geom size=".1"/><body><joint type="ball"/><geom size=".1"/>
      </body></body></worldbody>
      <keyframe><key qpos="0 0 0 2 0 0 0 .9 .1 .1 .1" mquat="2 0 0 1"/>
        <key qpos="0 0 0 0 0 0 0 0 0 0 0"/></keyframe></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    m = simjax.load_model(xml)
    for f in FIELDS:
        np.testing.assert_allclose(np.asarray(getattr(m, f)), getattr(mjm, f), rtol=0,
                                   atol=1e-12, err_msg=f)
