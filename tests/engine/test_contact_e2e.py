"""Constraints end to end with simjax's own collision, against MuJoCo 4.0.0 (float64).

The pipeline is simjax's all the way (collision, make_constraint, reference, solver):
at states along MuJoCo trajectories (bodies on the floor, pushing against joint limits,
with friction loss and equality constraints where the model has them), contacts are
matched to MuJoCo's by geom pair and position (1e-6), efc rows by (type, id), and with
both solvers run to tight tolerance (tolerance 1e-15, 1000 iterations) qacc,
qfrc_constraint and every efc_force agree to 1e-6 relative (qacc / qfrc to
max(1, max |value|), forces to the largest force).

Mesh contacts: simjax's convex collider (convex.py) is not MuJoCo's MPR / multi-CCD, so
contact points between meshes differ slightly (trossen's gripper pads, mesh-mesh:
positions up to 1.5e-6, normals 1e-7, distances 3e-9): on models with meshes contacts
are matched within 1e-5, and the solution still agrees to 1e-6 (measured ~7e-9 on
trossen, the remainder being the contact geometry). A state whose contact set differs
from MuJoCo's fails the test.

Where simjax's contact geometry deliberately differs from MuJoCo's (the nut / bolt SDFs,
whose gradients MuJoCo takes by forward differences; height-field prisms, where MuJoCo's
EPA stops at its tolerance), the cases take MuJoCo's contacts (INJECTED: rows, reference
and solver still simjax's, 1e-6) and one case per model with simjax's own contacts is
held to the measured, amplified difference (TOL_OWN).

Also here: 100-step trajectories with contacts (step 10 tracks MuJoCo to 1e-4; the
divergence growth of the chaotic ones is printed), and inverse dynamics with contacts
(mj_invConstraint).
"""
from __future__ import annotations

import importlib

import jax
import mujoco
import numpy as np
import pytest

import simjax
from constraint_helpers import (canonical, inject_contacts, pendula_friction, smooth_jit,
                                solve_jit, tight)
from contact_e2e_helpers import compare, match_contacts, smooth_own_jit, trajectory_states
from engine_helpers import load, to_data
from mujoco_oracle import corpus_path
from simjax.engine import io
from simjax.errors import UnsupportedFeatureError

fwd = importlib.import_module("simjax.engine.forward")
NEWTON, CG, PGS = 2, 1, 0
PYRAMIDAL, ELLIPTIC = 0, 1
TOL = 1e-6
HFIELD = ("mjx_barkour_v0/assets/barkour_v0_mjx.xml",
          "mujoco_plugin_touch_grid/touch_grid.xml")
SDF = ("mujoco_plugin_sdf_torus/torus.xml", "mujoco_plugin_sdf_nutbolt/nutbolt.xml")
#: trajectory_states options per model (default: 60 warm-up steps): the shadow hand's
#: ball lands in the palm after ~240 steps (sphere-box and finger capsule contacts);
#: touch_grid's ellipsoid falls from 1 m onto its height field (~45 contacts from ~220)
STATES = {"mjx_shadow_hand/scene_right.xml": dict(warm=240),
          "mujoco_plugin_touch_grid/touch_grid.xml": dict(warm=300)}

#: name -> (corpus model, solver, cone or None (model's), number of states, model edit)
CASES = {
    "hopper_newton": ("gym_hopper/hopper.xml", NEWTON, None, 3, None),
}
SLOW = {}
for _rel, _short in (("gym_hopper/hopper.xml", "hopper"), ("gym_ant/ant.xml", "ant"),
                     ("gym_walker2d/walker2d.xml", "walker2d"),
                     ("gym_half_cheetah/half_cheetah.xml", "half_cheetah"),
                     ("mujoco_humanoid/humanoid.xml", "humanoid"),
                     ("gym_humanoid/humanoid.xml", "gym_humanoid"),
                     ("mjx_pendula/pendula.xml", "pendula"),
                     ("warp_jdotv_weld_3d/weld_3d.xml", "weld"),
                     ("warp_jdotv_connect_3d/connect_3d.xml", "connect"),
                     ("menagerie_trossen_wx250s/scene.xml", "trossen"),
                     ("mjx_shadow_hand/scene_right.xml", "shadow_hand"),
                     (HFIELD[0], "barkour"), (HFIELD[1], "touch_grid")):
    # trossen with PGS (elliptic cones, stopped at 1000 sweeps far from the optimum):
    # simjax follows MuJoCo's iterates, measured 5.7e-15 on the forces with MuJoCo's
    # contacts and 2.7e-8 (qacc 1.3e-9) with simjax's mesh contacts
    for _s, _sn in ((NEWTON, "newton"), (CG, "cg"), (PGS, "pgs")):
        SLOW[f"{_short}_{_sn}"] = (_rel, _s, None, 10, None)
    if _short in ("ant", "humanoid", "hopper"):
        for _s, _sn in ((NEWTON, "newton"), (CG, "cg")):
            SLOW[f"{_short}_elliptic_{_sn}"] = (_rel, _s, ELLIPTIC, 10, None)
