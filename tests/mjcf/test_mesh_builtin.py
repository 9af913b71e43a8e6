"""Builtin meshes (``<mesh builtin=... params=...>``) against MuJoCo 4.0.0: every
comparable Model field of scenes with each builtin at several parameters, with and
without a mesh scale. The vertices and faces equal MuJoCo's (float32 vertices: same
floats, the generators follow MuJoCo's arithmetic); derived masses and inertias agree
to about 1e-8 relative (MuJoCo's float32 mesh storage), within the compiled-model
comparison's 1e-6. Bad parameters raise MJCFError with MuJoCo's message."""
from __future__ import annotations

import os
import sys

import mujoco
import numpy as np
import pytest

import simjax
from simjax.errors import MJCFError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "conformance"))
from compare import compare  # noqa: E402

#: (builtin, params) of one scene each; the plate is a shell with no volume, given
#: inertia only through a mass (MuJoCo rejects a 3 x 4 plate's inertia, see below)
CASES = {
    "sphere": ["0", "2", "3"],
    "hemisphere": ["0", "1", "3"],
    "supersphere": ["8 1 1", "10 .5 2", "6 .3 .3"],
    "supertorus": ["8 .3 1 1", "12 .5 .5 2"],
    "cone": ["6 .5", "10 0", "3 1"],
    "wedge": ["4 3 60 45 0", "5 5 120 30 .5"],
    "plate": ["2 2", "4 4"],
}


def _scene(pairs, scale=""):
    assets = "".join(f'<mesh name="m{i}" builtin="{b}" params="{p}"{scale}/>'
                     for i, (b, p) in enumerate(pairs))
    # a plate is flat: no convex hull, so no collisions
    off = ' contype="0" conaffinity="0"'
    bodies = "".join(f'<body pos="{i} 0 0"><freejoint/><geom type="mesh" mesh="m{i}"'
                     + (off if b == "plate" else "") + "/></body>"
                     for i, (b, _) in enumerate(pairs))
    return f"<mujoco><asset>{assets}</asset><worldbody>{bodies}</worldbody></mujoco>"


@pytest.mark.parametrize("scale", ["", ' scale=".1 .2 .15"'], ids=["unit", "scaled"])
@pytest.mark.parametrize("builtin", sorted(CASES))
def test_builtin_mesh_fields(builtin, scale):
    xml = _scene([(builtin, p) for p in CASES[builtin]], scale)
    mjm = mujoco.MjModel.from_xml_string(xml)
    model = simjax.load_model(xml)
    matched, bad, n = compare(model, mjm)
    assert not bad, bad
    # the stored vertices are the same floats, the faces the same triangles
    np.testing.assert_array_equal(np.asarray(model.mesh_vert), mjm.mesh_vert)
    np.testing.assert_array_equal(np.asarray(model.mesh_face), mjm.mesh_face)
    assert "body_mass" in matched and "mesh_vert" in matched


@pytest.mark.parametrize("builtin,params,message", [
    ("sphere", "5", "Sphere subdivision cannot be greater than 4"),
    ("sphere", "1 2", "Sphere mesh type requires 1 parameter"),
    ("hemisphere", "-1", "Hemisphere resolution cannot be negative"),
    ("supersphere", "2 1 1", "Supersphere resolution must be greater than 2"),
    ("supertorus", "8 1.5 1 1", "Supertorus radius must be in (0, 1]"),
    ("wedge", "4 3 200 45 0", "fov[0] must be a float between (0, 180] degrees"),
    ("wedge", "4 3 60 45", "Wedge builtin mesh types require 5 parameters"),
    ("plate", "0 3", "Horizontal and vertical resolutions must be positive"),
])
def test_builtin_mesh_errors(builtin, params, message):
    xml = _scene([(builtin, params)])
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(MJCFError) as err:
        simjax.load_model(xml)
    assert message in str(err.value)


def test_colliding_plate_rejected_as_in_mujoco():
    xml = _scene([("plate", "2 2")]).replace(' contype="0" conaffinity="0"', "")
    with pytest.raises(ValueError, match="coplanar vertices"):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(MJCFError, match="coplanar vertices"):
        simjax.load_model(xml)


def test_plate_inertia_rejected_as_in_mujoco():
    """A 3 x 4 plate is a shell whose principal moments break the triangle inequality
    in MuJoCo 4.0.0 too."""
    xml = _scene([("plate", "3 4")])
    with pytest.raises(ValueError, match="inertia must satisfy A"):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(MJCFError, match="inertia must satisfy A"):
        simjax.load_model(xml)


def test_tactile_on_builtin_wedge():
    """The wedge's vertices carry tangent frames (three normals each), which the
    tactile sensor's tangent channels read: Model.mesh_frame holds MuJoCo's."""
    from simjax import types
    xml = """<mujoco><asset><mesh name="w" builtin="wedge" params="3 3 60 45 0"/></asset>
      <worldbody><body><freejoint/><geom name="g" type="sphere" size=".1"/>
      <geom type="mesh" mesh="w" contype="0" conaffinity="0"/></body></worldbody>
      <sensor><tactile mesh="w" geom="g"/></sensor></mujoco>"""
    mjm = mujoco.MjModel.from_xml_string(xml)
    m = simjax.load_model(xml)
    ref = types.mesh_frames(mjm.mesh_vertnum, mjm.mesh_normaladr, mjm.mesh_normalnum,
                            mjm.mesh_normal)
    assert m.nmeshframe == 9
    np.testing.assert_array_equal(np.asarray(m.mesh_frame), ref["mesh_frame"])
