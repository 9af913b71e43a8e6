"""Servo-family actuators of MuJoCo 4.0 against the oracle (float64): pid (inputs
pos/vel/ff, slew-rate and integral states with anti-windup, wrapped setpoints on ball
joints) and the geodesic orientation servo (so3 gain/bias/transmission on ball joints
and site + refsite, expmap and quaternion charts, the integrator variant with actearly
and its re-anchoring, norm force clamping), plus servos on rotational site transmissions,
and DC motors (voltage, stateless and with inductance, nominal-point and Kt/Ke
constants, saturation, cogging, thermal and LuGre states, the on-board controller with
slew, integral and Vmax, passive input "none"; implicitfast uses MuJoCo 4.0's DC-motor
velocity derivatives including their saturation rules).

Ten random states: actuator_length, actuator_velocity, dense actuator_moment,
actuator_force, act_dot, qfrc_actuator, qacc and actuator sensors (one value per output)
agree to ~1e-14 (tolerance 1e-9); 20-step
trajectories (Euler and implicitfast, which adds the actuators' velocity derivatives)
agree to ~1e-13 (tolerance 1e-8). Models go through model_from_mujoco, and separately
through simjax's own compiler (fields and a 30-step trajectory against MuJoCo).
"""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from engine_helpers import random_state, rel_err, set_state, to_data
from mujoco_oracle import model_from_mujoco
from simjax.engine import forward, make_data, step

PID = """<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <body><joint name="h1" type="hinge" axis="0 1 0" range="-1 1"/><geom type="capsule" size=".05" fromto="0 0 0 .3 0 0" mass="1"/>
      <body pos=".3 0 0"><joint name="h2" type="hinge" axis="0 1 0"/><geom type="capsule" size=".05" fromto="0 0 0 .3 0 0" mass="1"/>
        <body pos=".3 0 0"><joint name="s1" type="slide" axis="1 0 0"/><geom size=".05" mass=".5"/>
          <body pos=".1 0 0"><joint name="b1" type="ball"/><geom type="box" size=".05 .1 .02" mass=".3"/></body>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <pid joint="h1" kp="20" kv="2"/>
    <pid joint="h2" kp="10" kv="1" ki="5" imax="0.3" input="pos"/>
    <pid joint="s1" kp="30" kv="3" ki="2" slewmax="0.5" input="pos vel ff"/>
    <pid joint="h2" kp="5" kv="1" input="vel ff"/>
    <pid joint="b1" kp="3" kv=".2" gear="0 0 1" ki="1" slewmax="2"/>
    <pid joint="h1" kp="4" input="ff" ctrlrange="-1 1" ctrllimited="true"/>
  </actuator>
</mujoco>
"""

ORIENTATION = """<mujoco>
  <option timestep="0.01"/><default><joint armature="0.01" damping="0.1"/></default>
  <worldbody>
    <site name="ref" pos="0 0 1" euler="10 20 30"/>
    <body pos="0 0 1"><joint name="b1" type="ball"/><geom type="box" size=".05 .1 .2" mass="1" pos="0 0 -.2"/>
      <body pos="0 0 -.4"><joint name="h" type="hinge" axis="1 0 0"/><joint name="b2" type="ball"/><geom type="capsule" size=".04" fromto="0 0 0 .2 .1 -.3" mass=".5"/>
        <site name="tip" pos=".2 .1 -.3" euler="5 -10 40"/>
      </body>
    </body>
    <body pos="1 0 1"><freejoint/><geom type="box" size=".1 .05 .02" mass=".4"/><site name="fs" euler="30 0 0"/></body>
  </worldbody>
  <actuator>
    <orientation name="a0" joint="b1" kp="20" kv="2"/>
    <orientation name="a1" joint="b2" kp="5" input="quat" forcerange="0 3"/>
    <orientation name="a2" site="tip" refsite="ref" kp="7" kv=".5"/>
    <general joint="b1" dyntype="integrator" gaintype="so3" biastype="so3" gainprm="4" biasprm="0 -4 -.3" actearly="true"/>
    <orientation site="fs" refsite="ref" kp=".02" kv=".002" ctrlrange="-2 2"/>
    <position site="tip" refsite="ref" gear="0 0 0 .3 .5 1" kp="2"/>
    <general site="tip" refsite="ref" gear="0 0 0 0 1 0" dyntype="integrator" gainprm="3" biasprm="0 -3 0" biastype="affine"/>
    <motor joint="h" gear="2"/>
  </actuator><sensor><actuatorpos actuator="a0"/><actuatorvel actuator="a2"/><actuatorfrc actuator="a1"/><jointactuatorfrc joint="h"/></sensor>
</mujoco>
"""

