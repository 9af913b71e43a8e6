"""Contact adhesion (geom / pair ``adhesion``) and moving surfaces (geom ``surfacevel``)
against MuJoCo 4.0, float64, on models/sticky_conveyor.xml: bodies start within their
gap of adhesive surfaces (contacts of runtime dim 1 in slots of dim 3, 4 and 6, pulled
together by the biased reference), then settle on a floor and a belt whose surfaces
move.

Tolerances: solved quantities to 1e-9 relative at tight solver tolerance (measured
1e-12 qacc, 1e-13 efc_force; rows built from simjax's own collision, whose contact
points differ from MuJoCo's by rounding); the passive pull and the rows' velocity and
reference to 1e-10 absolute (measured 5e-16 and 6e-13). With noslip and pyramidal cones
the edge forces of a contact are not unique (only their sums act), and noslip stops at
its tolerance: qacc to 1e-9 (measured 1.6e-13), the forces as pairs' sums to 1e-6.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from constraint_helpers import canonical, match_rows
from contact_e2e_helpers import compare, match_contacts, smooth_own_jit
from engine_helpers import to_data
from mujoco_oracle import model_from_mujoco
from simjax.engine import io, rne_post, solver
from simjax.engine.tables import has_adhesion, has_surfacevel

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "sticky_conveyor.xml")
solve_jit = jax.jit(solver.fwd_constraint)
PYR, ELL = int(mujoco.mjtCone.mjCONE_PYRAMIDAL), int(mujoco.mjtCone.mjCONE_ELLIPTIC)
NEWTON, CG, PGS = (int(mujoco.mjtSolver.mjSOL_NEWTON), int(mujoco.mjtSolver.mjSOL_CG),
                   int(mujoco.mjtSolver.mjSOL_PGS))


def _mjmodel(cone, solver_type, noslip=0):
    mjm = mujoco.MjModel.from_xml_path(MODEL)
    mjm.opt.cone = cone
    mjm.opt.solver = solver_type
    mjm.opt.tolerance = 1e-15
    mjm.opt.iterations = 1000
    mjm.opt.ls_iterations = 100
    mjm.opt.noslip_iterations = noslip
    mjm.opt.noslip_tolerance = 1e-9
    return mjm


def _states(mjm, n=10, every=6):
    """MuJoCo states every ``every`` steps from the start: separated adhesive contacts
    first, then bodies resting and sliding on the moving surfaces."""
    mjd = mujoco.MjData(mjm)
    out = []
    for k in range(n * every):
        mujoco.mj_step(mjm, mjd)
        if k % every == 0:
            out.append(dict(qpos=mjd.qpos.copy(), qvel=mjd.qvel.copy(),
                            qacc_warmstart=mjd.qacc_warmstart.copy()))
    return out


def _solve_both(mjm, m, st):
    mjd = mujoco.MjData(mjm)
    for k, v in st.items():
        getattr(mjd, k)[:] = v
    mujoco.mj_forward(mjm, mjd)
    d = solve_jit(m, smooth_own_jit(canonical(m), to_data(io.make_data(m), st)))
    return mjd, d


def _rows_check(mjd, d):
    """Contacts' runtime dims and adhesion, qfrc_adhesion, efc_vel and efc_aref
    against MuJoCo's; returns the number of contacts of runtime dim 1 in larger slots."""
    con = jax.tree_util.tree_map(np.asarray, d.contact)
    slot = match_contacts(mjd, con)
    np.testing.assert_array_equal(con.dim[slot], mjd.contact.dim[:mjd.ncon])
    np.testing.assert_allclose(con.adhesion[slot], mjd.contact.adhesion[:mjd.ncon],
                               rtol=1e-15)
    np.testing.assert_allclose(np.asarray(d.qfrc_adhesion), mjd.qfrc_adhesion, rtol=0,
                               atol=1e-10)
    rows, _ = match_rows(mjd, d, slot)
    for f in ("efc_vel", "efc_aref"):
        np.testing.assert_allclose(np.asarray(getattr(d, f))[rows], getattr(mjd, f), rtol=0,
                                   atol=1e-10, err_msg=f)
    return int(np.sum((mjd.contact.dim[:mjd.ncon] == 1) &
                      (np.asarray(con.slot_dim)[slot] > 1)))


@pytest.mark.parametrize("cone,solver_type", [
    (PYR, NEWTON), (ELL, PGS),
    pytest.param(PYR, CG, marks=pytest.mark.slow),
    pytest.param(PYR, PGS, marks=pytest.mark.slow),
    pytest.param(ELL, NEWTON, marks=pytest.mark.slow),
    pytest.param(ELL, CG, marks=pytest.mark.slow)])
