"""Constraint solvers (Newton, CG, PGS, noslip) against MuJoCo 4.0.0, trajectories with
constraints, and gradients through the solver (implicit differentiation).

Both run to tight tolerance (tolerance 1e-15, 1000 iterations), so both reach the unique
optimum of the convex problem: qacc, qfrc_constraint and every efc_force must agree to
1e-6 relative (to the largest force / generalised force).
"""
from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from constraint_helpers import (canonical, check_solution, condim, inject_contacts,
                                match_rows, oracle_case, pendula_friction, smooth_jit,
                                solve_jit, tight)
from engine_helpers import f32, load, random_state, set_state, to_data
from mujoco_oracle import model_from_mujoco
from simjax.engine import io

fwd = importlib.import_module("simjax.engine.forward")
NEWTON, CG, PGS = 2, 1, 0


CASES = {
    "ant_newton": ("gym_ant/ant.xml", tight(NEWTON), dict(z=0.2, seed=1)),
    "ant_cg": ("gym_ant/ant.xml", tight(CG), dict(z=0.2, seed=1)),
    "ant_pgs": ("gym_ant/ant.xml", tight(PGS), dict(z=0.2, seed=1)),
    "ant_elliptic_newton": ("gym_ant/ant.xml", tight(NEWTON, cone=1), dict(z=0.2, seed=1)),
}

SLOW = {
    "ant_condim6_elliptic": ("gym_ant/ant.xml", tight(NEWTON, cone=1, extra=condim(6)),
                             dict(z=0.2, seed=1)),
    "ant_condim4_pyramidal": ("gym_ant/ant.xml", tight(NEWTON, extra=condim(4)),
                              dict(z=0.2, seed=1)),
    "pendula_ball_tendon_friction": ("mjx_pendula/pendula.xml",
                                     tight(NEWTON, extra=pendula_friction),
                                     dict(qscale=1.5, seed=10)),
    "humanoid_limits_cg": ("mujoco_humanoid/humanoid.xml", tight(CG, contacts=False),
                           dict(qscale=0.8, seed=2)),
    "trossen_newton": ("menagerie_trossen_wx250s/scene.xml", tight(NEWTON),
                       dict(qscale=1.0, seed=4)),
    "connect_newton": ("warp_jdotv_connect_3d/connect_3d.xml", tight(NEWTON), dict(seed=3)),
    "weld_newton": ("warp_jdotv_weld_3d/weld_3d.xml", tight(NEWTON), dict(seed=3)),
    "ant_elliptic_cg": ("gym_ant/ant.xml", tight(CG, cone=1), dict(z=0.2, seed=1)),
    "ant_noslip": ("gym_ant/ant.xml", tight(NEWTON, extra=lambda mjm: setattr(
        mjm.opt, "noslip_iterations", 200)), dict(z=0.2, seed=1)),
    "humanoid_newton": ("mujoco_humanoid/humanoid.xml", tight(NEWTON), dict(z=0.9, seed=5)),
    "humanoid_pgs": ("mujoco_humanoid/humanoid.xml", tight(PGS), dict(z=0.9, seed=5)),
    "walker_newton": ("gym_walker2d/walker2d.xml", tight(NEWTON), dict(z=0.1, seed=6)),
    "hopper_cg": ("gym_hopper/hopper.xml", tight(CG), dict(z=0.2, seed=9)),
    "barkour_newton": ("mjx_barkour_v0/assets/barkour_v0_mjx.xml", tight(NEWTON),
                       dict(z=0.1, seed=6)),
    "shadow_hand_newton": ("mjx_shadow_hand/scene_right.xml", tight(NEWTON),
                           dict(qscale=0.6, seed=7)),
    "trossen_pgs": ("menagerie_trossen_wx250s/scene.xml", tight(PGS), dict(qscale=1.0, seed=4)),
}


def check_solve(name, cases, tol=1e-6):
    rel, edit, opts = cases[name]
    mjm, m, mjd, slot, d = oracle_case(rel, edit, **opts)
    out = solve_jit(m, d)
    fmax = max(1e-9, np.abs(mjd.efc_force).max())
    assert fmax > 1e-6, "state without constraint force"
    scale_q = max(1.0, np.abs(mjd.qacc).max())
    assert np.abs(np.asarray(out.qacc) - mjd.qacc).max() / scale_q < tol
    scale_f = max(1.0, np.abs(mjd.qfrc_constraint).max())
    assert np.abs(np.asarray(out.qfrc_constraint) - mjd.qfrc_constraint).max() / scale_f < tol
    rows, extra = match_rows(mjd, out, slot)
    assert (rows >= 0).all() and not extra.any()
    err = np.abs(np.asarray(out.efc_force)[rows] - mjd.efc_force).max() / fmax
    assert err < tol, err
    off = ~np.asarray(out.efc_active)
    assert np.all(np.asarray(out.efc_force)[off] == 0)
    assert int(out.solver_niter[0]) >= 1
    return mjd, out


@pytest.mark.parametrize("name", sorted(CASES))
def test_solve(name):
    check_solve(name, CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW))
def test_solve_slow(name):
    check_solve(name, SLOW)


