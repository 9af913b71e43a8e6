"""Sensors (simjax.engine.sensor) against mujoco.mj_forward's sensordata, float64.

Every comparison runs 10 random states per model and asserts, per sensor type, the
largest error relative to max(1, |value|) is below 1e-6 (the values agree to ~1e-14;
1e-6 leaves room for trigonometric round-off in long kinematic chains).
"""
import os

import mujoco
import numpy as np
import pytest

from mujoco_oracle import corpus_path
from sensor_helpers import SENSOR_MODELS, assert_sensors_match, oracle
from simjax.errors import UnsupportedFeatureError

S = mujoco.mjtSensor
O = mujoco.mjtObj

MJX_SENSOR_TYPES = {
    "accelerometer", "actuatorfrc", "actuatorpos", "actuatorvel", "ballangvel", "ballquat",
    "camprojection", "clock", "force", "frameangacc", "frameangvel", "framelinacc",
    "framelinvel", "framepos", "framequat", "framexaxis", "frameyaxis", "framezaxis",
    "gyro", "jointactfrc", "jointpos", "jointvel", "magnetometer", "rangefinder",
    "subtreeangmom", "subtreecom", "subtreelinvel", "tendonpos", "tendonvel", "torque",
    "touch", "velocimeter"}


def _spatial_tendons_supported(m):
    import jax
    from simjax.engine import fwd_position, make_data
    try:
        jax.eval_shape(fwd_position, m, make_data(m))
    except UnsupportedFeatureError:
        return False
    return True


def test_mjx_sensor_model_without_spatial_tendon():
    """mjx sensor.xml (75 sensors, 32 types) with its spatial tendon and the two
    sensors on it removed."""
    spec = mujoco.MjSpec.from_file(corpus_path("mjx_sensor/sensor.xml"))
    for s in list(spec.sensors):
        if s.objname == "spatial":
            spec.delete(s)
    spec.delete(spec.tendon("spatial"))
    mjm, m = oracle(spec.compile())
    worst = assert_sensors_match(mjm, m)
    assert set(worst) == MJX_SENSOR_TYPES


def test_mjx_sensor_model_full():
    mjm, m = oracle(mujoco.MjModel.from_xml_path(corpus_path("mjx_sensor/sensor.xml")))
    if not _spatial_tendons_supported(m):
        pytest.skip("spatial tendons are not implemented by smooth.tendon yet")
    assert set(assert_sensors_match(mjm, m)) == MJX_SENSOR_TYPES


@pytest.mark.slow
@pytest.mark.parametrize("rel", ["mjx_barkour_v0/assets/barkour_v0_mjx.xml",
                                 "mujoco_car/car.xml",
                                 "mjx_actuator_tendon_force_clamp/tendon_force_clamp.xml"])
def test_corpus_sensor_models(rel):
    mjm, m = oracle(mujoco.MjModel.from_xml_path(corpus_path(rel)))
    if not _spatial_tendons_supported(m):
        pytest.skip("spatial tendons are not implemented by smooth.tendon yet")
    assert_sensors_match(mjm, m)


def _add(spec, type_, objtype, objname, reftype=None, refname=None, **kw):
    s = spec.add_sensor(type=type_, objtype=objtype, objname=objname, **kw)
    if reftype is not None:
        s.reftype, s.refname = reftype, refname
    return s