def test_solution_matches_mujoco(cone, solver_type):
    """qacc, efc_force (rows matched by type and id: a separated adhesive contact has
    one frictionless row) and qfrc_constraint to 1e-9; the rows' inputs exactly
    (above). The states hold contacts of runtime dim 1 in slots of dims 3, 4 and 6."""
    mjm = _mjmodel(cone, solver_type)
    m = model_from_mujoco(mjm)
    reduced = 0
    for st in _states(mjm):
        mjd, d = _solve_both(mjm, m, st)
        err = compare(mjd, d)
        assert max(err["qacc"], err["efc_force"], err["qfrc_constraint"]) < 1e-9, err
        reduced += _rows_check(mjd, d)
    assert reduced >= 10, reduced


def test_noslip_matches_mujoco():
    """PGS then noslip (pyramidal): a separated adhesive contact is frictionless, so
    noslip leaves it alone; qacc to 1e-9, each contact's normal force (its edges' sum)
    to 1e-6 of the largest, iteration counts equal."""
    mjm = _mjmodel(PYR, PGS, noslip=50)
    m = model_from_mujoco(mjm)
    for st in _states(mjm, n=6, every=10):
        mjd, d = _solve_both(mjm, m, st)
        err = compare(mjd, d)
        assert err["qacc"] < 1e-9, err
        con = jax.tree_util.tree_map(np.asarray, d.contact)
        slot = match_contacts(mjd, con)
        ours = np.asarray(rne_post.contact_force(m, d))[slot]
        ref = np.zeros((mjd.ncon, 6))
        for i in range(mjd.ncon):
            mujoco.mj_contactForce(mjm, mjd, i, ref[i])
        scale = max(1.0, np.abs(ref).max())
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-6 * scale)
        n = mjd.nisland
        np.testing.assert_array_equal(np.asarray(d.solver_niter)[:n], mjd.solver_niter[:n])


@pytest.mark.parametrize("cone", [PYR, pytest.param(ELL, marks=pytest.mark.slow)])
def test_trajectory_matches_mujoco(cone):
    """200 steps (1 s) of simjax.step with simjax's own compiler (geom and pair
    adhesion, surface velocities, gaps and priorities from the MJCF) against mj_step:
    qpos to 1e-10 (measured 7e-15); the bodies travel with the surfaces."""
    mjm = mujoco.MjModel.from_xml_path(MODEL)
    mjm.opt.cone = cone
    m = simjax.load_model(MODEL)
    m = m.replace(opt=m.opt.replace(cone=cone))
    run = jax.jit(lambda d: jax.lax.fori_loop(0, 50, lambda i, d: simjax.step(m, d), d))
    mjd = mujoco.MjData(mjm)
    d = io.make_data(m)
    for _ in range(4):
        for _ in range(50):
            mujoco.mj_step(mjm, mjd)
        d = run(d)
        np.testing.assert_allclose(np.asarray(d.qpos), mjd.qpos, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(d.sensordata), mjd.sensordata, rtol=0,
                               atol=1e-8 * max(1.0, np.abs(mjd.sensordata).max()))
    assert abs(mjd.qvel[0]) > 0.1             # the box rides the floor's drift


def test_sensors_match_mujoco():
    """touch, contact (net force: the solver's minus the adhesion) and force sensors on
    states with separated and touching adhesive contacts, to 1e-9 of the largest."""
    mjm = _mjmodel(PYR, NEWTON)
    m = model_from_mujoco(mjm)
    fwd = jax.jit(lambda d: simjax.forward(m, d))
    tension = 0
    for st in _states(mjm, n=8, every=8):
        mjd = mujoco.MjData(mjm)
        for k, v in st.items():
            getattr(mjd, k)[:] = v
        mujoco.mj_forward(mjm, mjd)
        d = fwd(io.make_data(m).replace(**{k: jnp.asarray(v) for k, v in st.items()}))
        scale = max(1.0, np.abs(mjd.sensordata).max())
        np.testing.assert_allclose(np.asarray(d.sensordata), mjd.sensordata, rtol=0,
                                   atol=1e-9 * scale)
        sid = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_SENSOR, "box_floor")
        adr = mjm.sensor_adr[sid]
        tension += int(mjd.sensordata[adr + 1] < 0)       # net normal force pulling
    assert tension >= 1