SLOW["pendula_frictionloss_newton"] = ("mjx_pendula/pendula.xml", NEWTON, None, 10,
                                       pendula_friction)
SLOW["pendula_frictionloss_pgs"] = ("mjx_pendula/pendula.xml", PGS, None, 10,
                                    pendula_friction)
for _rel, _short in (("gym_pusher/pusher.xml", "pusher"), ("mujoco_car/car.xml", "car"),
                     ("mjx_sensor/sensor.xml", "sensor"),
                     ("gym_humanoidstandup/humanoidstandup.xml", "humanoidstandup"),
                     ("mjx_humanoid/humanoid.xml", "mjx_humanoid"),
                     ("mjx_convex/convex.xml", "convex"),
                     ("gym_inverted_pendulum/inverted_pendulum.xml", "inverted_pendulum"),
                     ("gym_inverted_double_pendulum/inverted_double_pendulum.xml",
                      "inverted_double_pendulum"),
                     ("gym_reacher/reacher.xml", "reacher"),
                     ("mujoco_plugin_sdf_torus/torus.xml", "sdf_torus"),
                     ("mujoco_plugin_sdf_nutbolt/nutbolt.xml", "sdf_nutbolt")):
    for _s, _sn in ((NEWTON, "newton"), (CG, "cg"), (PGS, "pgs")):
        SLOW[f"{_short}_{_sn}"] = (_rel, _s, None, 10, None)
#: the nut and bolt: MuJoCo's plugin gradients are forward differences (simjax's exact),
#: so the SDF descent ends ~5e-9 (depth) / ~2e-8 (normal) away from MuJoCo's, which the
#: nut wedged on the thread amplifies to ~4e-5 in qacc (measured): those cases take
#: MuJoCo's contacts (rows, reference and solver are simjax's; measured 1e-11), and
#: one case with simjax's own contacts is held to TOL_OWN_NUTBOLT
#: The same for the height fields: barkour's feet sink into the terrain and MuJoCo's EPA
#: stops at its tolerance on those deep sphere / prism penetrations (its contact point
#: lies ~2.5e-6 off the point its own normal and depth give, simjax's is exact),
#: measured 6e-5 in qacc with simjax's contacts and 4e-15 with MuJoCo's; touch_grid's
#: ellipsoid / prism contacts likewise (see TOL_POS): its ~50 stiff contacts (solimp
#: dmin 0) amplify MuJoCo's ~6e-7 shallower depths and ~3e-4 normals to 5.9e-3 in
#: qacc, 5.3e-4 in qfrc_constraint and 1.2e-2 in efc_force (measured; all within 1e-6
#: with MuJoCo's contacts injected)
INJECTED = {f"{_m}_{_sn}" for _sn in ("newton", "cg", "pgs")
            for _m in ("sdf_nutbolt", "barkour", "touch_grid")}
SLOW["sdf_nutbolt_own_newton"] = ("mujoco_plugin_sdf_nutbolt/nutbolt.xml", NEWTON, None,
                                  10, None)
