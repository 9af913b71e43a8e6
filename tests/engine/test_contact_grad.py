"""jax.grad through trajectories with contacts (simjax's own collision, Newton with
opt.iterations = 100, implicit differentiation of the solver) against central finite
differences, float64.

The loss is a fixed linear function of the final qpos and qvel; its gradient with respect
to the initial velocity is compared per component where the contact set (per-step
contact counts and active efc rows) is the same for both perturbed trajectories, relative
error 1e-3 (to max(|fd|, 1e-3 max |fd|)).
"""
from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from contact_e2e_helpers import trajectory_states
from engine_helpers import load, to_data
from mujoco_oracle import model_from_mujoco
from simjax.engine import io

fwd = importlib.import_module("simjax.engine.forward")
EPS = 1e-6
TOL = 1e-3

#: a box settled on a plane, then pushed to slide and spin (up to 4 corner contacts,
#: elliptic friction cones: the implicit derivative goes through the cone Hessians)
BOX = """
<mujoco>
  <option timestep="0.002" iterations="100" tolerance="1e-13" ls_iterations="50" cone="elliptic"/>
  <worldbody>
    <geom type="plane" size="5 5 .1" friction="0.5"/>
    <body pos="0 0 0.05">
      <freejoint/>
      <geom type="box" size="0.1 0.08 0.05" mass="1" friction="0.5"/>
    </body>
  </worldbody>
</mujoco>"""


def _iter100(mjm):
    mjm.opt.iterations = 100
    mjm.opt.ls_iterations = 50
    mjm.opt.tolerance = 1e-13
    mjm.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON


def _setup(name):
    """(simjax Model, initial Data, qvel0): a state in contact."""
    if name == "box":
        mjm = mujoco.MjModel.from_xml_string(BOX)
        m = model_from_mujoco(mjm)
        mjd = mujoco.MjData(mjm)
        for _ in range(500):                       # settle on the plane (MuJoCo)
            mujoco.mj_step(mjm, mjd)
        qvel = np.array([0.6, 0.2, 0.0, 0.0, 0.0, 0.5])
        return mjm, m, io.make_data(m).replace(qpos=jnp.asarray(mjd.qpos),
                                               qvel=jnp.asarray(qvel))
    rel = {"ant": "gym_ant/ant.xml", "humanoid": "mujoco_humanoid/humanoid.xml"}[name]
    mjm, m = load(rel, constraints=True, edit=_iter100)
    st = trajectory_states(mjm, 1, seed=5)[0]
    return mjm, m, to_data(io.make_data(m), st)


def grad_vs_fd(name, nstep):
    mjm, m, d0 = _setup(name)
    rng = np.random.default_rng(0)
    wq = jnp.asarray(rng.standard_normal(mjm.nq))
    wv = jnp.asarray(rng.standard_normal(mjm.nv))

    def loss(qvel):
        def body(d, _):
            d = fwd.step(m, d)
            return d, (d.ncon, d.efc_active)
        d, (ncon, act) = jax.lax.scan(jax.checkpoint(body), d0.replace(qvel=qvel), None,
                                      length=nstep)
        return jnp.dot(d.qpos, wq) + 0.1 * jnp.dot(d.qvel, wv), (ncon, act)

    f = jax.jit(loss)
    g, (ncon, act) = jax.jit(jax.grad(loss, has_aux=True))(d0.qvel)
    g = np.asarray(g)
    assert np.all(np.isfinite(g))
    assert int(np.asarray(ncon).sum()) > 0, "no contacts"
    base = (np.asarray(ncon), np.asarray(act))
    fd = np.full(mjm.nv, np.nan)
    for i in range(mjm.nv):
        e = jnp.zeros(mjm.nv).at[i].set(EPS)
        (lp, (np_, ap)), (lm, (nm, am)) = f(d0.qvel + e), f(d0.qvel - e)
        same = all(np.array_equal(a, b) for a, b in
                   ((np.asarray(np_), base[0]), (np.asarray(nm), base[0]),
                    (np.asarray(ap), base[1]), (np.asarray(am), base[1])))
        if same:
            fd[i] = (float(lp) - float(lm)) / (2 * EPS)
    ok = ~np.isnan(fd)
    scale = 1e-3 * np.abs(fd[ok]).max()
    err = np.abs(g[ok] - fd[ok]) / np.maximum(np.abs(fd[ok]), scale)
    print(f"grad {name} {nstep} steps: {ok.sum()}/{mjm.nv} components with a fixed contact "
          f"set; max rel err {err.max():.2e}; contacts per step {base[0].min()}-"
          f"{base[0].max()}; |grad| max {np.abs(g).max():.3e}")
    assert ok.sum() >= mjm.nv // 2
    assert err.max() < TOL, (g, fd)
    return err.max()


@pytest.mark.slow                      # ~40 s: compiles grad through a contact rollout
def test_grad_box_short():
    grad_vs_fd("box", 20)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["box", "ant", "humanoid"])
def test_grad_100_steps(name):
    grad_vs_fd(name, 100)
