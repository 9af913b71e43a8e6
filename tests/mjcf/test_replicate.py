"""``<replicate>`` against MuJoCo 4.0.0 on scenes written here: every comparable Model
field (the compiled-model comparison: 1e-6) and the names and order of every kind of
element. The scenes cover nested replicates (the XML reference's example), offsets
with rotations (degrees and radians, another euler sequence), childclass, and the
copying rules for elements outside the tree: fallbacks of pairs, excludes and sensors
to one plain name, tendons with wraps in and out of the replica, actuators on copied
tendons, equalities with the world, elements removed with the template, copies of
reference-free sensors at every replica, zero-padded suffixes, count 0. Models MuJoCo
rejects are rejected too."""
from __future__ import annotations

import os
import sys

import mujoco
import pytest

import simjax
from simjax.errors import MJCFError, UnsupportedFeatureError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from compare import compare, mismatched_names, mujoco_names  # noqa: E402


TWO = """<mujoco><worldbody>
  <body name="A" pos="0 0 1"><joint name="JA"/><geom name="GA" size=".1"/></body>
  <replicate count="{count}" offset=".5 0 0" euler="0 0 30" sep="{sep}">
    <body name="R" pos="1 0 0"><joint name="J"/><geom name="G" size=".1"/><site name="S"/>
      <body name="RC"><joint name="JC"/><geom size=".05"/></body></body>
    <geom name="loose" size=".05" pos="0 1 0"/>
  </replicate>
  <body name="B" pos="0 0 2"><joint name="JB"/><geom name="GB" size=".1"/></body>
</worldbody>{extra}</mujoco>"""

LISTS = """
<tendon><fixed name="TJ"><joint joint="J" coef="1"/></fixed>
  <fixed name="TM"><joint joint="J" coef="1"/><joint joint="JA" coef="1"/></fixed>
  <fixed name="TA"><joint joint="JA" coef="1"/></fixed></tendon>
<equality><joint name="E2" joint1="JA" joint2="JB"/>
  <connect name="EW" body1="R" anchor="0 0 0"/>
  <weld name="gone" body1="A" body2="R"/></equality>
<contact><exclude name="X1" body1="R" body2="A"/>
  <pair name="P" geom1="G" geom2="GA"/><pair geom1="GA" geom2="G"/></contact>
<actuator><motor name="a1" joint="J"/><motor name="a2" joint="JA"/>
  <motor name="a3" tendon="TM"/></actuator>
<sensor><jointpos name="s1" joint="JA"/><jointpos name="s2" joint="J"/>
  <framepos name="s3" objtype="site" objname="S"/><jointpos name="s4" joint="JB"/>
  <framepos name="F" objtype="site" objname="S" reftype="body" refname="A"/>
  <framepos objtype="body" objname="A" reftype="site" refname="S"/>
  <clock name="c"/></sensor>"""

NESTED = """<mujoco><worldbody>
  <replicate count="2" offset="0 1 0" euler="90 0 0">
    <replicate count="2" sep="-" offset="1 0 0" euler="0 90 0">
      <geom name="Alice" size=".1"/><site name="Alice" size=".01"/>
    </replicate>
  </replicate></worldbody>
  <sensor><accelerometer name="Bob" site="Alice"/></sensor></mujoco>"""

LEGS = """<mujoco><compiler angle="radian" eulerseq="zyx"/>
<default><default class="leg"><joint damping=".3" range="-1 1"/>
  <geom rgba="1 0 0 1" size=".03"/></default></default>
<worldbody><geom name="floor" type="plane" size="5 5 .1"/>
  <body name="torso" pos="0 0 1"><freejoint/><geom name="tg" size=".2"/>
    <site name="anchor"/>
    <camera name="cam" pos="0 -2 1" mode="targetbody" target="torso"/>
    <replicate count="4" euler="0 0 1.5707963" offset=".1 0 0" sep="_" childclass="leg">
      <body name="hip" pos=".25 0 0"><joint name="hipj" axis="0 0 1"/>
        <geom name="thigh" type="capsule" fromto="0 0 0 .2 0 0"/>
        <site name="knee_s" pos=".2 0 0"/>
        <camera name="kc" mode="targetbody" target="hip" pos=".1 .1 .1"/>
        <body name="shin" pos=".2 0 0"><joint name="kneej" axis="0 1 0"/>
          <geom name="shin_g" type="capsule" fromto="0 0 0 0 0 -.3"/>
          <site name="foot" pos="0 0 -.3"/></body></body>
    </replicate></body></worldbody>
<tendon><spatial name="cable"><site site="anchor"/><site site="knee_s"/></spatial>
  <fixed name="sync"><joint joint="hipj" coef="1"/><joint joint="kneej" coef="-.5"/></fixed>
</tendon>
<equality><joint name="lock" joint1="kneej" joint2="hipj" active="false"/></equality>
<contact><exclude body1="torso" body2="hip"/><pair geom1="shin_g" geom2="floor"/></contact>
<actuator><motor name="hm" joint="hipj" gear="2"/>
  <position name="kp" joint="kneej" kp="10"/>
  <motor name="tm" tendon="cable"/><general name="gs" site="foot" gear="0 0 1 0 0 0"/>
</actuator>
<sensor><touch name="ft" site="foot"/><actuatorfrc actuator="hm"/><tendonpos tendon="sync"/>
  <framepos objtype="site" objname="foot" reftype="body" refname="torso"/>
  <distance geom1="shin_g" geom2="floor"/>
  <contact geom1="shin_g" geom2="floor" data="found"/>
  <subtreecom body="hip"/><jointlimitpos joint="kneej"/></sensor>
<keyframe><key name="home" qpos="0 0 1 1 0 0 0 .1 .2 .3 .4 .5 .6 .7 .8"/></keyframe>
</mujoco>"""

