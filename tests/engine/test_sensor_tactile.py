"""Tactile sensor (MuJoCo 4.0 mjSENS_TACTILE) compiled by simjax and evaluated against
MuJoCo 4.0.0 (float64): a pad mesh on a free body touching a sphere, a capsule and a box;
sensor fields match, and sensordata agrees to 1e-12 at poses with several penetrating
taxels (depth channel; the tangent channels are zero for meshes with one normal per
vertex in both). Meshes with three normals per vertex: their stored frames, and all
three channels on a rolling wedge and a sliding plate."""
import jax
import mujoco
import numpy as np
import pytest

import simjax

XML = """<mujoco><option timestep="0.002"/>
<asset><mesh name="pad" vertex="-.1 -.1 -.05  .1 -.1 -.05  -.1 .1 -.05  .1 .1 -.05  0 0 -.06
  .05 .05 -.055  -.05 .05 -.055  0 0 0.02"/></asset>
<worldbody>
  <geom name="ball" type="sphere" size=".2" pos="0 0 -.19"/>
  <geom name="cap" type="capsule" size=".05" fromto=".1 -.2 -.02 .1 .2 -.02"/>
  <geom name="blk" type="box" size=".05 .05 .03" pos="-.1 .1 -.02" euler="0 0 20"/>
  <body name="b" pos="0 0 0.05"><freejoint/>
    <geom name="body" type="sphere" size=".06" pos="0 0 -.01" mass="1"/>
    <geom type="capsule" size=".03" fromto="-.08 .08 -.05 .08 -.08 -.05" mass=".2"/>
    <geom name="tac" type="mesh" mesh="pad" contype="0" conaffinity="0" mass="0"/>
  </body>
</worldbody>
<sensor><tactile name="t" geom="tac" mesh="pad"/></sensor></mujoco>"""


HFIELD = ('<asset><hfield name="h" nrow="3" ncol="3" size="1 1 .1 .1" '
          'elevation="0 1 0 1 0 1 0 1 0"/></asset>')


def test_height_fields():
    """A height field the sensor's body cannot touch is ignored (MuJoCo never measures
    it); one it can touch raises (MuJoCo stops with an error when they touch)."""
    from simjax.engine import forward, make_data
    far = XML.replace("<worldbody>", HFIELD + '<worldbody><geom type="hfield" hfield="h" '
                      'pos="5 5 0" contype="2" conaffinity="2"/>')
    test_tactile_against_mujoco(far)
    near = XML.replace("<worldbody>", HFIELD + '<worldbody><geom type="hfield" hfield="h" '
                       'pos="5 5 0"/>')
    m = simjax.load_model(near)
    with pytest.raises(simjax.UnsupportedFeatureError, match="height field"):
        jax.eval_shape(forward, m, make_data(m))


def test_tactile_against_mujoco(xml=XML):
    mjm = mujoco.MjModel.from_xml_string(xml)
    m = simjax.load_model(xml)
    for f in ("sensor_type", "sensor_dim", "sensor_objtype", "sensor_objid", "sensor_reftype",
              "sensor_refid", "sensor_needstage", "sensor_datatype", "sensor_adr"):
        np.testing.assert_array_equal(np.asarray(getattr(m, f)), getattr(mjm, f), err_msg=f)
    # the stages the sensor needs (positions with collisions, velocities), without the
    # constraint solver: a much smaller program to compile
    from simjax.engine.forward import fwd_position, fwd_velocity
    from simjax.engine.sensor import sensor_vel
    fwd = jax.jit(lambda m, d: sensor_vel(m, fwd_velocity(m, fwd_position(m, d))))
    mjd = mujoco.MjData(mjm)
    rng = np.random.default_rng(0)
    hits = 0
    for k in range(5):
        mjd.qpos[:3] = [0.01 * k, -0.01 * k, 0.04 - 0.003 * k]
        q = rng.normal(size=4) * [1, 0.05, 0.05, 0.05] + [3, 0, 0, 0]
        mjd.qpos[3:] = q / np.linalg.norm(q)
        mjd.qvel[:] = rng.normal(size=6)
        mujoco.mj_forward(mjm, mjd)
        d = simjax.make_data(m).replace(qpos=jax.numpy.asarray(mjd.qpos),
                                        qvel=jax.numpy.asarray(mjd.qvel))
        d = fwd(m, d)
        np.testing.assert_allclose(np.asarray(d.sensordata), mjd.sensordata, atol=1e-12)
        hits += int(np.sum(mjd.sensordata > 0))
    assert hits >= 10          # the poses do press taxels into the geoms