@pytest.mark.slow
def test_pgs_elliptic_not_worse_than_mujoco():
    """PGS with elliptic cones converges slowly (MuJoCo's own PGS stops far from the
    optimum on this state); ours must be cone-feasible, match MuJoCo's PGS forces (same
    iterates) and reach a dual cost no lower than the exact optimum (Newton)."""
    from simjax.engine import constraint as C
    from simjax.engine import solver as S
    mjm, m, mjd, slot, d = oracle_case("gym_ant/ant.xml", tight(PGS, cone=1), z=0.2, seed=1)
    out = solve_jit(m, d)
    rows, _ = match_rows(mjd, out, slot)
    lay = C.layout(m, C.slot_dims(d))
    p = S._problem(m, d, lay)
    from simjax.engine.pgs import _ar
    ar = np.asarray(_ar(p))
    b = np.asarray(out.efc_b)

    def dual(f):
        return 0.5 * f @ ar @ f + f @ b

    f_ours = np.asarray(out.efc_force)
    f_mj = np.zeros_like(f_ours)
    f_mj[rows] = mjd.efc_force
    newton = solve_jit(m.replace(opt=m.opt.replace(solver=NEWTON)), d)
    f_opt = np.asarray(newton.efc_force)
    assert dual(f_opt) - 1e-6 * abs(dual(f_opt)) <= dual(f_ours)
    # ours follows MuJoCo's iterates (same shuffled order): the same forces to rounding
    assert dual(f_ours) <= dual(f_mj) + 1e-12 * abs(dual(f_mj))
    assert np.abs(f_ours - f_mj).max() < 1e-10 * np.abs(f_mj).max()
    for blk in lay.blocks:
        if blk.kind == "conell":
            fb = f_ours[blk.start:blk.start + blk.n * blk.k].reshape(blk.n, blk.k)
            fr = np.asarray(d.contact.friction)[blk.ids][:, :blk.dim - 1]
            assert np.all(np.linalg.norm(fb[:, 1:] / fr, axis=1) <= fb[:, 0] * (1 + 1e-9))


def test_newton_matches_iteration_count():
    """Newton and CG reproduce MuJoCo's line search: same iteration counts."""
    for name in ("ant_newton", "ant_cg"):
        mjd, out = check_solve(name, CASES)
        np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)


def _walker_cg(tolerance):
    """oracle_case of a walker2d state with CG at ``tolerance`` (100 iterations, 50 line
    search iterations)."""
    def edit(mjm):
        tight(CG)(mjm)
        mjm.opt.tolerance = tolerance
        mjm.opt.iterations = 100
        mjm.opt.ls_iterations = 50
    return oracle_case("gym_walker2d/walker2d.xml", edit, qscale=1.0, seed=2)


def test_cg_stopping_rule_scale():
    """MuJoCo 4.0.0 scales the improvement and gradient of its stopping rule by
    1 / trace(M) (at the current configuration), not 1 / (meaninertia * nv). On this
    walker2d state trace(M) = 0.852 meaninertia * nv and CG at tolerance 1e-6 stops
    after 42 iterations as MuJoCo (the meaninertia scale stopped at 41, 4.5e-6 off
    MuJoCo's forces); forces to 1e-10 (measured 3e-14)."""
    mjm, m, mjd, slot, d = _walker_cg(1e-6)
    out = solve_jit(m, d)
    rows, extra = match_rows(mjd, out, slot)
    assert (rows >= 0).all() and not extra.any()
    err = np.abs(np.asarray(out.efc_force)[rows] - mjd.efc_force).max()
    assert err < 1e-10 * np.abs(mjd.efc_force).max(), err
    assert mjd.nisland == 1 and int(out.solver_niter[0]) == int(mjd.solver_niter[0]) == 42


# --------------------------------------------------------------------------- islands
def _island_solve(solver, islands, tolerance=1e-6, iterations=100):
    """MuJoCo's and our Newton / CG solve on the several-island scene of test_pgs (two
    stacked boxes, a sphere, a box, a hinged arm at its limit with friction loss: four
    islands), warm started, at ``tolerance`` (early stop: the iterates, not only the
    optimum, must agree)."""
    from test_pgs import _model, _state
    mjm = _model()
    st = _state(mjm)
    mjm.opt.solver = solver
    mjm.opt.tolerance = tolerance
    mjm.opt.iterations = iterations
    mjm.opt.ls_iterations = 50
    if not islands:
        mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_ISLAND
    m = model_from_mujoco(mjm)
    mjd = mujoco.MjData(mjm)
    for k, v in st.items():
        getattr(mjd, k)[:] = v
    mujoco.mj_forward(mjm, mjd)
    slot, d = inject_contacts(m, to_data(io.make_data(m), st), mjd)
    d = smooth_jit(canonical(m), d)
    return mjd, slot, solve_jit(m, d)


#: MuJoCo 4.0.0's iterations per island on this state at tolerance 1e-6
ISLAND_NITER = {(CG, True): [9, 2, 1, 5], (NEWTON, True): [1, 1, 1, 1],
                (CG, False): [10], (NEWTON, False): [1]}


@pytest.mark.parametrize("solver,islands", [
    (CG, True), pytest.param(NEWTON, True, marks=pytest.mark.slow),
    pytest.param(CG, False, marks=pytest.mark.slow),
    pytest.param(NEWTON, False, marks=pytest.mark.slow)])
