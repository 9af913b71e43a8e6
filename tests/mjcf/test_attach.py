"""``<attach>`` of ``<model>`` assets against MuJoCo 4.0.0: every comparable Model field
(the compiled-model comparison: 1e-6) and the names and order of every kind of element,
on a two-level scene written here (a body and a whole world attached, the child's
assets, default classes, tendons, actuators, sensors and excludes prefixed, its option
ignored, angles in its own unit), on keyframes of attached models (MuJoCo keeps their
values on the child's elements: a key of an earlier attachment also sets the joints of
a later one that were not attached the first time) and on corpus robots attached twice
(the Gymnasium ant; the shadow hand with its meshes in its own meshdir; the Trossen arm
with its keyframes). What simjax does not attach raises UnsupportedFeatureError."""
from __future__ import annotations

import os
import sys
import warnings

import mujoco
import pytest

import simjax
from mujoco_oracle import CORPUS
from simjax.errors import MJCFError, UnsupportedFeatureError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from compare import compare, mismatched_names  # noqa: E402


CHILD = """<mujoco model="child">
  <compiler angle="radian"/>
  <option timestep="0.005"/>
  <default><default class="fing"><joint damping=".2"/><geom rgba="0 1 0 1"/></default>
  </default>
  <asset><material name="red" rgba="1 0 0 1"/>
    <mesh name="tet" vertex="0 0 0 1 0 0 0 1 0 0 0 1" scale=".1 .1 .1"/></asset>
  <custom><numeric name="gain" data="2 3"/></custom>
  <worldbody>
    <geom name="wg" size=".05" pos="0 0 -1"/>
    <body name="hand" pos="0 0 .1" euler="0 0 1.5707963"><joint name="wrist" axis="0 0 1"/>
      <geom name="palm" type="box" size=".05 .05 .01" material="red"/>
      <site name="tip" pos="0 0 .05"/>
      <body name="finger" childclass="fing" pos=".05 0 0"><joint name="knuckle"/>
        <geom name="fg" type="mesh" mesh="tet"/></body></body>
  </worldbody>
  <tendon><fixed name="couple"><joint joint="wrist" coef="1"/>
    <joint joint="knuckle" coef="1"/></fixed></tendon>
  <actuator><motor name="m" joint="wrist"/><motor name="mt" tendon="couple"/></actuator>
  <sensor><jointpos name="kp" joint="knuckle"/><framepos objtype="site" objname="tip"/>
    <touch site="tip"/><clock/></sensor>
  <contact><exclude body1="hand" body2="finger"/></contact>
</mujoco>"""

PARENT = """<mujoco model="parent">
  <compiler angle="radian"/>
  <asset><model name="child" file="sub/child.xml"/><material name="blue" rgba="0 0 1 1"/>
  </asset>
  <worldbody>
    <body name="arm" pos="0 0 1"><joint name="shoulder"/>
      <geom name="ag" size=".1" material="blue"/>
      <attach model="child" body="hand" prefix="left_"/>
    </body>
    <frame pos="1 0 0" euler="0 0 1.57"><attach model="child" prefix="w_"/></frame>
  </worldbody>
  <actuator><motor name="ms" joint="shoulder"/></actuator>
  <sensor><jointpos name="sp" joint="shoulder"/></sensor>
  <keyframe><key name="up" qpos=".5"/></keyframe>
</mujoco>"""


def _load_both(path):
    with warnings.catch_warnings():
        mjm = mujoco.MjModel.from_xml_path(str(path))
    return mjm, simjax.load_model(str(path))


def _check(mjm, model):
    matched, bad, n = compare(model, mjm)
    assert not bad, bad
    assert not mismatched_names(model, mjm)


def _write(tmp_path, parent, child=CHILD):
    (tmp_path / "sub").mkdir(exist_ok=True)
    (tmp_path / "sub" / "child.xml").write_text(child)
    (tmp_path / "parent.xml").write_text(parent)
    return tmp_path / "parent.xml"


def test_attach_body_and_world(tmp_path):
    mjm, model = _load_both(_write(tmp_path, PARENT))
    _check(mjm, model)
    # the body attachment takes the hand only: the child's world geom stays behind, and
    # the sensors and excludes naming it or the hand are copied where they resolve
    assert model.names["body"] == ["world", "arm", "left_hand", "left_finger", "w_hand",
                                   "w_finger"]
    assert model.names["geom"][0] == "w_wg"
    assert model.names["numeric"] == ["left_gain", "w_gain"]


KEYED = """<mujoco model="c2">
  <compiler angle="degree" eulerseq="zyx"/>
  <worldbody>
    <body name="base" euler="10 20 30"><freejoint/><geom size=".1"/>
      <body name="l1"><joint name="h1" range="-30 60" ref="10"/><geom size=".05"/></body>
      <body name="l2"><joint name="h2" type="slide"/><geom size=".05"/>
        <body name="l3"><joint name="b3" type="ball" range="0 45"/><geom size=".05"/>
        </body></body></body>
    <body name="other" pos="1 0 0"><joint name="h3"/><geom size=".05"/></body>
    <body name="mc" mocap="true" pos="0 1 0"><geom size=".05" contype="0"
      conaffinity="0"/></body>
  </worldbody>
  <actuator><motor name="a1" joint="h1"/><motor name="a3" joint="h3"/></actuator>
  <keyframe><key name="k" time=".5" qpos="1 2 3 1 0 0 0 .5 .6 .9 .1 .1 .1 .7"
    qvel="1 2 3 4 5 6 7 8 9 10 11 12" ctrl="11 13" mpos="1 2 3"/></keyframe>
</mujoco>"""