def _instrument(spec):
    """Add frame, joint, actuator, tendon, site and subtree sensors to a corpus model."""
    bodies = [b.name for b in spec.bodies[1:] if b.name]
    sites = [s.name for s in spec.sites if s.name][:4]
    geoms = [g.name for g in spec.geoms if g.name][:3]
    frames = [(O.mjOBJ_XBODY, b) for b in bodies[::max(1, len(bodies) // 4)]]
    frames += [(O.mjOBJ_BODY, bodies[-1])] + [(O.mjOBJ_SITE, s) for s in sites]
    frames += [(O.mjOBJ_GEOM, g) for g in geoms]
    refs = [(None, None), (O.mjOBJ_XBODY, bodies[0]), (O.mjOBJ_BODY, bodies[len(bodies) // 2])]
    kinds = (S.mjSENS_FRAMEPOS, S.mjSENS_FRAMEQUAT, S.mjSENS_FRAMEXAXIS, S.mjSENS_FRAMEYAXIS,
             S.mjSENS_FRAMEZAXIS, S.mjSENS_FRAMELINVEL, S.mjSENS_FRAMEANGVEL)
    for k, (ot, on) in enumerate(frames):
        rt, rn = refs[k % len(refs)]
        for t in kinds:
            _add(spec, t, ot, on, rt, rn)
        _add(spec, S.mjSENS_FRAMELINACC, ot, on)
        _add(spec, S.mjSENS_FRAMEANGACC, ot, on)
    for s in sites:
        for t in (S.mjSENS_VELOCIMETER, S.mjSENS_GYRO, S.mjSENS_ACCELEROMETER, S.mjSENS_FORCE,
                  S.mjSENS_TORQUE, S.mjSENS_MAGNETOMETER):
            _add(spec, t, O.mjOBJ_SITE, s)
    for j in spec.joints:
        if not j.name:
            continue
        if j.type in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE):
            for t in (S.mjSENS_JOINTPOS, S.mjSENS_JOINTVEL, S.mjSENS_JOINTACTFRC):
                _add(spec, t, O.mjOBJ_JOINT, j.name)
        elif j.type == mujoco.mjtJoint.mjJNT_BALL:
            for t in (S.mjSENS_BALLQUAT, S.mjSENS_BALLANGVEL):
                _add(spec, t, O.mjOBJ_JOINT, j.name)
    for a in spec.actuators:
        if a.name:
            for t in (S.mjSENS_ACTUATORPOS, S.mjSENS_ACTUATORVEL, S.mjSENS_ACTUATORFRC):
                _add(spec, t, O.mjOBJ_ACTUATOR, a.name)
    for t_ in spec.tendons:
        if t_.name:
            for t in (S.mjSENS_TENDONPOS, S.mjSENS_TENDONVEL, S.mjSENS_TENDONACTFRC):
                _add(spec, t, O.mjOBJ_TENDON, t_.name)
    for b in (bodies[0], bodies[-1]):
        for t in (S.mjSENS_SUBTREECOM, S.mjSENS_SUBTREELINVEL, S.mjSENS_SUBTREEANGMOM):
            _add(spec, t, O.mjOBJ_BODY, b)
    _add(spec, S.mjSENS_E_POTENTIAL, O.mjOBJ_UNKNOWN, "")
    _add(spec, S.mjSENS_E_KINETIC, O.mjOBJ_UNKNOWN, "")
    _add(spec, S.mjSENS_CLOCK, O.mjOBJ_UNKNOWN, "")
    return spec


@pytest.mark.slow
@pytest.mark.parametrize("rel", ["mjx_shadow_hand/right_hand.xml",
                                 "menagerie_trossen_wx250s/wx250s.xml",
                                 "mjx_pendula/pendula.xml", "mujoco_car/car.xml",
                                 "mujoco_humanoid/humanoid.xml"])
def test_corpus_models_with_added_sensors(rel):
    spec = _instrument(mujoco.MjSpec.from_file(corpus_path(rel)))
    mjm, m = oracle(spec.compile())
    assert mjm.nsensor > 20
    assert_sensors_match(mjm, m)


RAYS_TYPES = {
    "rangefinder", "insidesite", "geomdist", "geomnormal", "geomfromto", "e_potential",
    "e_kinetic", "clock", "jointlimitpos", "jointlimitvel", "jointlimitfrc",
    "tendonlimitpos", "tendonlimitvel", "tendonlimitfrc", "tendonactfrc", "tendonpos",
    "tendonvel", "framepos", "framequat", "framexaxis", "frameyaxis", "framezaxis",
    "framelinvel", "frameangvel", "framelinacc", "frameangacc", "subtreecom",
    "subtreelinvel", "subtreeangmom", "accelerometer", "force", "torque", "ballquat",
    "ballangvel", "velocimeter", "gyro", "magnetometer", "camprojection"}


@pytest.mark.parametrize("energy", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_rays_model(energy):
    """Site and camera rangefinders (perspective, intrinsics, orthographic; every data
    field) on all primitive geoms and a mesh, invisible geoms/materials, inside-site,
    geom distances, energies, clock, frame sensors of every object and reference type,
    limit sensors (zero without constraints, as MuJoCo), cutoffs, static and mocap
    bodies."""
    mjm = mujoco.MjModel.from_xml_path(os.path.join(SENSOR_MODELS, "rays.xml"))
    if not energy:
        mjm.opt.enableflags &= ~int(mujoco.mjtEnableBit.mjENBL_ENERGY)
    mjm, m = oracle(mjm)
    worst = assert_sensors_match(mjm, m)
    assert set(worst) == RAYS_TYPES


@pytest.mark.slow                      # ~22 s (eager rays)
def test_rangefinder_hits_every_geom_type():
    """The rays model's camera rangefinders really see each target geom type."""
    import jax
    from simjax.engine import make_data, ray
    mjm, m = oracle(mujoco.MjModel.from_xml_path(os.path.join(SENSOR_MODELS, "rays.xml")))
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    from simjax.engine import fwd_position
    d = jax.jit(fwd_position)(m, make_data(m))
    # a fan of rays from above the targets, towards each geom centre
    targets = [mjm.geom(n).id for n in ("t_sphere", "t_capsule", "t_ellipsoid", "t_cylinder",
                                       "t_box", "t_mesh", "floor")]
    pnt = np.tile([0.05, 0.02, 1.5], (len(targets), 1))
    vec = mjd.geom_xpos[targets] - pnt
    dist, gid, normal = ray.ray(m, d, jax.numpy.asarray(pnt), jax.numpy.asarray(vec),
                                np.full(len(targets), -1))
    for k, g in enumerate(targets):
        geomid = np.array([-1], np.int32)
        nrm = np.zeros(3)
        ref = mujoco.mj_ray(mjm, mjd, pnt[k], vec[k], None, 1, -1, geomid, nrm)
        assert ref >= 0 and int(gid[k]) == geomid[0]
        np.testing.assert_allclose(float(dist[k]), ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(normal[k]), nrm, atol=1e-12)


# --------------------------------------------------------------------------- errors
def _xml(sensor, extra=""):
    return f"""<mujoco><worldbody><body><joint name="j" type="hinge"/><geom size=".1"/>
      <site name="s"/></body>{extra}</worldbody><sensor>{sensor}</sensor></mujoco>"""


USER_SENSORS = ('<user name="u1" dim="3" needstage="vel" datatype="positive" objtype="joint" '
                'objname="j" cutoff="1"/><jointpos joint="j"/><user dim="2"/>'
                '<user dim="1" objtype="site" objname="s" needstage="pos"/>'
                '<user dim="1" needstage="none"/>')


def test_user_sensors():
    """Without an mjcb_sensor callback MuJoCo zeroes user sensors at their stage (pos,
    vel, acc) and never writes those of stage none; simjax's compiler reproduces their
    layout. Checked after mj_forward and mj_step from sensordata filled with 7."""
    import simjax
    from simjax.engine import forward, make_data, step
    xml = _xml(USER_SENSORS)
    mjm, m = oracle(mujoco.MjModel.from_xml_string(xml))
    ours = simjax.load_model(xml)
    for f in ("sensor_type", "sensor_objtype", "sensor_objid", "sensor_needstage",
              "sensor_datatype", "sensor_dim", "sensor_adr", "sensor_cutoff"):
        np.testing.assert_array_equal(np.asarray(getattr(ours, f)).reshape(-1),
                                      getattr(mjm, f).reshape(-1), err_msg=f)
    mjd = mujoco.MjData(mjm)
    for fn, mjfn in ((forward, mujoco.mj_forward), (step, mujoco.mj_step)):
        mjd.qpos[:] = 0.3
        mjd.sensordata[:] = 7.0
        mjfn(mjm, mjd)
        d = make_data(m)
        d = d.replace(qpos=d.qpos + 0.3, sensordata=d.sensordata + 7.0)
        np.testing.assert_allclose(np.asarray(fn(m, d).sensordata), mjd.sensordata,
                                   rtol=0, atol=1e-12)
    assert mjd.sensordata[-1] == 7.0 and not np.any(mjd.sensordata[:3])


def test_disabled_sensors_leave_sensordata():
    from simjax.engine import forward, make_data
    mjm = mujoco.MjModel.from_xml_string(_xml('<jointpos joint="j"/>'))
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_SENSOR
    mjm, m = oracle(mjm)
    d = make_data(m)
    d = d.replace(qpos=d.qpos + 0.3, sensordata=d.sensordata + 7.0)
    np.testing.assert_array_equal(np.asarray(forward(m, d).sensordata), [7.0])


def test_compiler_sensor_and_material_fields():
    """simjax's compiler produces MuJoCo's sensor layout (rangefinder data/cameras,
    inside-site, geom distances, e_kinetic at the position stage) and the rgba/material
    fields ray casting uses."""
    import simjax
    for path in (os.path.join(SENSOR_MODELS, "rays.xml"), corpus_path("mjx_sensor/sensor.xml")):
        m = simjax.load_model(path)
        ref = mujoco.MjModel.from_xml_path(path)
        assert m.nmat == ref.nmat and m.nsensordata == ref.nsensordata
        for f in ("sensor_type", "sensor_datatype", "sensor_needstage", "sensor_objtype",
                  "sensor_objid", "sensor_reftype", "sensor_refid", "sensor_intprm",
                  "sensor_dim", "sensor_adr", "geom_matid"):
            ours = np.asarray(getattr(m, f)).reshape(np.shape(getattr(ref, f)))
            np.testing.assert_array_equal(ours, getattr(ref, f), err_msg=f)
        for f in ("geom_rgba", "mat_rgba", "sensor_cutoff"):
            ours = np.asarray(getattr(m, f)).reshape(np.shape(getattr(ref, f)))
            np.testing.assert_allclose(ours, getattr(ref, f), rtol=1e-7, err_msg=f)


def test_cutoff_constant_and_traced_model():
    """sensor_cutoff gives the same sensordata with the model a constant of the program
    (bounds made in NumPy) as with the model traced (bounds in the program)."""
    import jax
    from simjax.engine import forward, make_data
    mjm = mujoco.MjModel.from_xml_path(os.path.join(SENSOR_MODELS, "rays.xml"))
    mjm, m = oracle(mjm)
    d = make_data(m)
    d = d.replace(qpos=d.qpos + 0.1)
    traced = jax.jit(forward)(m, d).sensordata
    const = jax.jit(lambda d: forward(m, d))(d).sensordata
    np.testing.assert_allclose(np.asarray(const), np.asarray(traced), rtol=1e-12, atol=1e-12)
    # the cutoffs bind in this state
    free = m.replace(sensor_cutoff=np.zeros_like(np.asarray(m.sensor_cutoff)))
    assert np.any(np.asarray(jax.jit(lambda d: forward(free, d))(d).sensordata) != const)