DCMOTOR = """<mujoco>
  <option timestep="0.005"/>
  <default><joint armature="0.01" damping="0.05"/></default>
  <worldbody>
    <body><joint name="h1" type="hinge" axis="0 1 0"/><geom type="capsule" size=".05" fromto="0 0 0 .3 0 0" mass="1"/>
      <body pos=".3 0 0"><joint name="h2" type="hinge" axis="0 1 0"/><geom type="capsule" size=".05" fromto="0 0 0 .3 0 0" mass="1"/>
        <body pos=".3 0 0"><joint name="h3" type="hinge" axis="0 0 1"/><geom type="capsule" size=".04" fromto="0 0 0 .2 0 0" mass=".5"/>
          <body pos=".2 0 0"><joint name="h4" type="hinge" axis="1 0 0"/><geom type="capsule" size=".03" fromto="0 0 0 .1 0 0" mass=".2"/></body>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <dcmotor joint="h1" resistance="2" motorconst="0.5"/>
    <dcmotor joint="h2" nominal="12 2 30" inductance="0.01 0" saturation="1.5 0 0" cogging="0.05 6 0.3"/>
    <dcmotor joint="h3" resistance="1" motorconst="0.3" thermal="2 10 0 0.004 25 20" lugre="50 0.5 0.2 0.3 0.1" input="pos vel ff" controller="5 2 0.5 3 0.4 10"/>
    <dcmotor joint="h4" resistance="1.5" motorconst="0.2 0.25" inductance="0 0.002" saturation="0 0 50" input="vel voltage" controller="0 0 0.3 0 0 6"/>
    <dcmotor joint="h1" resistance="3" motorconst="0.4" input="none" cogging="0.02 4 0"/>
  </actuator>
</mujoco>
"""

MODELS = {"pid": PID, "orientation": ORIENTATION, "dcmotor": DCMOTOR}
FIELDS = ("actuator_length", "actuator_velocity", "actuator_force", "act_dot",
          "qfrc_actuator", "qacc", "sensordata")


def _moment(mjm, mjd):
    out = np.zeros((mjm.nout, mjm.nv))
    mujoco.mju_sparse2dense(out, mjd.actuator_moment, mjd.moment_rownnz, mjd.moment_rowadr,
                            mjd.moment_colind)
    return out


@pytest.fixture(scope="module")
def jitted():
    return jax.jit(forward), jax.jit(step)


