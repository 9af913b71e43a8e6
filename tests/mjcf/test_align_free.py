"""Free-joint alignment (``<freejoint align>``, ``<compiler alignfree>``) against MuJoCo
4.0.0 on a scene written here: every comparable Model field (the compiled-model
comparison, 1e-6; seen equal to rounding) and a trajectory of the aligned bodies.

Aligned: simple free bodies (a free joint, no child bodies) with align="true", or
"auto" under alignfree; their geoms (primitives and a mesh), sites, cameras and frames
move with the body frame onto the inertial frame. Not aligned: align="false", a free
body with a child, and everything when alignfree is off and align is auto. The scene
has no curved convex pairs (ellipsoid, cylinder), whose contacts simjax finds at the
exact penetration where MuJoCo's EPA stops near it (see collision/convex.py)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from compare import assert_same_trajectory, same_model  # noqa: E402

XML = """<mujoco><compiler alignfree="{alignfree}"/>
<asset><mesh name="m" vertex="0 0 0  .3 0 0  0 .2 0  0 0 .1  .2 .1 .3"/></asset>
<worldbody>
  <geom type="plane" size="3 3 .1"/>
  <body name="a" pos=".1 .2 1" euler="10 20 30">
    <freejoint/>
    <geom type="capsule" size=".05" fromto="0 0 0 .4 0 0"/>
    <geom type="box" size=".1 .05 .02" pos=".4 .1 0" euler="0 30 0"/>
    <frame pos=".1 .1 0" euler="0 0 40">
      <geom type="mesh" mesh="m"/>
      <site name="s" pos=".05 0 .1" euler="5 6 7"/>
      <camera name="c" pos="0 0 .3" euler="10 20 30"/>
    </frame>
  </body>
  <body name="b" pos="1 0 1"><freejoint align="true"/>
    <geom type="box" size=".1 .2 .05" pos=".3 0 0" euler="0 20 0"/>
    <geom type="sphere" size=".05" pos="0 .2 0"/></body>
  <body name="c" pos="2 0 1"><freejoint align="false"/>
    <geom type="box" size=".1 .1 .1" pos=".2 0 0"/></body>
  <body name="d" pos="0 2 1"><joint type="free"/>
    <geom type="box" size=".1 .2 .1" pos=".2 .1 0"/></body>
  <body name="e" pos="1 2 1"><freejoint align="true"/>
    <geom type="box" size=".1 .1 .1" pos=".2 0 0"/>
    <body pos=".3 0 0"><joint/><geom size=".05"/></body></body>
</worldbody>
<sensor><framepos objtype="body" objname="a"/><framequat objtype="site" objname="s"/>
  <framexaxis objtype="camera" objname="c"/></sensor>
</mujoco>"""


@pytest.mark.parametrize("alignfree", ["true", "false"])
def test_model_fields(alignfree):
    mjm, _ = same_model(XML.format(alignfree=alignfree))
    aligned = np.all(np.abs(mjm.body_ipos) < 1e-12, axis=1)
    # a, d follow alignfree; b always; c and e (with a child) never
    expect = [alignfree == "true", True, False, alignfree == "true", False]
    assert list(aligned[1:6]) == expect


def test_trajectory():
    """The aligned bodies fall onto the plane and tumble as in MuJoCo (qpos in the new
    frames) over 300 steps: seen 3e-14, tolerance 1e-10."""
    assert_same_trajectory(*same_model(XML.format(alignfree="true")), 300, 1e-10)