KEYED_PARENT = """<mujoco><compiler angle="radian"/>
  <asset><model name="c" file="sub/child.xml"/></asset>
  <worldbody>
    <body name="arm" pos="0 0 1"><joint name="sh"/><geom size=".1"/></body>
    <attach model="c" body="l2" prefix="x_"/>
    <frame euler="0 0 .5"><attach model="c" prefix="y_"/></frame>
  </worldbody>
  <actuator><motor name="ms" joint="sh"/></actuator>
  <keyframe><key name="pk" qpos="9"/></keyframe>
</mujoco>"""


SELF = """<mujoco><worldbody>
  <frame pos="0 -4 .3" euler="0 0 90">
    <frame name="conveyor" pos=".1 0 0">
      <geom name="belt" type="box" size=".7 .3 .06" surfacevel=".7 0 0 0 0 0"/>
      <body name="roller" pos=".7 0 0"><joint name="spin" axis="0 1 0"/>
        <geom name="drum" type="cylinder" size=".06 .3" euler="90 0 0"/></body>
    </frame></frame>
  <frame pos="-1 -4 .8"><attach frame="conveyor" prefix="top_"/></frame>
  <frame pos="0 -2 .6" euler="0 -24 90"><attach body="roller" prefix="up_"/></frame>
</worldbody>
<actuator><motor name="m" joint="spin"/></actuator>
<sensor><jointvel joint="spin"/><touch site="nowhere"/></sensor>
<contact><pair geom1="belt" geom2="drum"/></contact></mujoco>"""


def test_self_attach(tmp_path):
    """A frame (with its own transform) and a body of the model itself, copied with a
    prefix; the source stays; the actuator, sensor and pair are copied where their
    prefixed references resolve."""
    xml = SELF.replace('<touch site="nowhere"/>', "")
    (tmp_path / "s.xml").write_text(xml)
    mjm, model = _load_both(tmp_path / "s.xml")
    _check(mjm, model)
    assert model.names["body"] == ["world", "roller", "top_roller", "up_roller"]


NESTED = """<mujoco><compiler angle="radian"/>
  <asset><model file="sub/child.xml"/></asset>
  <worldbody>
    <replicate count="10" euler="0 0 .6" sep="-">
      <frame pos="0 -2 0"><attach model="c2" body="base" prefix="_"/></frame>
    </replicate>
  </worldbody></mujoco>"""


def test_replicated_attachment_keyframes(tmp_path):
    """Replicas of an attached model found by its own model name: the suffixes have the
    digits of the count, and only the first replica keeps the attached keyframe values
    (the template's bodies forget them once copied)."""
    mjm, model = _load_both(_write(tmp_path, NESTED, KEYED))
    _check(mjm, model)
    assert model.names["body"][1] == "_base-00"


def test_attach_keyframes_and_angles(tmp_path):
    mjm, model = _load_both(_write(tmp_path, KEYED_PARENT, KEYED))
    _check(mjm, model)
    assert model.names["key"] == ["pk", "x_k", "y_k"]


@pytest.mark.parametrize("robot,attrs,body", [
    ("gym_ant/ant.xml", 'angle="degree" coordinate="local" inertiafromgeom="true"',
     "torso"),
    ("mjx_shadow_hand/right_hand.xml", 'angle="radian" autolimits="true"', "rh_forearm"),
    ("menagerie_trossen_wx250s/wx250s.xml", 'autolimits="true"', "wx250s/base_link"),
])
def test_attach_corpus_robot_twice(tmp_path, robot, attrs, body):
    path = os.path.join(CORPUS, robot)
    if not os.path.exists(path):
        pytest.skip(f"corpus model {robot} not found (expected ../shared/corpus)")
    parent = f"""<mujoco><compiler {attrs}/>
      <asset><model name="r" file="{path}"/></asset>
      <worldbody><geom name="floor" type="plane" size="5 5 .1"/>
        <frame pos="0 0 .5"><attach model="r" prefix="a_"/></frame>
        <frame pos="2 0 .5" euler="0 0 3"><attach model="r" body="{body}" prefix="b_"/>
        </frame></worldbody></mujoco>"""
    (tmp_path / "p.xml").write_text(parent)
    mjm, model = _load_both(tmp_path / "p.xml")
    _check(mjm, model)


@pytest.mark.parametrize("change,error,message", [
    (('body="hand"', 'body="nope"'), MJCFError, "could not find body"),
    (('model="child" body="hand"', 'model="other" body="hand"'), MJCFError,
     "could not find model"),
    (('<attach model="child" body="hand" prefix="left_"/>',
      '<attach body="B" prefix="left_"/>'), MJCFError, "could not find body 'B' in the "
     "current model for self-attachment"),
])
def test_attach_errors(tmp_path, change, error, message):
    path = _write(tmp_path, PARENT.replace(*change))
    with pytest.raises(error, match=message):
        simjax.load_model(str(path))


@pytest.mark.parametrize("child_change,what", [
    (('<motor name="m" joint="wrist"/>',
      '<general name="m" joint="wrist" dyntype="integrator"/>'
      '</actuator><keyframe><key act="1"/></keyframe><actuator>'), "set act"),
    (('<compiler angle="radian"/>', '<compiler angle="radian" inertiafromgeom="true"/>'),
     "inertiafromgeom"),
])
def test_attach_unsupported_children(tmp_path, child_change, what):
    path = _write(tmp_path, PARENT, CHILD.replace(*child_change))
    mujoco.MjModel.from_xml_path(str(path))
    with pytest.raises(UnsupportedFeatureError, match=what):
        simjax.load_model(str(path))