FRAMES_XML = """<mujoco><option timestep="0.002"/>
<asset>
  <mesh name="dome" builtin="wedge" params="9 7 45 40 0.3" scale=".2 .2 .2"
        refquat="0.9 0.1 0.2 -0.1"/>
  <mesh name="pad" builtin="plate" params="8 6" scale=".15 .1 .05"/>
  <mesh name="user" vertex="0 0 0  1 0 0  0 1 0  0 0 1" refquat="1 0.3 0 0" scale="1 2 1"
        normal="{normals}"/>
</asset>
<worldbody>
  <geom name="floor" type="plane" size="2 2 .1"/>
  <geom name="step" type="box" size=".1 .1 .05" pos=".6 0 .05" euler="0 0 25"/>
  <body name="ball" pos="0 0 .25">
    <freejoint/>
    <geom type="sphere" size=".2" mass=".5"/>
    <geom name="dome" type="mesh" mesh="dome" contype="0" conaffinity="0" mass="0"/>
  </body>
  <body name="finger" pos=".6 0 .2">
    <freejoint/>
    <geom type="box" size=".15 .1 .05" mass=".2"/>
    <geom name="pad" type="mesh" mesh="pad" contype="0" conaffinity="0" mass="0"/>
    <geom name="u" type="mesh" mesh="user" contype="0" conaffinity="0" mass="0"
          pos="0 0 .3"/>
  </body>
</worldbody>
<sensor><tactile geom="dome" mesh="dome"/><tactile geom="pad" mesh="pad"/>
  <tactile geom="u" mesh="user"/></sensor></mujoco>"""


def _frames_xml():
    rng = np.random.default_rng(3)
    normals = rng.normal(size=(4, 3, 3))        # not unit: the compiler normalises
    return FRAMES_XML.format(normals=" ".join(f"{x:.6f}" for x in normals.ravel()))


def test_tangent_frames_compile_as_mujoco():
    """Meshes with three normals per vertex (builtin wedge and plate, a user mesh with
    refquat, scale and non-unit normals) keep MuJoCo's stored normals bit for bit."""
    from simjax import types
    xml = _frames_xml()
    mjm = mujoco.MjModel.from_xml_string(xml)
    m = simjax.load_model(xml)
    ref = types.mesh_frames(mjm.mesh_vertnum, mjm.mesh_normaladr, mjm.mesh_normalnum,
                            mjm.mesh_normal)
    assert m.nmeshframe == ref["nmeshframe"] == 63 + 48 + 4
    np.testing.assert_array_equal(np.asarray(m.mesh_frameadr), ref["mesh_frameadr"])
    np.testing.assert_array_equal(np.asarray(m.mesh_frame), ref["mesh_frame"])


def test_tactile_tangent_channels():
    """Sliding taxels of a wedge on a rolling ball (against the floor) and a plate on a
    box finger (against the floor and a step): all three channels at states of a
    MuJoCo simulation, to 1e-12 (seen 2e-15 on MuJoCo's own tactile model)."""
    from simjax.engine.forward import fwd_position, fwd_velocity
    from simjax.engine.sensor import sensor_vel
    xml = _frames_xml()
    mjm = mujoco.MjModel.from_xml_string(xml)
    m = simjax.load_model(xml)
    fwd = jax.jit(lambda m, d: sensor_vel(m, fwd_velocity(m, fwd_position(m, d))))
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:6] = [1.0, 0.3, 0, 0, 0, 2.0]
    mjd.qvel[6:] = [-0.5, 0.2, 0, 0.5, 0, 1.0]
    n = mjm.mesh_vertnum
    slide = 0
    for step in range(400):
        mujoco.mj_step(mjm, mjd)
        if step % 40 != 39:
            continue
        mujoco.mj_forward(mjm, mjd)
        d = simjax.make_data(m).replace(qpos=jax.numpy.asarray(mjd.qpos),
                                        qvel=jax.numpy.asarray(mjd.qvel))
        d = fwd(m, d)
        np.testing.assert_allclose(np.asarray(d.sensordata), mjd.sensordata, rtol=0,
                                   atol=1e-12)
        tang = [mjd.sensordata[a + k:a + 3 * k] for a, k in
                zip(mjm.sensor_adr, n[mjm.sensor_objid])]
        slide += sum(int(np.sum(t > 1e-6)) for t in tang[:2])
    assert slide > 50          # both tactile meshes really slide on something
