"""Geom fields that depend on a mesh's frame, against MuJoCo 4.0.0: a surface velocity
given in the geom's frame is re-expressed in the compiled frame that absorbed the mesh's
principal frame (the angular part's origin moves to the mesh centre), for mesh geoms
and for primitives fitted to a mesh."""
from __future__ import annotations

import mujoco
import numpy as np

import simjax

XML = """<mujoco><asset>
  <mesh name="wedge" vertex="0 0 0  2 0 0  0 1 0  0 0 .5  2 0 .5  0 1 .5  .3 .2 1"/>
</asset><worldbody>
  <geom type="mesh" mesh="wedge" pos="1 2 3" euler="10 20 30"
        surfacevel=".1 .2 .3 .4 .5 .6"/>
  <geom type="box" mesh="wedge" surfacevel="0 0 0 0 0 1"/>
  <geom type="mesh" mesh="wedge" pos="0 0 1"/>
  <geom type="sphere" size=".1" surfacevel="1 0 0 0 0 2"/>
</worldbody></mujoco>"""


def test_surfacevel_in_mesh_frame():
    mjm = mujoco.MjModel.from_xml_string(XML)
    m = simjax.load_model(XML)
    assert np.abs(mjm.mesh_quat[0] - [1, 0, 0, 0]).max() > 0.1     # a turned mesh frame
    np.testing.assert_allclose(np.asarray(m.geom_surfacevel), mjm.geom_surfacevel,
                               rtol=0, atol=1e-12)