def test_islands_match_mujoco(solver, islands):
    """Newton and CG solve every constraint island on its own (own line search, CG
    beta, stopping rule scaled by 1 / trace of the island's block of M), as MuJoCo
    4.0.0: at tolerance 1e-6 the iteration count of every island equals MuJoCo's
    (CG 9, 2, 1, 5; one problem, as with DisableBit.ISLAND, took 10: forces 5.6e-4
    from MuJoCo's), and forces agree to 1e-10 relative (measured 1.4e-14 .. 3.3e-14);
    with islands disabled everything is one problem (island 0), as MuJoCo. The last
    iteration's improvement and gradient of every island agree to 1e-6 relative where
    above rounding."""
    mjd, slot, out = _island_solve(solver, islands)
    assert mjd.nisland == (4 if islands else 0)
    expect = ISLAND_NITER[(solver, islands)]
    np.testing.assert_array_equal(mjd.solver_niter[:len(expect)], expect)
    np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)
    check_solution(mjd, slot, out, 1e-10)
    for i, n in enumerate(expect):
        stat = mjd.solver[i * mujoco.mjNSOLVER + n - 1]
        for ours, theirs in ((out.solver_improvement[i], stat.improvement),
                             (out.solver_gradient[i], stat.gradient)):
            if abs(theirs) > 1e-12:
                assert abs(float(ours) - theirs) < 1e-6 * abs(theirs), (i, ours, theirs)


def test_islands_in_chunks(monkeypatch):
    """Islands with the active rows in several small chunks (rows of an island in
    different chunks): CG's iterates as MuJoCo's (the iteration count of every island)
    and forces to 1e-10 relative, as on one chunk."""
    from simjax.engine import solver as S
    from simjax.engine import solver_rows as R
    monkeypatch.setattr(S, "row_capacity",
                        lambda spec: (4, tuple(2 for _ in spec.ell)))
    monkeypatch.setitem(globals(), "solve_jit", jax.jit(lambda m, d: S.fwd_constraint(m, d)))
    calls = []
    gather = R.gather
    monkeypatch.setattr(S, "gather_rows", lambda *a: calls.append(gather(*a)) or calls[-1])
    mjd, slot, out = _island_solve(CG, True)
    assert calls and calls[0].nchunk > 2 and mjd.nefc > 8     # three chunks in use at least
    np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)
    np.testing.assert_array_equal(mjd.solver_niter[:4], ISLAND_NITER[(CG, True)])
    check_solution(mjd, slot, out, 1e-10)


def test_newton_one_iteration_matches_mujoco():
    """Newton with iterations=1 (the bench models' setting; simjax unrolls the first
    pass and one iteration, without the Hessian factor after it) on the four-island
    scene, tolerance 1e-10 (no island converges in the first pass): every island's
    iteration count, forces to 1e-10 relative and the last improvement and gradient
    as MuJoCo's."""
    mjd, slot, out = _island_solve(NEWTON, True, tolerance=1e-10, iterations=1)
    assert mjd.nisland == 4
    np.testing.assert_array_equal(mjd.solver_niter[:4], [1, 1, 1, 1])
    np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)
    check_solution(mjd, slot, out, 1e-10)
    for i in range(4):
        stat = mjd.solver[i * mujoco.mjNSOLVER]
        for ours, theirs in ((out.solver_improvement[i], stat.improvement),
                             (out.solver_gradient[i], stat.gradient)):
            if abs(theirs) > 1e-12:
                assert abs(float(ours) - theirs) < 1e-6 * abs(theirs), (i, ours, theirs)


def test_newton_one_iteration_in_chunks(monkeypatch):
    """Newton with iterations=1 on the four-island scene with the active rows in
    several small chunks (the first pass's sums over the later chunks made by the warm
    start's pass, the rows of the dofs in no island kept from it): iteration counts and
    forces as MuJoCo's (1e-10 relative), alone and under vmap (the later chunks in
    blocks of the worlds that use them, and on the whole batch)."""
    from simjax.engine import solver as S
    from simjax.engine import solver_gather as G
    from simjax.engine import solver_rows as R
    monkeypatch.setattr(S, "row_capacity",
                        lambda spec: (4, tuple(2 for _ in spec.ell)))
    seen = []
    solve = jax.jit(lambda m, d: S.fwd_constraint(m, d))
    monkeypatch.setitem(globals(), "solve_jit", lambda m, d: seen.append((m, d)) or solve(m, d))
    calls = []
    gather = R.gather
    monkeypatch.setattr(S, "gather_rows", lambda *a: calls.append(gather(*a)) or calls[-1])
    mjd, slot, out = _island_solve(NEWTON, True, tolerance=1e-10, iterations=1)
    assert calls and calls[0].nchunk > 2 and mjd.nisland == 4
    np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)
    check_solution(mjd, slot, out, 1e-10)
    # the same world twice under vmap
    m, d = seen[0]
    two = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), d)
    for few in (True, False):
        monkeypatch.setattr(G, "_few_rows", lambda spec: few)
        batched = jax.jit(jax.vmap(lambda d: S.fwd_constraint(m, d)))(two)
        for w in range(2):
            np.testing.assert_allclose(np.asarray(batched.qacc[w]), np.asarray(out.qacc),
                                       rtol=1e-8, atol=1e-8)