SLOW["barkour_own_newton"] = (HFIELD[0], NEWTON, None, 10, None)
SLOW["touch_grid_own_newton"] = (HFIELD[1], NEWTON, None, 10, None)
#: tolerance of the own-contact cases above (the amplified contact-geometry difference)
TOL_OWN = {"sdf_nutbolt_own_newton": 1e-4, "barkour_own_newton": 1e-4,
           "touch_grid_own_newton": 2e-2}
#: PGS with MuJoCo's contacts follows MuJoCo's iterates (same shuffled block order,
#: islands, termination): measured 1.2e-14 (barkour), 6.4e-15 (touch_grid) and 4.8e-13
#: (shadow hand, impratio 10, where the 1e-15 tolerance ends the sweeps in rounding noise)
TOL_PGS = {"barkour_pgs": 1e-10, "touch_grid_pgs": 1e-10, "shadow_hand_pgs": 1e-10}
#: open differences (measured, not understood yet)
XFAIL = {}
SLOW["sensor_elliptic_newton"] = ("mjx_sensor/sensor.xml", NEWTON, ELLIPTIC, 10, None)
SLOW["trossen_pyramidal_newton"] = ("menagerie_trossen_wx250s/scene.xml", NEWTON, PYRAMIDAL,
                                    10, None)


def _load(rel, solver, cone, extra):
    """(MjModel, Model) with ``solver`` at tight tolerance; ``solver=None``: the model's
    own solver settings."""
    edit = None if solver is None else tight(solver, cone=cone, extra=extra)
    mjm, m = load(rel, constraints=True, edit=edit)
    if rel in SDF:
        # plugin SDF geoms need the plugin instances of simjax's own compiler
        m = simjax.load_model(corpus_path(rel)).replace(opt=m.opt)
    if rel in HFIELD:
        try:
            io.make_data(m)
            from simjax.engine.collision import driver
            driver.plan(m)
        except UnsupportedFeatureError as e:
            if "height" in str(e) or "hfield" in str(e).lower():
                pytest.skip(f"height-field collision not available: {e}")
            raise
    return mjm, m


def _solve(m, d):
    """simjax's pipeline: smooth stages with collision and constraint rows (one
    compilation per model structure, shared by every solver), then the solver."""
    return solve_jit(m, smooth_own_jit(canonical(m), d))


#: touch_grid's flat ellipsoid on height-field prisms: MuJoCo's EPA stops at
#: ccd_tolerance (1e-6) short of the optimum (its depths up to ~1e-6 shallower than the
#: exact minimum-penetration depth, which a direct optimisation of the separation
#: confirms for simjax's to ~1e-8), so its normals are ~3e-4 off and its contact
#: points, on a surface of curvature radius ~2.5, up to ~3e-4 away from simjax's
TOL_POS = {"mujoco_plugin_touch_grid/touch_grid.xml": 1e-3}


def _tol_pos(mjm, rel=None):
    """Contact matching distance: 1e-6, or 1e-5 where meshes collide (simjax's convex
    collider puts mesh-mesh contact points up to ~1.5e-6 from MuJoCo's, normals ~1e-7:
    measured on trossen's gripper pads), or TOL_POS's."""
    if rel in TOL_POS:
        return TOL_POS[rel]
    return 1e-5 if np.any(mjm.geom_type == mujoco.mjtGeom.mjGEOM_MESH) else 1e-6


def check_case(name, cases):
    rel, solver, cone, nstate, extra = cases[name]
    mjm, m = _load(rel, solver, cone, extra)
    mjd = mujoco.MjData(mjm)
    d0 = io.make_data(m)
    worst = dict(qacc=0.0, qfrc_constraint=0.0, efc_force=0.0)
    seen = dict(ncon=0, ne=0, nf=0, nl=0)
    for st in trajectory_states(mjm, nstate, seed=1, **STATES.get(rel, {})):
        for k, v in st.items():
            getattr(mjd, k)[:] = v
        mujoco.mj_forward(mjm, mjd)
        if name in INJECTED:
            d = solve_jit(m, smooth_jit(canonical(m), inject_contacts(m, to_data(d0, st),
                                                                      mjd)[1]))
        else:
            d = _solve(m, to_data(d0, st))
        err = compare(mjd, d, tol_pos=_tol_pos(mjm, rel))
        for k in worst:
            worst[k] = max(worst[k], err[k])
        for k in seen:
            seen[k] += err[k]
    print(f"{name}: max rel err {worst}; totals over {nstate} states {seen}")
    assert seen["ncon"] + seen["ne"] + seen["nf"] + seen["nl"] > 0
    tol = TOL_OWN.get(name, TOL_PGS.get(name, TOL))
    for k, v in worst.items():
        assert v < tol, (k, v)
    return worst, seen


