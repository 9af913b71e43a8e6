"""Actuator and sensor delays / history buffers (Data.history) against MuJoCo 4.0.

A small model with delayed actuators (zero-order hold, linear and cubic interpolation,
one delay that is not a multiple of the timestep, a pid actuator with two controls), a
buffered actuator without delay,
and sensors of the three stages with delays, intervals (with and without phase) and
plain history buffers. Over a trajectory with random controls, qpos, qvel, act,
sensordata and the whole history array follow mujoco.mj_step (float64, 1e-10
relative to max(1, |value|); measured ~1e-15) with the Euler, implicitfast and RK4
integrators. Also: the reset buffers, keyframe resets, vmap and jax.grad through the
delayed control path.
"""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import rel_err
from mujoco_oracle import model_from_mujoco
import simjax
from simjax.engine import forward, make_data, reset_keyframe, step

TOL = 1e-10
NSTEP = 25

XML = """
<mujoco>
  <option timestep="0.01" integrator="{integrator}">
    <flag contact="disable"/>  <!-- no contact here; keeps the compiled step small -->
  </option>
  <worldbody>
    <body name="b1" pos="0 0 1">
      <joint name="j1" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 .3 0 0" size=".05" mass="1"/>
      <site name="s1" pos=".3 0 0"/>
      <body name="b2" pos=".3 0 0">
        <joint name="j2" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 .3 0 0" size=".05" mass=".5"/>
        <site name="s2" pos=".3 0 0"/>
      </body>
    </body>
    <body name="b3" pos="1 0 1">
      <joint name="j3" type="slide" axis="1 0 0"/>
      <geom type="box" size=".1 .1 .1" mass="1"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="j1" nsample="4" delay="0.025" interp="linear" ctrlrange="-1 1"/>
    <motor joint="j2" nsample="3" delay="0.02" interp="zoh"/>
    <position name="servo" joint="j3" kp="20" nsample="6" delay="0.03" interp="cubic"/>
    <motor joint="j3" nsample="2"/>
    <general joint="j2" dyntype="filter" dynprm=".05" nsample="5" delay="0.013"
             interp="cubic"/>
    <!-- two controls (target position and velocity): a sample holds both -->
    <pid joint="j1" kp="5" kv=".5" input="pos vel" nsample="4" delay="0.02"
         interp="linear"/>
  </actuator>
  <sensor>
    <jointpos joint="j1" nsample="5" delay="0.02" interp="cubic"/>
    <framepos objtype="site" objname="s2" nsample="2" interval="0.03 -0.01"/>
    <jointvel joint="j2" nsample="2"/>
    <velocimeter site="s1" nsample="4" delay="0.015" interp="linear"/>
    <accelerometer site="s2" nsample="3" delay="0.01" interval="0.02"/>
    <actuatorfrc actuator="servo" nsample="3" interval="0.04 -0.02" cutoff="3"/>
    <jointpos joint="j3"/>
    <framelinacc objtype="site" objname="s1" nsample="3" delay="0.02" interp="linear"/>
  </sensor>
  <keyframe><key time="0.5" qpos="0.3 -0.2 0.1" ctrl="0.5 0.1 0.2 0 0.4 .1 -.2" act="0.2"/>
  </keyframe>
</mujoco>
"""


def _models(integrator="Euler"):
    mjm = mujoco.MjModel.from_xml_string(XML.format(integrator=integrator))
    return mjm, model_from_mujoco(mjm)


def _check(d, mjd):
    for f in ("qpos", "qvel", "act", "sensordata", "history", "time"):
        err = rel_err(np.asarray(getattr(d, f)), getattr(mjd, f))
        assert err < TOL, (f, np.asarray(getattr(d, f)), getattr(mjd, f))


@pytest.fixture(scope="module")
def jstep():
    return jax.jit(step)


def test_reset_buffers():
    mjm, m = _models()
    mjd = mujoco.MjData(mjm)
    assert mjm.nhistory > 0
    np.testing.assert_array_equal(np.asarray(make_data(m).history), mjd.history)
    mujoco.mj_resetDataKeyframe(mjm, mjd, 0)
    d = reset_keyframe(m, make_data(m), 0)
    np.testing.assert_array_equal(np.asarray(d.history), mjd.history)
    assert float(d.time) == mjd.time


HISTORY_FIELDS = ("actuator_history", "actuator_historyadr", "actuator_delay",
                  "sensor_history", "sensor_historyadr", "sensor_delay", "sensor_interval")


def test_compiled_by_simjax():
    """simjax.load_model lays out the buffers as MuJoCo's compiler does."""
    mjm = mujoco.MjModel.from_xml_string(XML.format(integrator="Euler"))
    m = simjax.load_model(XML.format(integrator="Euler"))
    assert m.nhistory == mjm.nhistory
    for f in HISTORY_FIELDS:
        ref = np.asarray(getattr(mjm, f))
        np.testing.assert_allclose(np.asarray(getattr(m, f)).reshape(ref.shape), ref,
                                   rtol=0, atol=1e-15, err_msg=f)


