"""Inverse dynamics (simjax.inverse) against mujoco.mj_inverse, float64, constraints
disabled: qfrc_inverse for random (qpos, qvel, qacc), with and without the discrete
(INVDISCRETE) conversion for every integrator that supports it; sensordata as well.
Tolerance 1e-6 relative to max(1, |value|) (measured: ~1e-13)."""
import jax
import mujoco
import numpy as np
import pytest

import simjax
from engine_helpers import load, random_state, rel_err, set_state, to_data
from simjax.engine import forward, make_data
from simjax.errors import UnsupportedFeatureError

TOL = 1e-6
MODELS = ["mjx_pendula/pendula.xml", "mujoco_humanoid/humanoid.xml",
          "menagerie_trossen_wx250s/wx250s.xml", "mujoco_car/car.xml"]


def _check(rel, integrator, discrete, nstate=10):
    def edit(mjm):
        if discrete:
            mjm.opt.enableflags |= int(mujoco.mjtEnableBit.mjENBL_INVDISCRETE)
    mjm, m = load(rel, integrator=integrator, edit=edit)
    mjd = mujoco.MjData(mjm)
    inv = jax.jit(simjax.inverse)
    rng = np.random.default_rng(11)
    d0 = make_data(m)
    for _ in range(nstate):
        state = random_state(mjm, rng)
        state["qacc"] = rng.standard_normal(mjm.nv)
        set_state(mjm, mjd, state)
        mujoco.mj_inverse(mjm, mjd)
        d = inv(m, to_data(d0, state))
        assert rel_err(d.qfrc_inverse, mjd.qfrc_inverse) < TOL
        assert rel_err(d.sensordata, mjd.sensordata) < TOL
        np.testing.assert_array_equal(np.asarray(d.qacc), state["qacc"])


@pytest.mark.parametrize("rel", [MODELS[0]] + [pytest.param(r, marks=pytest.mark.slow)
                                               for r in MODELS[1:]])
def test_inverse_matches_mujoco(rel):
    _check(rel, 0, False)


@pytest.mark.parametrize("integrator", [pytest.param(0, marks=pytest.mark.slow), 2,
                                        pytest.param(3, marks=pytest.mark.slow)])
def test_inverse_discrete(integrator):
    """Euler (implicit dof damping), implicit (qDeriv in MuJoCo's D sparsity: tendon
    damping across trees dropped) and implicitfast (free-body blocks)."""
    _check("mjx_pendula/pendula.xml", integrator, True, nstate=4)


@pytest.mark.slow
@pytest.mark.parametrize("integrator", [0, 2, 3])
@pytest.mark.parametrize("rel", MODELS[1:])
def test_inverse_discrete_more_models(rel, integrator):
    _check(rel, integrator, True, nstate=4)


def test_inverse_recovers_applied_forces():
    """inverse(forward(x)) returns the forces that produced qacc: qfrc_applied +
    qfrc_actuator + J' xfrc_applied."""
    mjm, m = load("mjx_pendula/pendula.xml")
    rng = np.random.default_rng(5)
    state = random_state(mjm, rng)
    d = to_data(make_data(m), state).replace(
        qfrc_applied=jax.numpy.asarray(rng.standard_normal(mjm.nv)))
    d = jax.jit(forward)(m, d)
    di = jax.jit(simjax.inverse)(m, d)
    from simjax.engine.support import xfrc_accumulate
    expect = d.qfrc_applied + d.qfrc_actuator + xfrc_accumulate(m, d)
    assert rel_err(di.qfrc_inverse, expect) < 1e-9


def test_inverse_rk4_discrete_raises():
    def edit(mjm):
        mjm.opt.enableflags |= int(mujoco.mjtEnableBit.mjENBL_INVDISCRETE)
    mjm, m = load("mjx_pendula/pendula.xml", integrator=1, edit=edit)
    with pytest.raises(UnsupportedFeatureError, match="RK4"):
        simjax.inverse(m, make_data(m))


def test_inverse_with_constraints_uses_constraint_stage():
    """With constraints enabled, inverse runs the constraint module's inv_constraint
    (mj_invConstraint; compared with MuJoCo in test_contact_e2e.py)."""
    import importlib
    inv_mod = importlib.import_module("simjax.engine.inverse")
    mjm, m = load("mjx_pendula/pendula.xml", constraints=True)
    from simjax.engine import constraint
    assert inv_mod._constraint_stage(m) is constraint.inv_constraint
