"""200-step trajectories of every integrator against mujoco.mj_step (float64)."""
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import load, random_state, set_state, to_data
from simjax.engine import make_data
from simjax.rollout import rollout

NSTEP = 200
MODELS = [
    "mjx_pendula/pendula.xml",
    "mujoco_humanoid/humanoid.xml",
    "gym_ant/ant.xml",
    "gym_inverted_double_pendulum/inverted_double_pendulum.xml",
]
INTEGRATORS = {"euler": 0, "rk4": 1, "implicit": 2, "implicitfast": 3}


def _mujoco_traj(mjm, state, ctrl):
    mjd = mujoco.MjData(mjm)
    set_state(mjm, mjd, state)
    qpos, qvel, act = [], [], []
    for t in range(NSTEP):
        mjd.ctrl[:] = ctrl[t]
        mujoco.mj_step(mjm, mjd)
        qpos.append(mjd.qpos.copy())
        qvel.append(mjd.qvel.copy())
        act.append(mjd.act.copy())
    assert all(w.number == 0 for w in mjd.warning), "reference trajectory diverged"
    return np.array(qpos), np.array(qvel), np.array(act)


def _check(rel, integrator, extra_ok=1e-6, edit=None):
    mjm, m = load(rel, integrator=integrator, edit=edit)
    rng = np.random.default_rng(7)
    state = random_state(mjm, rng, qscale=0.1, vscale=0.2, uscale=0.3)
    ctrl = 0.3 * rng.standard_normal((NSTEP, mjm.nu))
    qpos, qvel, act = _mujoco_traj(mjm, state, ctrl)
    data = to_data(make_data(m), state)
    traj = jax.jit(rollout)(m, data, jnp.asarray(ctrl))
    scale = np.maximum(1.0, np.abs(qvel))
    np.testing.assert_array_less(np.abs(np.asarray(traj.qpos) - qpos), extra_ok)
    np.testing.assert_array_less(np.abs(np.asarray(traj.qvel) - qvel) / scale, extra_ok)
    if mjm.na:
        np.testing.assert_array_less(np.abs(np.asarray(traj.act) - act), extra_ok)
    np.testing.assert_allclose(np.asarray(traj.time)[-1], NSTEP * mjm.opt.timestep)


@pytest.mark.parametrize("integrator", list(INTEGRATORS))
@pytest.mark.parametrize("rel", MODELS)
def test_trajectory_matches_mujoco(rel, integrator):
    _check(rel, INTEGRATORS[integrator])


@pytest.mark.parametrize("integrator", list(INTEGRATORS))
def test_features_trajectory(integrator):
    """Ball/slide joints, polynomial springs, tendons, filters, fluid, gravcomp."""
    _check("features", INTEGRATORS[integrator])


_RK4_XML = """
<mujoco>
  <option integrator="RK4" timestep="0.005"/>
  <worldbody>
    <geom type="plane" size="2 2 .1"/>
    <body name="ball" pos="0 0 .12">
      <freejoint/>
      <geom type="sphere" size=".1"/>
      <site name="s"/>
      <body pos=".2 0 0">
        <joint name="h" type="hinge" axis="0 1 0" damping=".1"/>
        <geom type="capsule" size=".03" fromto="0 0 0 .2 0 0"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="h"/></actuator>
  <sensor>
    <framepos objtype="site" objname="s"/>
    <velocimeter site="s"/>
    <accelerometer site="s"/>
    <touch site="s"/>
    <jointpos joint="h"/>
  </sensor>
</mujoco>
"""


def _rk4_model(autoreset):
    import dataclasses

    import simjax
    from simjax.types import DisableBit
    m = simjax.load_model(_RK4_XML)
    if not autoreset:
        m = m.replace(opt=dataclasses.replace(
            m.opt, disableflags=m.opt.disableflags | DisableBit.AUTORESET))
    rng = np.random.default_rng(3)
    d = make_data(m)
    return m, d.replace(qvel=jnp.asarray(0.5 * rng.standard_normal(m.nv)),
                        ctrl=jnp.asarray([0.2]))