def test_gap_contacts_and_flags():
    """An adhesive contact in the gap is kept (exclude 0) with dim 1 and its rows; a
    non-adhesive one in the gap is excluded (exclude 1, no rows). Models without
    adhesion or surface velocity trace neither (static flags)."""
    mjm = _mjmodel(PYR, NEWTON)
    m = model_from_mujoco(mjm)
    st = _states(mjm, n=1)[0]
    mjd, d = _solve_both(mjm, m, st)
    con = jax.tree_util.tree_map(np.asarray, d.contact)
    v = con.valid
    assert np.all(con.dist[v] > con.includemargin[v])         # all separated here
    sticky = v & (con.adhesion != 0)
    assert sticky.sum() >= 3 and np.all(con.exclude[sticky] == 0)
    assert np.all(con.dim[sticky] == 1) and np.all(con.efc_address[sticky] >= 0)
    assert np.all(con.exclude[v & ~sticky] == 1)
    assert has_adhesion(m) and has_surfacevel(m)
    plain = model_from_mujoco(mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><geom type='plane' size='1 1 1'/></worldbody></mujoco>"))
    assert not has_adhesion(plain) and not has_surfacevel(plain)


#: a ball in the gap of an adhesive floor whose surface moves along x, under weak gravity:
#: the pull brings it down, then it rides the surface with the friction budget
#: mu (f_N + adhesion)
DRAG = """
<mujoco>
  <option gravity="0 0 -2" timestep="0.005" cone="elliptic" iterations="100"
          tolerance="1e-13"/>
  <worldbody>
    <geom type="plane" size="1 1 .1" adhesion="2" surfacevel="0.5 0 0 0 0 0"
          friction="0.3"/>
    <body pos="0 0 0.11">
      <freejoint/>
      <geom size="0.1" mass="0.5" gap="0.03"/>
    </body>
  </worldbody>
</mujoco>"""


def test_grad_wrt_adhesion_and_surface_velocity():
    """jax.jacrev of the ball's x and z after 60 steps (0.3 s: pulled through the gap,
    landed, dragged) with respect to the floor's adhesion and surface speed (traced
    Model fields) against central finite differences, relative 1e-5 (measured 2e-7);
    the trajectory is MuJoCo's (1e-10). Along it no constraint changes state within
    the finite differences' steps (a state change is a kink, where the two differ)."""
    mjm = mujoco.MjModel.from_xml_string(DRAG)
    m = model_from_mujoco(mjm)
    d0 = io.make_data(m)
    shape = np.shape(m.geom_surfacevel)

    def out(p):
        sv = jnp.asarray(m.geom_surfacevel).reshape(-1, 6).at[0, 0].set(p[1]).reshape(shape)
        mm = m.replace(geom_adhesion=jnp.asarray(m.geom_adhesion).at[0].set(p[0]),
                       geom_surfacevel=sv)
        d = jax.lax.fori_loop(0, 60, lambda i, d: simjax.step(mm, d), d0)
        return jnp.stack([d.qpos[0], d.qpos[2]])

    p0 = jnp.asarray([2.0, 0.5])
    # one program gives the Jacobian and the value (the differences call it too: one
    # compile, not two)
    jac_val = jax.jit(jax.jacrev(lambda p: (out(p),) * 2, has_aux=True))
    jac = np.asarray(jac_val(p0)[0])

    def f(p):
        return jac_val(p)[1]
    mjd = mujoco.MjData(mjm)
    for _ in range(60):
        mujoco.mj_step(mjm, mjd)
    np.testing.assert_allclose(np.asarray(f(p0)), mjd.qpos[[0, 2]], rtol=0, atol=1e-10)
    assert mjd.qpos[0] > 0.005                     # dragged along x
    eps = 1e-6
    fd = np.stack([(f(p0.at[i].add(eps)) - f(p0.at[i].add(-eps))) / (2 * eps)
                   for i in range(2)], 1)
    assert np.all(np.abs(fd) > 1e-5), fd
    np.testing.assert_allclose(jac, fd, rtol=1e-5)


@pytest.mark.parametrize("field", ["geom_surfacevel", "geom_adhesion"])
def test_derivative_at_zero(field):
    """Traced surface velocities or adhesion of zeros are skipped at run time;
    differentiated, they are computed: the rows' velocity (surface speed) and the
    reference and passive pull (adhesion), linear in the floor's parameter for a
    penetrating ball, have the derivative out(1) - out(0), not zero."""
    mjm = mujoco.MjModel.from_xml_string(DRAG.replace('surfacevel="0.5 0 0 0 0 0"',
                                                      'surfacevel="0 0 0 0 0 0"')
                                         .replace('adhesion="2"', 'adhesion="0"'))
    m = model_from_mujoco(mjm)
    d0 = io.make_data(m).replace(qpos=jnp.asarray([0, 0, 0.099, 1, 0, 0, 0.0]),
                                 qvel=jnp.asarray([0.1, 0, -0.2, 0, 0.3, 0]))
    shape = np.shape(getattr(m, field))

    def out(p):
        x = jnp.zeros(shape, p.dtype).reshape(m.ngeom, -1).at[0, 0].set(p).reshape(shape)
        d = simjax.forward(m.replace(**{field: x}), d0)
        return (d.efc_vel,) if field == "geom_surfacevel" else (d.efc_aref,
                                                                d.qfrc_adhesion)
    deriv = jax.jit(jax.jacfwd(out))(jnp.zeros(()))
    one, zero = jax.jit(out)(jnp.ones(())), jax.jit(out)(jnp.zeros(()))
    for dv, a, b in zip(deriv, one, zero):
        ref = np.asarray(a) - np.asarray(b)
        assert np.abs(ref).max() > 0.1
        np.testing.assert_allclose(dv, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