def _load(name, integrator=None):
    mjm = mujoco.MjModel.from_xml_string(MODELS[name])
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    if integrator is not None:
        mjm.opt.integrator = integrator
    return mjm, model_from_mujoco(mjm)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_servo_actuators_at_random_states(name, jitted):
    fwd, _ = jitted
    mjm, m = _load(name)
    assert mjm.nu != mjm.nactuator
    mjd = mujoco.MjData(mjm)
    d0 = make_data(m)
    np.testing.assert_array_equal(np.asarray(d0.ctrl), mjd.ctrl)   # quat chart: identity
    rng = np.random.default_rng(0)
    worst = {}
    for _ in range(10):
        st = random_state(mjm, rng, qscale=1.0, uscale=2.0)
        set_state(mjm, mjd, st)
        mujoco.mj_forward(mjm, mjd)
        d = fwd(m, to_data(d0, st))
        for f in FIELDS:
            worst[f] = max(worst.get(f, 0.0), rel_err(getattr(d, f), getattr(mjd, f)))
        worst["moment"] = max(worst.get("moment", 0.0),
                              rel_err(d.actuator_moment, _moment(mjm, mjd)))
    bad = {k: v for k, v in worst.items() if not v <= 1e-9}
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("integrator", ["euler", "implicitfast"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_servo_actuator_trajectories(name, integrator, jitted):
    _, stp = jitted
    itype = {"euler": mujoco.mjtIntegrator.mjINT_EULER,
             "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST}[integrator]
    mjm, m = _load(name, itype)
    mjd = mujoco.MjData(mjm)
    rng = np.random.default_rng(1)
    st = random_state(mjm, rng, qscale=0.5)
    set_state(mjm, mjd, st)
    d = to_data(make_data(m), st)
    assert _worst_step_error(mjm, mjd, m, d, stp, 20) < 1e-8


def _worst_step_error(mjm, mjd, m, d, stp, nstep):
    """Largest relative error of qpos, qvel, act and actuator_force over nstep steps of
    MuJoCo and simjax from the same state."""
    worst = 0.0
    for _ in range(nstep):
        mujoco.mj_step(mjm, mjd)
        d = stp(m, d)
        for f in ("qpos", "qvel", "act", "actuator_force"):
            worst = max(worst, rel_err(getattr(d, f), getattr(mjd, f)))
    return worst


@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_servo_models(name):
    """simjax's own compiler builds these models: every comparable field matches MuJoCo's."""
    from conformance.compare import compare
    _, bad, n = compare(simjax.load_model(MODELS[name]),
                        mujoco.MjModel.from_xml_string(MODELS[name]))
    assert n > 100 and not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_servo_trajectories(name, jitted):
    """30 Euler steps of the simjax-compiled models from a random state match MuJoCo to
    1e-8 (measured ~1e-13)."""
    _, stp = jitted
    mjm = mujoco.MjModel.from_xml_string(MODELS[name])
    m = simjax.load_model(MODELS[name])
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONSTRAINT
    m = m.replace(opt=m.opt.replace(disableflags=int(mjm.opt.disableflags)))
    mjd = mujoco.MjData(mjm)
    st = random_state(mjm, np.random.default_rng(2), qscale=0.5)
    set_state(mjm, mjd, st)
    d = to_data(make_data(m), st)
    worst = _worst_step_error(mjm, mjd, m, d, stp, 30)
    print(name, "worst relative error", worst)
    assert worst < 1e-8


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n != "dcmotor"
                                  else n for n in sorted(MODELS)])
def test_servo_derivatives_vs_finite_differences(name):
    """d(qacc, act_dot, actuator_force)/d(qpos, qvel, act, ctrl) of forward, reverse and
    forward mode, against central differences at a random state (the slew, integral,
    voltage and current limits of the pid / dcmotor servos, the orientation servos'
    force range). dcmotor: the temperature rate of motors without a thermal state
    divided by their capacity 0 (an unused value), which made every reverse-mode
    derivative through it NaN."""
    mjm, m = _load(name)
    nq, nv, na = mjm.nq, mjm.nv, mjm.na
    d0 = make_data(m)
    st = random_state(mjm, np.random.default_rng(3), qscale=0.5, uscale=1.5)
    x0 = jnp.asarray(np.concatenate([st["qpos"], st["qvel"], st["act"], st["ctrl"]]))

    def f(x):
        q, v, a, u = jnp.split(x, np.cumsum([nq, nv, na]))
        d = forward(m, d0.replace(qpos=q, qvel=v, act=a, ctrl=u))
        return jnp.concatenate([d.qacc, d.act_dot, d.actuator_force])

    fj = jax.jit(f)
    rev = np.asarray(jax.jit(jax.jacrev(f))(x0))
    fwd = np.asarray(jax.jit(jax.jacfwd(f))(x0))
    eps = 1e-6
    fd = np.stack([(np.asarray(fj(x0.at[k].add(eps))) - np.asarray(fj(x0.at[k].add(-eps))))
                   / (2 * eps) for k in range(x0.shape[0])], 1)
    tol = 1e-5 * (1 + np.abs(fd))
    assert np.all(np.abs(rev - fd) <= tol), np.abs(rev - fd).max()
    assert np.all(np.abs(fwd - fd) <= tol), np.abs(fwd - fd).max()