@pytest.mark.slow                      # a second compile of step (~20 s)
def test_compiled_by_simjax_steps(jstep):
    """The model simjax compiles steps like MuJoCo's."""
    mjm = mujoco.MjModel.from_xml_string(XML.format(integrator="Euler"))
    m = simjax.load_model(XML.format(integrator="Euler"))
    mjd, d = mujoco.MjData(mjm), make_data(m)
    for k in range(6):
        ctrl = np.cos(np.arange(mjm.nu) + k)
        mjd.ctrl[:] = ctrl
        # a fresh array: jnp.asarray may alias mjd.ctrl's memory, which the next
        # iteration overwrites while the asynchronously dispatched step still reads it
        d = jstep(m, d.replace(ctrl=jnp.array(ctrl)))
        mujoco.mj_step(mjm, mjd)
    _check(d, mjd)


@pytest.mark.parametrize("act, sens, message", [
    ('<motor joint="j" delay="0.01"/>', "", "delay > 0 without a history buffer"),
    ("", '<jointpos joint="j" delay=".01"/>', "delay > 0 without a history buffer"),
    ("", '<jointpos joint="j" interval="-.01"/>', "negative interval"),
    ("", '<jointpos joint="j" interval=".01 .005"/>', "positive phase"),
    ("", '<jointpos joint="j" interval=".01 -.01"/>', "phase must be greater than -period"),
])
def test_compile_errors(act, sens, message):
    """Invalid buffer settings are rejected with MuJoCo's messages, at the element."""
    xml = ('<mujoco><worldbody><body><joint name="j"/><geom size=".1"/></body>'
           f'</worldbody><actuator>{act}</actuator><sensor>{sens}</sensor></mujoco>')
    with pytest.raises(ValueError):
        mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(simjax.MJCFError, match=message) as err:
        simjax.load_model(xml)
    assert "line 1" in str(err.value)


@pytest.mark.parametrize("integrator", [
    "Euler", pytest.param("implicitfast", marks=pytest.mark.slow),
    pytest.param("RK4", marks=pytest.mark.slow)])
def test_trajectory(integrator, jstep):
    mjm, m = _models(integrator)
    mjd = mujoco.MjData(mjm)
    d = make_data(m)
    rng = np.random.default_rng(1)
    for _ in range(NSTEP):
        ctrl = rng.uniform(-1.5, 1.5, mjm.nu)
        mjd.ctrl[:] = ctrl
        d = jstep(m, d.replace(ctrl=jnp.asarray(ctrl)))
        mujoco.mj_step(mjm, mjd)
        _check(d, mjd)
    # forward alone reads the buffers the same way (and leaves them untouched)
    mujoco.mj_forward(mjm, mjd)
    d = jax.jit(forward)(m, d)
    _check(d, mjd)


def test_keyframe_start_off_grid(jstep):
    """Start at keyframe time 0.5 (buffer times are relative to reset, so every read
    extrapolates first) and insert at times not on the buffer grid."""
    mjm, m = _models()
    mjd = mujoco.MjData(mjm)
    mujoco.mj_resetDataKeyframe(mjm, mjd, 0)
    d = reset_keyframe(m, make_data(m), 0)
    for k in range(8):
        mjd.ctrl[:] = np.sin(np.arange(mjm.nu) + k)
        d = jstep(m, d.replace(ctrl=jnp.array(mjd.ctrl)))
        mujoco.mj_step(mjm, mjd)
        _check(d, mjd)


@pytest.mark.slow                      # compiles vmap and grad of a 3-step scan
def test_vmap_and_grad(jstep):
    """Batched worlds with different controls follow MuJoCo; d(qvel after 3 steps) /
    d(ctrl of the delayed, linearly interpolated actuator) against a central
    difference (the delayed control reaches the dynamics only through the buffer)."""
    mjm, m = _models()
    d0 = make_data(m)

    def run(u):
        def body(d, _):
            return step(m, d.replace(ctrl=u)), None
        return jax.lax.scan(body, d0, None, length=3)[0].qvel

    us = jnp.asarray(np.random.default_rng(0).uniform(-0.5, 0.5, (2, mjm.nu)))
    batched = jax.jit(jax.vmap(run))(us)
    for b in range(2):
        mjd = mujoco.MjData(mjm)
        mjd.ctrl[:] = np.asarray(us[b])
        for _ in range(3):
            mujoco.mj_step(mjm, mjd)
        assert rel_err(batched[b], mjd.qvel) < TOL
    grad = jax.jit(jax.grad(lambda x: run(us[0].at[0].set(x))[0]))(us[0, 0])
    eps = 1e-6
    f = jax.jit(lambda x: run(us[0].at[0].set(x))[0])
    num = (f(us[0, 0] + eps) - f(us[0, 0] - eps)) / (2 * eps)
    assert abs(float(grad)) > 0
    np.testing.assert_allclose(float(grad), float(num), rtol=1e-5, atol=1e-9)
