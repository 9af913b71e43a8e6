"""``<compiler discardvisual="true">`` against MuJoCo 4.0.0: every comparable Model field
and the names and order of every kind of element, on a scene written here (visual
geoms with and without meshes and materials, geoms kept by each kind of reference,
meshes kept by a fitted primitive and by a tactile sensor, a body whose inertia came
partly from a dropped geom). MuJoCo's own test model (test/user/testdata/discardvisual.xml)
matches too, checked by hand: it is not among the models the tests read."""
from __future__ import annotations

import os
import sys

import mujoco
import numpy as np
import pytest

import simjax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from compare import same_model  # noqa: E402

XML = """<mujoco><compiler discardvisual="{discard}"/>
<asset>
  <texture name="t" type="2d" builtin="checker" width="8" height="8" rgb1="0 0 0"
           rgb2="1 1 1"/>
  <material name="mat" texture="t" rgba="1 0 0 .5"/>
  <mesh name="only_visual" vertex="0 0 0  .1 0 0  0 .1 0  0 0 .1"/>
  <mesh name="fitted" vertex="0 0 0  .2 0 0  0 .1 0  0 0 .1"/>
  <mesh name="pad" builtin="plate" params="3 2" scale=".1 .1 .1"/>
  <mesh name="unused" vertex="0 0 0  .1 0 0  0 .1 0  0 0 .1"/>
  <mesh name="collider" vertex="0 0 0  .1 0 0  0 .1 0  0 0 .1"/>
</asset>
<worldbody>
  <geom name="floor" type="plane" size="2 2 .1" material="mat"/>
  <site name="s0" pos="0 0 1.5"/>
  <body name="a" pos="0 0 1">
    <freejoint/>
    <geom name="body" type="sphere" size=".1" material="mat"/>
    <geom name="vis" type="mesh" mesh="only_visual" contype="0" conaffinity="0" pos=".1 0 0"/>
    <geom type="box" size=".05 .05 .05" contype="0" conaffinity="0" pos="0 .2 0"/>
    <geom name="fit" type="box" mesh="fitted" pos="0 0 .2"/>
    <geom name="tac" type="box" size=".1 .1 .01" contype="0" conaffinity="0"/>
    <geom name="wrapped" type="sphere" size=".03" contype="0" conaffinity="0" pos="0 0 .3"/>
    <site name="s1" pos="0 0 .4"/>
    <geom name="framed" size=".02" contype="0" conaffinity="0" pos=".3 0 0"/>
    <geom name="paired" size=".02" contype="0" conaffinity="0" pos="-.3 0 0"/>
    <geom name="tupled" size=".02" contype="0" conaffinity="0" pos="0 -.3 0"/>
    <geom name="dist" size=".02" contype="0" conaffinity="0" pos="0 .3 .1"/>
  </body>
  <body name="b" pos="1 0 1">
    <inertial pos="0 0 0" mass="1" diaginertia=".01 .01 .01"/>
    <freejoint/>
    <geom type="mesh" mesh="collider"/>
    <geom type="capsule" size=".02 .1" contype="0" conaffinity="0"/>
  </body>
</worldbody>
<contact><pair geom1="paired" geom2="floor"/></contact>
<tendon><spatial range="0 2"><site site="s0"/><geom geom="wrapped"/><site site="s1"/>
</spatial></tendon>
<sensor>
  <framepos objtype="geom" objname="framed"/>
  <distance geom1="dist" geom2="floor"/>
  <tactile geom="tac" mesh="pad"/>
</sensor>
<custom><tuple name="tp"><element objtype="geom" objname="tupled"/></tuple></custom>
</mujoco>"""


@pytest.mark.parametrize("discard", ["true", pytest.param("false",
                                                         marks=pytest.mark.slow)])
def test_scene(discard):
    mjm, m = same_model(XML.format(discard=discard))
    if discard == "true":
        # dropped: the visual mesh geom, two unnamed visual primitives (one in a body
        # with an explicit inertial), the visual-only mesh and the unused one
        assert (mjm.ngeom, mjm.nmesh, mjm.nmat) == (10, 3, 0)
        assert list(m.names["mesh"]) == ["fitted", "pad", "collider"]
    # same dynamics either way: the masses were inferred with the dropped geoms
    d = simjax.forward(m, simjax.make_data(m))        # eager: one program, values constant
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    np.testing.assert_allclose(np.asarray(d.qacc), mjd.qacc, atol=1e-9)
    np.testing.assert_allclose(np.asarray(d.sensordata), mjd.sensordata, atol=1e-9)

