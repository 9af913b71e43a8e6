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
