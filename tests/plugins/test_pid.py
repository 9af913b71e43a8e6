"""mujoco.pid against MuJoCo 4.0.0 (float64): forces, act_dot, trajectories."""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from simjax.engine import forward, make_data, step
from mujoco_oracle import corpus_path

# all pid variants: P, PD, PID, clamped PID, slew-limited, filtered setpoint with
# actearly, integrator setpoint; joints slide along z well above the floor (no contact)
VARIANTS = """<mujoco>
  <option timestep="0.005"/>
  <extension>
    <plugin plugin="mujoco.pid">
      <instance name="slew"><config key="kp" value="3"/><config key="kd" value=".2"/>
        <config key="slewmax" value="2"/></instance>
      <instance name="all"><config key="kp" value="5"/><config key="ki" value="2"/>
        <config key="kd" value=".3"/><config key="imax" value=".4"/>
        <config key="slewmax" value="1.5"/></instance>
    </plugin>
  </extension>
  <worldbody>
    <body pos="0 0 1"><joint name="a" type="slide" axis="0 0 1"/><geom size=".02"/></body>
    <body pos=".1 0 1"><joint name="b" type="slide" axis="0 0 1"/><geom size=".02"/></body>
    <body pos=".2 0 1"><joint name="c" type="hinge" axis="0 1 0"/>
      <geom type="capsule" size=".02" fromto="0 0 0 .1 0 0"/></body>
    <body pos=".6 0 1"><joint name="e" type="slide" axis="0 0 1"/><geom size=".02"/></body>
  </worldbody>
  <actuator>
    <plugin joint="a" instance="slew" actdim="1" ctrlrange="-.3 .3"/>
    <plugin joint="b" instance="all" actdim="2"/>
    <plugin joint="c" plugin="mujoco.pid" actdim="2" dyntype="filterexact" dynprm=".05"
      actearly="true"><config key="kp" value="2"/><config key="ki" value="1"/></plugin>
    <plugin joint="e" plugin="mujoco.pid" actdim="1" dyntype="integrator" actlimited="true"
      actrange="-.5 .5"><config key="kp" value="4"/><config key="kd" value=".5"/></plugin>
  </actuator>
</mujoco>"""


@pytest.fixture(scope="module")
def pid_models():
    path = corpus_path("mujoco_plugin_pid/pid.xml")
    return {"pid": (simjax.load_model(path), mujoco.MjModel.from_xml_path(path)),
            "variants": (simjax.load_model(VARIANTS), mujoco.MjModel.from_xml_string(VARIANTS))}


@pytest.fixture(scope="module")
def fwd():
    return jax.jit(forward)


@pytest.mark.parametrize("name", ["pid", "variants"])
def test_forward_random_states(pid_models, fwd, name):
    m, mjm = pid_models[name]
    mjd = mujoco.MjData(mjm)
    rng = np.random.default_rng(1)
    d0 = make_data(m)
    for _ in range(5):
        state = dict(qpos=rng.uniform(0.0, 0.2, mjm.nq), qvel=rng.normal(size=mjm.nv),
                     ctrl=rng.uniform(-0.2, 0.4, mjm.nu), act=0.2 * rng.normal(size=mjm.na),
                     time=rng.choice([0.0, 0.3]))
        for k, v in state.items():
            if k == "time":
                mjd.time = v
            else:
                getattr(mjd, k)[:] = v
        mujoco.mj_forward(mjm, mjd)
        assert mjd.ncon == 0
        d = fwd(m, d0.replace(**{k: jnp.asarray(v) for k, v in state.items()}))
        # same arithmetic as MuJoCo up to rounding: 1e-12 absolute on O(1) forces
        np.testing.assert_allclose(d.actuator_force, mjd.actuator_force, rtol=0, atol=1e-12)
        np.testing.assert_allclose(d.act_dot, mjd.act_dot, rtol=0, atol=1e-9)
        np.testing.assert_allclose(d.qfrc_actuator, mjd.qfrc_actuator, rtol=0, atol=1e-12)
        np.testing.assert_allclose(d.qacc, mjd.qacc, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("name", ["pid", "variants"])
def test_trajectory(pid_models, name):
    m, mjm = pid_models[name]
    mjd = mujoco.MjData(mjm)
    ctrl = np.linspace(0.05, 0.15, mjm.nu)
    mjd.ctrl[:] = ctrl
    d = make_data(m).replace(ctrl=jnp.asarray(ctrl))

    def body(d, _):
        d = step(m, d)
        return d, (d.qpos, d.act)
    _, (qpos, act) = jax.jit(lambda d: jax.lax.scan(body, d, None, length=300))(d)
    for i in range(300):
        mujoco.mj_step(mjm, mjd)
        np.testing.assert_allclose(qpos[i], mjd.qpos, rtol=0, atol=1e-10)
        np.testing.assert_allclose(act[i], mjd.act, rtol=0, atol=1e-10)
    assert mjd.ncon == 0


@pytest.mark.slow
def test_grad_through_gains(pid_models):
    """d(velocity after two steps)/d(kp, ki) by jax.grad matches central differences
    (the second step reads the integral state the first one wrote)."""
    m, _ = pid_models["pid"]
    d = make_data(m).replace(ctrl=jnp.full(4, 0.1))

    def vel(gains):
        params = list(m.plugin_params)
        params[2] = dict(params[2], kp=gains[0], ki=gains[1])
        mm = m.replace(plugin_params=tuple(params))
        return step(mm, step(mm, d)).qvel[2]
    x = jnp.array([4.0, 4.0])
    g = jax.jit(jax.grad(vel))(x)
    f = jax.jit(vel)
    eps = 1e-6
    fd = [(f(x.at[i].add(eps)) - f(x.at[i].add(-eps))) / (2 * eps) for i in range(2)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    assert np.all(np.abs(np.asarray(g)) > 1e-8)


def test_vmap_over_gains(pid_models):
    m, _ = pid_models["pid"]
    d = make_data(m).replace(ctrl=jnp.full(4, 0.1))
    kps = jnp.linspace(1.0, 8.0, 16)

    def run(kp):
        params = list(m.plugin_params)
        params[0] = dict(params[0], kp=kp)
        return step(m.replace(plugin_params=tuple(params)), d).qacc[0]
    out = jax.jit(jax.vmap(run))(kps)
    assert out.shape == (16,)
    assert np.all(np.diff(np.asarray(out)) > 0)