@pytest.mark.parametrize("name", sorted(CASES))
def test_e2e(name):
    check_case(name, CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW))
def test_e2e_slow(name):
    if name in XFAIL:
        try:
            check_case(name, SLOW)
        except AssertionError as e:
            pytest.xfail(f"{XFAIL[name]} ({e})")
        return
    check_case(name, SLOW)


# --------------------------------------------------------------------------- inverse
INVERSE = ["gym_hopper/hopper.xml"]
INVERSE_SLOW = [("gym_ant/ant.xml", None), ("mujoco_humanoid/humanoid.xml", None),
                ("gym_ant/ant.xml", ELLIPTIC), ("mjx_pendula/pendula.xml", None),
                ("menagerie_trossen_wx250s/scene.xml", None),
                ("warp_jdotv_weld_3d/weld_3d.xml", None)]


def check_inverse(rel, cone=None, nstate=4):
    """qfrc_inverse (and efc_force, qfrc_constraint) of simjax.inverse at MuJoCo states
    with active constraints and a perturbed forward qacc, against mj_inverse."""
    mjm, m = _load(rel, NEWTON, cone, pendula_friction if "pendula" in rel else None)
    mjd = mujoco.MjData(mjm)
    inv = jax.jit(simjax.inverse)
    d0 = io.make_data(m)
    rng = np.random.default_rng(3)
    worst = 0.0
    nrow = 0
    for st in trajectory_states(mjm, nstate, seed=2):
        for k, v in st.items():
            getattr(mjd, k)[:] = v
        mujoco.mj_forward(mjm, mjd)
        qacc = mjd.qacc + 0.1 * np.abs(mjd.qacc).max() * rng.standard_normal(mjm.nv)
        mjd.qacc[:] = qacc
        mujoco.mj_inverse(mjm, mjd)
        d = inv(m, to_data(d0, dict(st, qacc=qacc)))
        scale = max(1.0, np.abs(mjd.qfrc_inverse).max())
        err = np.abs(np.asarray(d.qfrc_inverse) - mjd.qfrc_inverse).max() / scale
        slot = match_contacts(mjd, jax.tree_util.tree_map(np.asarray, d.contact),
                              _tol_pos(mjm))
        assert (slot >= 0).all()
        from constraint_helpers import match_rows
        rows, extra = match_rows(mjd, d, slot)
        assert (rows >= 0).all() and not extra.any()
        if mjd.nefc:
            fmax = max(1.0, np.abs(mjd.efc_force).max())
            err = max(err, np.abs(np.asarray(d.efc_force)[rows] - mjd.efc_force).max() / fmax)
        sc = max(1.0, np.abs(mjd.qfrc_constraint).max())
        err = max(err, np.abs(np.asarray(d.qfrc_constraint) - mjd.qfrc_constraint).max() / sc)
        worst = max(worst, err)
        nrow += mjd.nefc
        np.testing.assert_array_equal(np.asarray(d.qacc), qacc)
    print(f"inverse {rel} cone {cone}: max rel err {worst:.2e} over {nrow} efc rows")
    assert nrow > 0
    assert worst < TOL
    return worst


@pytest.mark.parametrize("rel", INVERSE)
def test_inverse_with_contacts(rel):
    check_inverse(rel)


@pytest.mark.slow
@pytest.mark.parametrize("rel,cone", INVERSE_SLOW)
def test_inverse_with_contacts_slow(rel, cone):
    check_inverse(rel, cone)


