"""Velocity derivatives for the implicit integrators (simjax.engine.derivative) against
MuJoCo's qDeriv (mjd_smooth_vel, as left in mjData by mj_step with the implicit
integrator), float64.

pendula.xml has a fixed tendon with damping coupling dofs of different branches; MuJoCo
keeps qDeriv in M's sparsity and drops that coupling, and so does simjax (the values
inside the pattern agree to ~1e-13 relative to max(1, |qDeriv|); tolerance 1e-9).
"""
import jax
import mujoco
import numpy as np

from engine_helpers import load, random_state, set_state, to_data
from simjax.engine import derivative, forward, make_data


def _qderiv(mjm, mjd):
    out = np.zeros((mjm.nv, mjm.nv))
    for r in range(mjm.nv):
        a = mjm.D_rowadr[r]
        out[r, mjm.D_colind[a:a + mjm.D_rownnz[r]]] = mjd.qDeriv[a:a + mjm.D_rownnz[r]]
    return out


def test_qderiv_matches_mujoco_sparsity_and_values():
    def edit(mjm):
        mjm.tendon_damping[:] = [20.0, 40.0]          # strong cross-branch coupling
    mjm, m = load("mjx_pendula/pendula.xml", integrator=2, edit=edit)
    rng = np.random.default_rng(0)
    fn = jax.jit(lambda m, d: derivative.smooth_vel(m, forward(m, d), True))
    for _ in range(2):
        st = random_state(mjm, rng)
        mjd = mujoco.MjData(mjm)
        set_state(mjm, mjd, st)
        mujoco.mj_step(mjm, mjd)                      # qDeriv of the pre-step state
        ours = np.asarray(fn(m, to_data(make_data(m), st)))
        ref = _qderiv(mjm, mjd)
        assert np.abs(ours - ref).max() / max(1.0, np.abs(ref).max()) < 1e-9