# --------------------------------------------------------------------------- trajectories
def _trajectory(rel, edit, nstep, seed=0, qscale=0.5):
    mjm, m = load(rel, constraints=True, edit=edit)
    mjd = mujoco.MjData(mjm)
    st = random_state(mjm, np.random.default_rng(seed), qscale=qscale)
    set_state(mjm, mjd, st)
    d = to_data(io.make_data(m), st)
    step = jax.jit(lambda d: jax.lax.fori_loop(0, nstep, lambda i, d: fwd.step(m, d), d))
    out = step(d)
    for _ in range(nstep):
        mujoco.mj_step(mjm, mjd)
    return mjd, out


@pytest.mark.parametrize("rel", ["menagerie_trossen_wx250s/scene.xml",
                                 pytest.param("warp_jdotv_weld_3d/weld_3d.xml",
                                              marks=pytest.mark.slow)])
def test_trajectory_contact_free(rel):
    """10 steps with equality, friction loss and limits (contacts off) track MuJoCo."""
    edit = tight(NEWTON, contacts=False)
    mjd, out = _trajectory(rel, edit, 10)
    assert np.abs(np.asarray(out.qpos) - mjd.qpos).max() < 1e-4
    assert np.abs(np.asarray(out.qvel) - mjd.qvel).max() / max(1, np.abs(mjd.qvel).max()) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("rel", ["mujoco_humanoid/humanoid.xml", "gym_ant/ant.xml"])
def test_trajectory_100_limits(rel):
    """Contact-free humanoid / ant (joint and tendon limits): step 10 tracks MuJoCo to
    1e-4, 100 steps stay finite and close."""
    edit = tight(NEWTON, contacts=False)
    mjd, out = _trajectory(rel, edit, 10, qscale=0.8)
    assert np.abs(np.asarray(out.qpos) - mjd.qpos).max() < 1e-4
    mjd, out = _trajectory(rel, edit, 100, qscale=0.8)
    assert np.all(np.isfinite(np.asarray(out.qpos)))
    assert np.abs(np.asarray(out.qpos) - mjd.qpos).max() < 1e-2


# --------------------------------------------------------------------------- gradients
def _fd(f, x, eps=1e-6):
    out = np.zeros(x.shape[0])
    for i in range(x.shape[0]):
        e = np.zeros(x.shape[0])
        e[i] = eps
        out[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return out


def test_grad_solver_matches_fd():
    """Implicit differentiation of the solve (contacts, limits; Newton) w.r.t. the smooth
    force and velocity matches central finite differences."""
    mjm, m, mjd, slot, d = oracle_case("gym_ant/ant.xml", tight(NEWTON, extra=lambda mjm:
                                       setattr(mjm.opt, "iterations", 100)), z=0.2, seed=1)
    from simjax.engine import constraint, solver, tree_linalg
    w = jnp.asarray(np.random.default_rng(1).standard_normal(m.nv))

    def loss(x):
        qfrc = d.qfrc_smooth + x
        dd = d.replace(qfrc_smooth=qfrc, qacc_smooth=tree_linalg.solve_ld(m, d.qLD, qfrc),
                       qvel=d.qvel + 0.01 * x)
        dd = constraint.reference_constraint(m, dd)
        out = solver.fwd_constraint(m, dd)
        return jnp.dot(out.qacc, w) + 1e-3 * jnp.sum(out.efc_force)

    x0 = jnp.zeros(m.nv)
    g = np.asarray(jax.jit(jax.grad(loss))(x0))
    fd = _fd(jax.jit(loss), x0)
    err = np.abs(g - fd) / np.maximum(1e-3 * np.abs(fd).max(), np.abs(fd))
    assert err.max() < 1e-3, (g, fd)


@pytest.mark.slow
def test_grad_through_steps_matches_fd():
    """d(final qvel . w)/d(initial qvel) through steps with active limits, friction loss
    and equality rows (opt.iterations=100) matches central finite differences."""
    edit = tight(NEWTON, contacts=False, extra=lambda mjm: setattr(mjm.opt, "iterations", 100))
    mjm, m = load("menagerie_trossen_wx250s/scene.xml", constraints=True, edit=edit)
    st = random_state(mjm, np.random.default_rng(4), qscale=1.0)
    d0 = to_data(io.make_data(m), st)
    w = jnp.asarray(np.random.default_rng(1).standard_normal(m.nv))

    def loss(qvel):
        d = d0.replace(qvel=qvel)
        d = jax.lax.fori_loop(0, 3, lambda i, d: fwd.step(m, d), d)
        return jnp.dot(d.qvel, w)

    d1 = jax.jit(fwd.forward)(m, d0)
    assert int(d1.nefc) > 0 and int(d1.nf) > 0
    g = np.asarray(jax.jit(jax.grad(loss))(d0.qvel))
    f = jax.jit(loss)
    eps = 1e-6
    fd = np.zeros(m.nv)
    for i in range(m.nv):
        e = np.zeros(m.nv)
        e[i] = eps
        fd[i] = (f(d0.qvel + e) - f(d0.qvel - e)) / (2 * eps)
    err = np.abs(g - fd) / np.maximum(1e-3 * np.abs(fd).max(), np.abs(fd))
    assert err.max() < 1e-3, (g, fd)


def test_vmap_over_worlds():
    """The solver batches under vmap (while_loops run until every world is done) and
    each world's solution equals the unbatched one."""
    from simjax.engine import solver
    mjm, m, mjd, slot, d = oracle_case("gym_ant/ant.xml", tight(NEWTON), z=0.2, seed=1)
    one = solve_jit(m, d)
    batch = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), d)
    batch = batch.replace(efc_aref=batch.efc_aref.at[1].multiply(0.5))
    out = jax.jit(jax.vmap(solver.fwd_constraint, in_axes=(None, 0)))(m, batch)
    scale = max(1.0, np.abs(np.asarray(one.qacc)).max())
    assert np.abs(np.asarray(out.qacc[0]) - np.asarray(one.qacc)).max() / scale < 1e-12
    other = solve_jit(m, d.replace(efc_aref=d.efc_aref * 0.5))
    assert np.abs(np.asarray(out.qacc[1]) - np.asarray(other.qacc)).max() / scale < 1e-12


