"""``<compiler fusestatic="true">`` against MuJoCo 4.0.0 on a scene written here: every
comparable Model field, the names and order of every kind of element, and a
trajectory. Static bodies under the world and inside moving bodies fuse (chains of
them, with children that move re-parented); a referenced body stays, and so does a
named body with a force sensor's site."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from compare import assert_same_trajectory, same_model  # noqa: E402

XML = """<mujoco><compiler fusestatic="{fuse}" discardvisual="{discard}"/>
<worldbody>
  <geom name="floor" type="plane" size="2 2 .1"/>
  <body name="static_top" pos=".5 0 .1" euler="0 0 30"><geom type="box" size=".1 .1 .1"/>
    <body pos=".2 0 0"><geom type="sphere" size=".05"/></body>
  </body>
  <body name="a" pos="0 0 1">
    <freejoint/>
    <geom name="ga" type="capsule" size=".05" fromto="0 0 0 .3 0 0"/>
    <body name="arm" pos=".3 0 0" euler="10 20 30">
      <joint name="h" type="hinge" axis="0 1 0" damping=".01"/>
      <geom type="box" size=".1 .02 .02" pos=".1 0 0"/>
      <body name="hand" pos=".2 0 0" euler="0 0 40">
        <geom type="sphere" size=".04" mass=".2"/>
        <geom type="box" size=".02 .02 .02" contype="0" conaffinity="0" pos="0 .03 0"/>
        <site name="tip" pos=".05 0 0"/>
        <camera name="eye" pos="0 0 .1" euler="0 10 0"/>
        <body name="finger" pos=".05 .02 0" euler="5 0 0">
          <geom type="box" size=".02 .01 .01"/>
          <body name="nail" pos=".03 0 0"><joint type="hinge"/><geom size=".01"/></body>
        </body>
      </body>
      <body name="kept" pos="0 .1 0"><geom size=".02"/></body>
    </body>
    <geom name="after" type="sphere" size=".03" pos="0 0 .1"/>
  </body>
</worldbody>
<sensor><framepos objtype="body" objname="kept"/><framepos objtype="site" objname="tip"/>
  <framequat objtype="camera" objname="eye"/></sensor>
</mujoco>"""


@pytest.mark.parametrize("fuse,discard", [("true", "false"), ("true", "true"),
                                          pytest.param("false", "false",
                                                       marks=pytest.mark.slow)])
def test_scene(fuse, discard):
    mjm, m = same_model(XML.format(fuse=fuse, discard=discard))
    if fuse == "true":
        assert [mjm.body(i).name for i in range(mjm.nbody)] == ["world", "a", "arm", "nail",
                                                                "kept"]
    assert_same_trajectory(mjm, m, 200, 1e-9)


def test_force_sensor_site_keeps_named_body():
    """MuJoCo fuses a named body only when nothing breaks without its name: a force
    sensor's site on it keeps it (the sensor then measures that body)."""
    mjm, _ = same_model(XML.format(fuse="true", discard="false").replace(
        "<sensor>", '<sensor><force site="tip"/>'))
    assert "hand" in [mjm.body(i).name for i in range(mjm.nbody)]


def test_body_fuse_false_stays():
    """MuJoCo 4's body attribute fuse="false" keeps a static body (under the world or
    inside a moving body) out of the fusing: every field and the trajectory as
    MuJoCo's (it was ignored: the bodies fused)."""
    xml = XML.format(fuse="true", discard="false")
    xml = xml.replace('<body name="static_top"', '<body name="static_top" fuse="false"')
    xml = xml.replace('<body name="finger"', '<body name="finger" fuse="false"')
    mjm, m = same_model(xml)
    assert [mjm.body(i).name for i in range(mjm.nbody)] == [
        "world", "static_top", "a", "arm", "finger", "nail", "kept"]
    assert m.nbody == mjm.nbody
    assert_same_trajectory(mjm, m, 100, 1e-9)