WRAPS = """<mujoco><worldbody><site name="ceiling" pos="0 0 2.4"/>
  <body name="bulb" pos="0 0 1.5"><freejoint/><site name="hook" pos="0 0 .3"/>
    <site name="side"/><geom name="bulb" size=".3" contype="0" conaffinity="0"/></body>
  <replicate count="5" euler="0 0 72">
    <body pos=".2 0 1.5"><freejoint/><site name="a"/><geom size=".03"/></body>
    <body pos="1.2 0 1.5"><freejoint/><site name="b"/><geom size=".1"/></body>
  </replicate></worldbody>
  <tendon><spatial springlength="0 .5" stiffness="100"><site site="ceiling"/>
      <site site="hook"/></spatial>
    <spatial name="sling" range="0 .5"><site site="a"/><geom geom="bulb" sidesite="side"/>
      <site site="b"/></spatial></tendon></mujoco>"""

SCENES = {
    "lists": TWO.format(count=3, sep="_", extra=LISTS),
    "padded": TWO.format(count=12, sep="", extra=""),
    "none": TWO.format(count=0, sep="",
                       extra='<sensor><jointpos joint="J"/><clock/></sensor>'),
    "nested": NESTED,
    "legs": LEGS,
    "wraps": WRAPS,
}


@pytest.mark.parametrize("scene", sorted(SCENES))
def test_replicate_fields_and_names(scene):
    xml = SCENES[scene]
    mjm = mujoco.MjModel.from_xml_string(xml)
    model = simjax.load_model(xml)
    matched, bad, n = compare(model, mjm)
    assert not bad, bad
    assert not mismatched_names(model, mjm)


def test_replicate_list_copies():
    """The copying rules, spelled out on the ``lists`` scene (MuJoCo's result)."""
    m = simjax.load_model(SCENES["lists"])
    assert m.names["body"] == ["world", "A", "R_0", "RC_0", "R_1", "RC_1", "R_2", "RC_2",
                               "B"]
    # copies append to their list, replica by replica; the mixed tendon keeps JA
    assert m.names["tendon"] == ["TA", "TJ_0", "TM_0", "TJ_1", "TM_1", "TJ_2", "TM_2"]
    # the weld from A to R found no copy (A_k does not exist) and left with R
    assert m.names["equality"] == ["E2", "EW_0", "EW_1", "EW_2"]
    # the clock has no references: copied at every replica, copies included
    sensors = m.names["sensor"]
    assert sensors[:3] == ["s1", "s4", "c"]
    assert sensors.count("c_0_1_2") == 1
    assert len([s for s in sensors if s.startswith("c")]) == 8


@pytest.mark.parametrize("extra,message", [
    # an equality naming a template element and one later in the document: MuJoCo
    # keeps it (it did not resolve before the template's deletion) and fails
    ('<equality><joint joint1="J" joint2="JB"/></equality>', "J"),
    ('<contact><pair geom1="G" geom2="GB"/></contact>', "G"),
])
def test_replicate_dangling_references_rejected(extra, message):
    xml = TWO.format(count=2, sep="-", extra=extra)
    with pytest.raises(ValueError, match=f"'{message}'"):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(MJCFError, match=f"'{message}'"):
        simjax.load_model(xml)


def test_replicate_with_tuples_unsupported():
    xml = TWO.format(count=2, sep="", extra="""<custom><tuple name="t">
        <element objtype="body" objname="R"/></tuple></custom>""")
    mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(UnsupportedFeatureError, match="tuple"):
        simjax.load_model(xml)


def test_replicate_ignores_unknown_attributes():
    """MuJoCo 4.0's reader does not check a replicate's attributes: unknown ones (a
    ``prefix``, say) are accepted and have no effect."""
    xml = TWO.format(count=2, sep="-", extra="").replace('sep="-"', 'sep="-" prefix="A"')
    mjm = mujoco.MjModel.from_xml_string(xml)
    model = simjax.load_model(xml)
    assert not compare(model, mjm)[1]
    assert list(model.names["body"]) == mujoco_names(mjm, "body")
