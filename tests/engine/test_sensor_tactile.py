"""Tactile sensor (MuJoCo 4.0 mjSENS_TACTILE) compiled by simjax and evaluated against
MuJoCo 4.0.0 (float64): a pad mesh on a free body touching a sphere, a capsule and a box;
sensor fields match, and sensordata agrees to 1e-12 at poses with several penetrating
taxels (depth channel; the tangent channels are zero for meshes with one normal per
vertex in both)."""
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


def test_tactile_against_mujoco():
    mjm = mujoco.MjModel.from_xml_string(XML)
    m = simjax.load_model(XML)
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


def test_tactile_tangent_frames_are_named():
    """Three normals per vertex give MuJoCo's tangent channels: simjax names them."""
    v = "0 0 0  1 0 0  0 1 0  0 0 1"
    xml = (f'<mujoco><asset><mesh name="m" vertex="{v}" normal="{" ".join(["0 0 1"] * 12)}"/>'
           '</asset><worldbody><geom name="g" type="mesh" mesh="m"/></worldbody>'
           '<sensor><tactile geom="g" mesh="m"/></sensor></mujoco>')
    assert mujoco.MjModel.from_xml_string(xml).mesh_normalnum[0] == 12
    with pytest.raises(simjax.UnsupportedFeatureError, match="tactile"):
        simjax.load_model(xml)