@pytest.mark.parametrize("case", ["ant_newton", "ant_elliptic_newton"])
@pytest.mark.parametrize("fit", [True, False])
def test_compact_rows(case, fit, monkeypatch):
    """Newton iterates on the active rows gathered into chunks: one chunk that just
    fits them gives MuJoCo's solution, and smaller chunks (several in use) the same."""
    from simjax.engine import constraint as C
    from simjax.engine import solver as S
    from simjax.engine import solver_rows as R
    rel, edit, opts = CASES[case]
    mjm, m, mjd, slot, d = oracle_case(rel, edit, **opts)
    lay = C.layout(m, C.slot_dims(d))
    spec = S.spec_from_layout(lay, m.nv)
    act = np.asarray(d.efc_active)
    ns = int(act[~R.ell_mask(spec)].sum())
    ne = [int(act[st:st + n * dim:dim].sum()) for st, n, dim in spec.ell]
    less = 0 if fit else 2
    caps = (max(1, ns - less), tuple(max(1, k - less) for k in ne))
    assert fit or ns > 2 or any(k > 2 for k in ne)
    rows = R.gather(spec, S._problem(m, d, lay), caps)
    assert (int(rows.nact) == 1) == fit
    monkeypatch.setattr(S, "row_capacity", lambda spec: caps)
    cases = {"case": CASES[case]}
    monkeypatch.setitem(globals(), "solve_jit", jax.jit(lambda m, d: S.fwd_constraint(m, d)))
    check_solve("case", cases)


@pytest.mark.parametrize("compact,gather,per_world", [
    (8, 0, True), (2, 0, True), (2, 3, True), (2, 3, False)])
