"""jax.grad through 50-step rollouts against central finite differences (float64)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine_helpers import load
from simjax.engine import make_data
from simjax.rollout import rollout

NSTEP = 50
EPS = 1e-6


def _setup(rel, integrator):
    mjm, m = load(rel, integrator=integrator)
    rng = np.random.default_rng(0)
    data = make_data(m).replace(qvel=jnp.asarray(0.1 * rng.standard_normal(mjm.nv)))
    ctrl = jnp.asarray(0.2 * rng.standard_normal((NSTEP, mjm.nu)))
    weight = jnp.asarray(rng.standard_normal(mjm.nq))
    return m, data, ctrl, weight


def _loss(m, data, ctrl, weight):
    traj = rollout(m, data, ctrl)
    return jnp.sum(traj.qpos[-1] * weight) + 0.1 * jnp.sum(traj.qvel[-1] ** 2)


def _fd(fn, x, idx, scale):
    out = []
    for i in idx:
        h = EPS * scale[i]
        out.append((fn(x.at[i].add(h)) - fn(x.at[i].add(-h))) / (2 * h))
    return np.array(out)


def _check(rel, integrator, field):
    m, data, ctrl, weight = _setup(rel, integrator)

    @jax.jit
    def loss(qvel, p):
        return _loss(m.replace(**{field: p}), data.replace(qvel=qvel), ctrl, weight)

    qvel0 = data.qvel
    p0 = jnp.asarray(getattr(m, field))
    g_qvel, g_p = jax.jit(jax.grad(loss, argnums=(0, 1)))(qvel0, p0)

    # w.r.t. the initial velocity
    fd = _fd(lambda q: loss(q, p0), qvel0, np.arange(m.nv), np.ones(m.nv))
    np.testing.assert_allclose(np.asarray(g_qvel), fd, rtol=1e-5,
                               atol=1e-5 * np.abs(fd).max())
    # w.r.t. a model parameter (relative perturbation of its non-zero entries)
    nz = np.nonzero(np.asarray(p0) != 0)[0][:8]
    fdp = _fd(lambda p: loss(qvel0, p), p0, nz, np.abs(np.asarray(p0)))
    np.testing.assert_allclose(np.asarray(g_p)[nz], fdp, rtol=1e-5,
                               atol=1e-5 * np.abs(fdp).max())


@pytest.mark.parametrize("rel,integrator,field", [
    ("gym_inverted_double_pendulum/inverted_double_pendulum.xml", 0, "dof_damping"),
    pytest.param("gym_inverted_pendulum/inverted_pendulum.xml", 1, "body_mass",
                 marks=pytest.mark.slow),                    # ~50 s (RK4 grad)
    pytest.param("gym_swimmer/swimmer.xml", 3, "body_mass",
                 marks=pytest.mark.slow),                    # ~32 s
])
def test_grad_matches_finite_differences(rel, integrator, field):
    _check(rel, integrator, field)


@pytest.mark.slow
@pytest.mark.parametrize("rel,integrator,field", [
    ("mujoco_humanoid/humanoid.xml", 0, "body_mass"),
    ("mujoco_humanoid/humanoid.xml", 3, "dof_damping"),
    ("gym_ant/ant.xml", 1, "body_mass"),
    ("mjx_pendula/pendula.xml", 0, "dof_damping"),
    ("gym_inverted_double_pendulum/inverted_double_pendulum.xml", 2, "body_mass"),
    ("features", 0, "body_mass"),
])
def test_grad_matches_finite_differences_large(rel, integrator, field):
    _check(rel, integrator, field)