# --------------------------------------------------------------------------- trajectories
#: name -> corpus model; solver Newton at tight tolerance (the model's integrator),
#: contacts from simjax's collision at every step
TRAJ = {"hopper": "gym_hopper/hopper.xml"}
TRAJ_SLOW = {"humanoid": "mujoco_humanoid/humanoid.xml", "ant": "gym_ant/ant.xml",
             "walker2d": "gym_walker2d/walker2d.xml",
             "shadow_hand": "mjx_shadow_hand/scene_right.xml",
             "trossen": "menagerie_trossen_wx250s/scene.xml",
             "half_cheetah": "gym_half_cheetah/half_cheetah.xml",
             "barkour": HFIELD[0]}
#: the same with the model's own solver settings (barkour and the shadow hand: Newton
#: with iterations="1" ls_iterations="4", stopped long before convergence, so every
#: step follows MuJoCo's iterates, not just its optimum)
TRAJ_OWN = {"barkour": HFIELD[0], "shadow_hand": "mjx_shadow_hand/scene_right.xml"}
CHUNK = 10


def trajectory_errors(rel, nstep, seed=3, solver=NEWTON):
    """Per-step errors of a simjax trajectory against mj_step from a MuJoCo state in
    contact: (qpos max abs error (nstep,), qvel error relative to max(1, |qvel|)).
    ``solver=None``: the model's own solver settings."""
    mjm, m = _load(rel, solver, None, None)
    st = trajectory_states(mjm, 1, seed=seed, **STATES.get(rel, {}))[0]
    mjd = mujoco.MjData(mjm)
    for k, v in st.items():
        getattr(mjd, k)[:] = v
    d = to_data(io.make_data(m), st)

    @jax.jit
    def chunk(d):
        def body(d, _):
            d = fwd.step(m, d)
            return d, (d.qpos, d.qvel, d.ncon)
        return jax.lax.scan(body, d, None, length=CHUNK)

    eq, ev, ncon = [], [], []
    for _ in range(nstep // CHUNK):
        d, (qp, qv, nc) = chunk(d)
        for i in range(CHUNK):
            mujoco.mj_step(mjm, mjd)
            eq.append(np.abs(np.asarray(qp[i]) - mjd.qpos).max())
            ev.append(np.abs(np.asarray(qv[i]) - mjd.qvel).max() /
                      max(1.0, np.abs(mjd.qvel).max()))
            ncon.append((int(nc[i]), mjd.ncon))
    return np.array(eq), np.array(ev), ncon


def check_trajectory(rel, nstep, solver=NEWTON):
    eq, ev, ncon = trajectory_errors(rel, nstep, solver=solver)
    marks = [t for t in (1, 10, 20, 50, 100) if t <= nstep]
    growth = ", ".join(f"step {t}: qpos {eq[t - 1]:.1e} qvel {ev[t - 1]:.1e}" for t in marks)
    print(f"trajectory {rel} ({'own solver' if solver is None else 'tight'}): {growth}; "
          f"contacts (ours, MuJoCo) at step 10 {ncon[9]}, last {ncon[-1]}")
    assert sum(c[1] for c in ncon[:10]) > 0, "no contacts in the first 10 steps"
    assert np.all(np.isfinite(eq))
    assert eq[9] < 1e-4 and ev[9] < 1e-4, (eq[9], ev[9])
    return eq, ev


@pytest.mark.slow                      # ~25 s; test_trajectory_100 covers the same cases
@pytest.mark.parametrize("name", sorted(TRAJ))
def test_trajectory_10(name):
    check_trajectory(TRAJ[name], 10)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAJ_SLOW) + sorted(TRAJ))
def test_trajectory_100(name):
    check_trajectory({**TRAJ, **TRAJ_SLOW}[name], 100)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAJ_OWN))
def test_trajectory_100_own_solver(name):
    """100 steps with the model's own (early-stopped) solver settings.

    Measured: shadow hand qpos 4e-15 at step 10, 3e-14 at step 100; barkour 1.2e-6 at
    step 10, 3e-5 at step 100: MuJoCo's EPA stops at its tolerance on deep sphere /
    height-field prism penetrations (its contact point is ~1e-6 off the point its own
    normal and depth give; simjax's is exact); with MuJoCo's contacts injected at
    barkour states, simjax's rows and one-iteration solve agree with MuJoCo to 1e-14."""
    check_trajectory(TRAJ_OWN[name], 100, solver=None)