@pytest.mark.parametrize("blocks,block", [(False, 1), (True, 1), (True, 2)])
def test_chunks_under_vmap(monkeypatch, blocks, block, compact, gather, per_world):
    """Worlds of a batch that use different numbers of row chunks (the chunk loop runs
    to the largest count of the batch, or of a block of the worlds that use the later
    chunks, here one or two worlds per block, the last block of two padded) each get
    the solution on the whole rows; with ``compact`` 2 Newton's last passes run on the
    one world left live, gathered (solver_worlds.live_loop), the table of the worlds
    using the later chunks remade for it; with ``gather`` 3 every pass runs on one live
    world gathered; without ``per_world`` (as on a GPU) every loop runs on the whole
    batch, whatever the other settings."""
    from simjax.engine import solver as S
    from simjax.engine import solver_gather as G
    from simjax.engine import solver_rows as R
    from simjax.engine import solver_worlds as W
    monkeypatch.setattr(W, "_PER_WORLD_WORK", per_world)
    monkeypatch.setattr(G, "_few_rows", lambda spec: blocks)
    monkeypatch.setattr(R, "_CHUNK_BLOCK", block)
    monkeypatch.setattr(W, "_COMPACT", compact)
    monkeypatch.setattr(W, "_GATHER", gather)
    rel, edit, opts = CASES["ant_newton"]
    mjm, m, mjd, slot, d = oracle_case(rel, edit, **opts)
    on = np.nonzero(np.asarray(d.efc_active))[0]
    off = on[:len(on) // 2]          # rows made inactive in the second world
    d1 = d.replace(efc_active=d.efc_active.at[off].set(False),
                   efc_D=d.efc_D.at[off].set(0.0), efc_J=d.efc_J.at[off].set(0.0))
    # compacted: the world with the later chunks last live (as the batch's one laggard)
    order = [0, 1, 0] if compact == 8 else [1, 0, 1]
    batch = jax.tree_util.tree_map(lambda *a: jnp.stack([a[i] for i in order]), d, d1)

    def fwd(m, d):
        return S.fwd_constraint(m, d).qacc

    monkeypatch.setattr(S, "row_capacity", lambda spec: (spec.nefc, ()))
    want = [np.asarray(jax.jit(fwd)(m, x)) for x in (d, d1)]
    caps = (max(1, len(on) // 3), ())
    monkeypatch.setattr(S, "row_capacity", lambda spec: caps)
    got = np.asarray(jax.jit(jax.vmap(fwd, in_axes=(None, 0)))(m, batch))
    one = np.asarray(jax.jit(fwd)(m, d))
    scale = max(1.0, np.abs(want[0]).max())
    for w, g in zip([want[i] for i in order] + [want[0]], list(got) + [one]):
        assert np.abs(g - w).max() / scale < 1e-12


@pytest.mark.parametrize("gather", [3, 0])
def test_chunk_sources_lazy(monkeypatch, gather):
    """With every pass on one live world gathered (``gather`` 3, solver_worlds.
    live_loop), the later chunks' sources are gathered only on the passes of a world
    that uses them: on the others they are NaN (solver_worlds._POISON), and each world
    of a batch mixing one-chunk worlds with a world using three gets its solution on
    the whole rows (``gather`` 0: the passes on the batch, the same check)."""
    from simjax.engine import solver as S
    from simjax.engine import solver_worlds as W
    monkeypatch.setattr(W, "_PER_WORLD_WORK", True)
    monkeypatch.setattr(W, "_COMPACT", 2)
    monkeypatch.setattr(W, "_GATHER", gather)
    monkeypatch.setattr(W, "_POISON", True)
    rel, edit, opts = CASES["ant_newton"]
    mjm, m, mjd, slot, d = oracle_case(rel, edit, **opts)
    on = np.nonzero(np.asarray(d.efc_active))[0]
    cap = max(1, len(on) // 3)
    off = on[cap:]                   # the second world's rows fit in chunk 0
    d1 = d.replace(efc_active=d.efc_active.at[off].set(False),
                   efc_D=d.efc_D.at[off].set(0.0), efc_J=d.efc_J.at[off].set(0.0))
    order = [1, 0, 1]
    batch = jax.tree_util.tree_map(lambda *a: jnp.stack([a[i] for i in order]), d, d1)

    def fwd(m, d):
        return S.fwd_constraint(m, d).qacc

    monkeypatch.setattr(S, "row_capacity", lambda spec: (spec.nefc, ()))
    want = [np.asarray(jax.jit(fwd)(m, x)) for x in (d, d1)]
    monkeypatch.setattr(S, "row_capacity", lambda spec: (cap, ()))
    got = np.asarray(jax.jit(jax.vmap(fwd, in_axes=(None, 0)))(m, batch))
    scale = max(1.0, np.abs(want[0]).max())
    for w, g in zip([want[i] for i in order], got):
        assert np.abs(g - w).max() / scale < 1e-12


def _newton_worlds(case, monkeypatch, compact, gather, scales, seed):
    """(m, mjd, d, solve, worlds, batch) for the Newton-under-vmap tests: MuJoCo's state
    ``d`` of ``case`` and copies warm-started at the solution plus ``scales`` times a
    random vector, stacked as ``batch``; ``solve`` returns (qacc, solver_niter)."""
    from simjax.engine import solver as S
    from simjax.engine import solver_worlds as W
    monkeypatch.setattr(W, "_COMPACT", compact)
    monkeypatch.setattr(W, "_GATHER", gather)
    # compact 0: the whole batch, as on a GPU (else the machinery, on every backend)
    monkeypatch.setattr(W, "_PER_WORLD_WORK", bool(compact))
    rel, edit, opts = CASES[case]
    mjm, m, mjd, slot, d = oracle_case(rel, edit, **opts)

    def solve(m, d):
        out = S.fwd_constraint(m, d)
        return out.qacc, out.solver_niter

    star = jax.jit(solve)(m, d)[0]
    rng = np.random.default_rng(seed)
    worlds = [d] + [d.replace(qacc_warmstart=star + s * jnp.asarray(
        rng.standard_normal(m.nv))) for s in scales]
    batch = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *worlds)
    return m, mjd, d, solve, worlds, batch


@pytest.mark.parametrize("case,compact,gather", [
    (case, compact, gather) for case in ("ant_newton", "ant_elliptic_newton")
    for compact, gather in ((8, 0), (2, 0), (2, 2), (0, 0))
    if case == "ant_newton" or (compact, gather) in ((2, 0), (0, 0))] + [
    pytest.param("ant_elliptic_newton", *cg, marks=pytest.mark.slow)      # ~9 s each
    for cg in ((8, 0), (2, 2))])
def test_newton_factor_under_vmap(case, compact, gather, monkeypatch):
    """Newton keeps its Hessian factor where no row changed state and remakes it under
    vmap only on the worlds that need it: worlds of one batch starting from different
    points (different iterations and active sets) each get their own solution and
    iteration count, as solved alone, and MuJoCo's iteration count; with ``compact`` 2
    the last passes run on the (at most two) worlds left live, gathered
    (solver_worlds.live_loop); with ``gather`` 2 every pass runs on two live worlds
    gathered; with ``compact`` 0 the machinery is off (solver_worlds._PER_WORLD_WORK,
    as on a GPU): every pass and factorisation on the whole batch."""
    # warmstarts at the solution, near it, and away from it
    m, mjd, d, solve, worlds, batch = _newton_worlds(
        case, monkeypatch, compact, gather, (0.0, 1e-3, 1.0), 0)
    got = jax.jit(jax.vmap(solve, in_axes=(None, 0)))(m, batch)
    niters = set()
    for i, x in enumerate(worlds):
        qacc, niter = jax.jit(solve)(m, x)
        scale = max(1.0, float(np.abs(np.asarray(qacc)).max()))
        assert np.abs(np.asarray(got[0][i]) - np.asarray(qacc)).max() / scale < 1e-12
        np.testing.assert_array_equal(np.asarray(got[1][i]), np.asarray(niter))
        niters.add(int(niter[0]))
    assert len(niters) > 1          # the worlds iterate differently
    # the first world is MuJoCo's state: its iterations as MuJoCo's (a stale factor
    # still converges, in more iterations)
    np.testing.assert_array_equal(np.asarray(got[1][0]), mjd.solver_niter)


@pytest.mark.parametrize("case,gather", [
    ("ant_newton", 0), ("ant_newton", 2),
    pytest.param("ant_elliptic_newton", 2, marks=pytest.mark.slow),      # ~18 s
    pytest.param("ant_elliptic_newton", 0, marks=pytest.mark.slow)])     # ~11 s
def test_newton_own_jt(case, gather, monkeypatch):
    """Newton's factorisations making chunk 0's J' from the J they are handed
    (solver_primal._JT_OWN) give the solution (up to the products' rounding) and
    iteration counts that the J' of the solve gives: one world, and worlds of a batch
    remade apart (solver_worlds.where_needed) on passes over the batch or on gathered
    worlds."""
    from simjax.engine import solver_primal as P
    m, mjd, d, solve, worlds, batch = _newton_worlds(
        case, monkeypatch, 2, gather, (1e-3, 1.0), 1)
    outs = {}
    for own in (False, True):
        monkeypatch.setattr(P, "_JT_OWN", own)
        outs[own] = (jax.jit(solve)(m, d),
                     jax.jit(jax.vmap(solve, in_axes=(None, 0)))(m, batch))
    for (qa, na), (qb, nb) in zip(outs[False], outs[True]):
        scale = max(1.0, float(np.abs(np.asarray(qa)).max()))
        assert np.abs(np.asarray(qa) - np.asarray(qb)).max() / scale < 1e-12
        np.testing.assert_array_equal(np.asarray(na), np.asarray(nb))
    # and MuJoCo's iterations on its own state
    np.testing.assert_array_equal(np.asarray(outs[True][0][1]), mjd.solver_niter)
    np.testing.assert_array_equal(np.asarray(outs[True][1][1][0]), mjd.solver_niter)


@pytest.mark.parametrize("kinds", ["uniform", "mixed"])
def test_update_static_masks(kinds):
    """update() with static row masks the same on every row (their selects left out:
    solver_cost._maybe) gives the forces, states and cost it gives with the masks
    traced; mixed masks keep every select."""
    import dataclasses

    from simjax.engine.solver_cost import Spec, update
    rng = np.random.default_rng(3)
    n = 12
    if kinds == "uniform":
        eq, fric, ineq = np.zeros(n, bool), np.zeros(n, bool), np.ones(n, bool)
    else:
        t = rng.integers(0, 3, n)
        eq, fric, ineq = t == 0, t == 1, t == 2
    spec = Spec(eq=eq, fric=fric, ineq=ineq, ell=(), nefc=n, nv=3)
    traced = dataclasses.replace(spec, eq=jnp.asarray(eq), fric=jnp.asarray(fric),
                                 ineq=jnp.asarray(ineq))
    p = dict(D=jnp.asarray(rng.random(n) + 0.5), R=jnp.asarray(rng.random(n) + 0.1),
             floss=jnp.asarray(rng.random(n) * fric), active=jnp.asarray(rng.random(n) < 0.8),
             mu=(), fr=())
    jar = jnp.asarray(rng.standard_normal(n))
    for a, b in zip(update(spec, p, jar), update(traced, p, jar)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("fric", [False, True])
def test_eval_tied(fric):
    """The line search's row sums (solver_search._eval) with chunk 0's terms tied to
    the step length by an optimisation barrier (tie, as in the loop) are those made
    untied, bit for bit, inside a loop as outside; _prepare's fourth column is the
    one-sided rows' cost at 0 (0.5 D jaref^2 where jaref < 0, else 0)."""
    from simjax.engine.solver_cost import Spec
    from simjax.engine.solver_islands import Islands
    from simjax.engine.solver_search import _eval, _prepare
    rng = np.random.default_rng(5)
    n, nv = 14, 4
    t = rng.integers(0, 3 if fric else 2, n)
    eq, ineq, fr = t == 0, t == 1, t == 2
    spec = Spec(eq=eq, fric=fr, ineq=ineq, ell=(), nefc=n, nv=nv)
    p = dict(D=jnp.asarray(rng.random(n) + 0.5), R=jnp.asarray(rng.random(n) + 0.1),
             floss=jnp.asarray(rng.random(n) * fr), active=jnp.ones(n, bool),
             mu=(), fr=())
    J = jnp.asarray(rng.standard_normal((n, nv)))
    jaref = jnp.asarray(rng.standard_normal(n))
    search = jnp.asarray(rng.standard_normal(nv))
    pre = _prepare(spec, p, J, jaref, search)
    quad = np.asarray(pre["quad"])
    cost = 0.5 * np.asarray(jaref) * (np.asarray(p["D"]) * np.asarray(jaref))
    np.testing.assert_array_equal(quad[:, 3], np.where(np.asarray(jaref) < 0, cost, 0.0))
    isl = Islands(1)
    alphas = jnp.asarray([[0.0], [0.3], [-0.7], [1.9]])

    def sums(tie):
        def body(i, acc):
            a = alphas[i]
            return acc.at[i].set(_eval(spec, p, isl, pre, jaref, a, jnp.zeros((1, 6)),
                                       fric, tie=tie)[0])
        looped = jax.jit(lambda: jax.lax.fori_loop(0, 4, body, jnp.zeros((4, 6))))()
        direct = [_eval(spec, p, isl, pre, jaref, a, jnp.zeros((1, 6)), fric, tie=tie)
                  for a in alphas]
        return np.asarray(looped), np.concatenate([np.asarray(x) for x in direct])

    (lt, dt), (lu, du) = sums(True), sums(False)
    np.testing.assert_array_equal(lt, lu)
    np.testing.assert_array_equal(dt, du)
    # at alpha 0 no one-sided row changes its cost (quad0 - cost0 is zero on the rows
    # with jaref < 0, the others are not active)
    assert dt[0, 0] == 0.0


# --------------------------------------------------------------------------- float32
def test_solver_tolerance_rule(monkeypatch):
    """float32 solves stop at max(opt.tolerance, 1e-6) (MuJoCo Warp's float32 rule),
    concrete or traced; float64 ones at opt.tolerance."""
    from simjax.engine import solver
    assert solver.solver_tolerance(1e-8, jnp.float32) == 1e-6
    assert solver.solver_tolerance(1e-5, jnp.float32) == 1e-5
    assert solver.solver_tolerance(1e-8, jnp.float64) == 1e-8
    traced = jax.jit(lambda t: solver.solver_tolerance(t, jnp.float32))
    assert float(traced(jnp.float32(1e-8))) == np.float32(1e-6)
    assert float(traced(jnp.float32(1e-4))) == np.float32(1e-4)
    monkeypatch.setattr(solver, "_F32_TOLERANCE", 0)
    assert solver.solver_tolerance(1e-8, jnp.float32) == 1e-8


@pytest.mark.parametrize("closed", [True, False])
def test_float32_solve_tolerance(closed, monkeypatch):
    """A float32 CG solve at opt.tolerance 1e-8 (walker2d, the state of
    test_cg_stopping_rule_scale) gives the bits of a float32 solve at 1e-6 without the
    float32 rule, and fewer iterations than 1e-8 without it (measured 40 against 45); its
    forces stay within 3e-5 of the largest of MuJoCo's float64 ones at 1e-8 (measured
    7.4e-6; float64 CG at 1e-6 stopped 4.5e-6 off them in test_cg_stopping_rule_scale).
    With the Model closed over (tolerance a constant) and passed to the jit (traced)."""
    from simjax.engine import solver
    mjm, m, mjd, slot, d = _walker_cg(1e-8)
    m32, d32 = f32(m), f32(d)

    def solve(mm, floor):
        # a new function per call: the switch is read at trace time
        monkeypatch.setattr(solver, "_F32_TOLERANCE", floor)
        if closed:
            return jax.jit(lambda dd: solver.fwd_constraint(mm, dd))(d32)
        return jax.jit(lambda m_, dd: solver.fwd_constraint(m_, dd))(mm, d32)

    raised = solve(m32, 1e-6)
    at_1e6 = solve(m32.replace(opt=m32.opt.replace(tolerance=np.float32(1e-6))), 0)
    plain = solve(m32, 0)
    assert raised.qacc.dtype == jnp.float32
    for a, b in zip(jax.tree_util.tree_leaves(raised), jax.tree_util.tree_leaves(at_1e6)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    n_raised, n_plain = int(raised.solver_niter[0]), int(plain.solver_niter[0])
    assert n_raised < n_plain, (n_raised, n_plain)
    rows, extra = match_rows(mjd, raised, slot)
    assert (rows >= 0).all() and not extra.any()
    err = np.abs(np.asarray(raised.efc_force, np.float64)[rows] - mjd.efc_force).max()
    assert err < 3e-5 * np.abs(mjd.efc_force).max(), err


@pytest.mark.slow
def test_float32_sensor_scene_iterations(monkeypatch):
    """mjx_sensor's float32 batch (64 worlds: 10 MuJoCo steps from its start, then
    velocities perturbed by 1e-2, 3 steps): without the float32 rule Newton ran some
    world to its 100-iteration limit (at tolerance 1e-8 its improvement stalled at
    1.5e-8 to 8.9e-8); with it, every world stops within 10 iterations (at batch 256
    over 20 steps: mean 1.75, max 5; MuJoCo's float64 counts on these states 1-2)."""
    import simjax
    from simjax.engine import solver
    mjm, m = load("mjx_sensor/sensor.xml", constraints=True)
    mjd = mujoco.MjData(mjm)
    for _ in range(10):
        mujoco.mj_step(mjm, mjd)
    rng = np.random.default_rng(0)
    qvel = mjd.qvel + 1e-2 * rng.standard_normal((64, mjm.nv))
    d0 = f32(io.make_data(m))
    batch = jax.vmap(lambda v: d0.replace(qpos=jnp.asarray(mjd.qpos, jnp.float32),
                                          qvel=v))(jnp.asarray(qvel, jnp.float32))
    m32 = f32(m)

    def niter(floor):
        monkeypatch.setattr(solver, "_F32_TOLERANCE", floor)
        step = jax.jit(jax.vmap(lambda d: simjax.step(m32, d)))
        out, most = batch, []
        for _ in range(3):
            out = step(out)
            most.append(int(np.asarray(out.solver_niter).max()))
        return max(most)

    assert niter(1e-6) <= 10
    assert niter(0) == 100