def test_rk4_leaves_mujoco_qacc_and_stage_fields():
    """After an RK4 step qacc is the acceleration integrated (the B-weighted stage sum),
    qacc_warmstart, act_dot and the energy the last stage's, as MuJoCo 4.0.0 leaves
    them: a free body in contact, a damped hinge and a filter actuator, float64. (The
    energy was the first stage's: mj_forwardSkip recomputes it in the later stages.)"""
    import simjax
    from simjax.types import EnableBit
    xml = _RK4_XML.replace('<motor joint="h"/>', '<motor joint="h"/><general joint="h" '
                           'dyntype="filter" dynprm="0.1" gainprm="1"/>')
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjm.opt.enableflags |= int(EnableBit.ENERGY)
    m = simjax.load_model(xml)
    m = m.replace(opt=m.opt.replace(enableflags=int(mjm.opt.enableflags)))
    rng = np.random.default_rng(3)
    qvel = 0.5 * rng.standard_normal(mjm.nv)
    qpos = mjm.qpos0.copy()
    qpos[2], qvel[2] = 0.098, -0.3              # the sphere presses into the plane
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:], mjd.qvel[:], mjd.ctrl[:], mjd.act[:] = qpos, qvel, [0.2, 1.0], [0.3]
    d = make_data(m).replace(qpos=jnp.asarray(qpos), qvel=jnp.asarray(qvel),
                             ctrl=jnp.asarray([0.2, 1.0]), act=jnp.asarray([0.3]))
    run = jax.jit(simjax.step)
    for _ in range(4):
        qvel0 = mjd.qvel.copy()
        mujoco.mj_step(mjm, mjd)
        d = run(m, d)
        assert mjd.ncon > 0                     # (contacts of the last stage)
        # the three differ from each other in this state: the test can tell them apart
        assert np.abs(mjd.qacc - mjd.qacc_warmstart).max() > 1e-3
        np.testing.assert_allclose(mjd.qacc, (mjd.qvel - qvel0) / mjm.opt.timestep,
                                   rtol=1e-9, atol=1e-9)
        for name in ("qpos", "qvel", "act", "qacc", "qacc_warmstart", "act_dot", "energy"):
            np.testing.assert_allclose(np.asarray(getattr(d, name)), getattr(mjd, name),
                                       rtol=1e-9, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("autoreset", [True, False])
def test_rk4_step_forwards_once(autoreset, monkeypatch):
    """step with RK4 traces the forward pass once (as the first stage of its scan)."""
    import importlib
    fmod = importlib.import_module("simjax.engine.forward")     # the module, not the fn
    m, d = _rk4_model(autoreset)
    calls = []
    orig = fmod._fwd_position
    monkeypatch.setattr(fmod, "_fwd_position",
                        lambda m_, d_, *a: (calls.append(1), orig(m_, d_, *a))[1])
    jax.make_jaxpr(lambda d_: fmod.step(m, d_))(d)
    assert len(calls) == 1


@pytest.mark.slow
def test_rk4_step_equals_forward_then_rk4():
    """step with RK4 equals forward followed by rk4 (sensors, energy and the bad-qacc
    warning of the first evaluation included), to rounding."""
    import importlib
    fmod = importlib.import_module("simjax.engine.forward")
    m, d = _rk4_model(False)
    step = jax.jit(lambda d_: fmod.step(m, d_))
    ref = jax.jit(lambda d_: fmod.rk4(m, fmod.forward(m, d_)))
    for _ in range(3):
        got, want = step(d), ref(d)
        for name in ("qpos", "qvel", "qacc", "sensordata", "energy", "time", "efc_force",
                     "warning", "qacc_warmstart"):
            np.testing.assert_allclose(np.asarray(getattr(got, name)),
                                       np.asarray(getattr(want, name)), rtol=1e-10,
                                       atol=1e-12, err_msg=name)
        d = got
    assert np.abs(np.asarray(d.sensordata)).max() > 0
