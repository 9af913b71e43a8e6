"""PGS (simjax.engine.pgs) against MuJoCo 4.0.0's mj_solPGS iterate by iterate.

MuJoCo's PGS visits the constraint blocks of each island in an order shuffled before
every sweep by a seeded PCG32 generator, with Nesterov momentum and termination per
island. simjax reproduces the order, so the forces after any number of sweeps (not only
at convergence) agree with MuJoCo's to rounding: asserted at 1e-12 relative to the
largest force (measured 1e-15 .. 2e-14) after 1 and 5 sweeps, cold and warm started,
and at convergence, on a scene with several islands (boxes on a plane, one stacked on
another, a hinged arm against its limit with friction loss), pyramidal and elliptic
cones; the iteration counts of every island at tolerance 1e-15 equal MuJoCo's
``solver_niter``.
"""
from __future__ import annotations

import mujoco
import numpy as np
import pytest

from constraint_helpers import (canonical, check_solution, inject_contacts, match_rows,
                                oracle_case, pendula_friction, smooth_jit, solve_jit, tight)
from engine_helpers import to_data
from mujoco_oracle import model_from_mujoco
from simjax.engine import constraint as C
from simjax.engine import io, pgs

SCENE = """
<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <geom type="plane" size="5 5 .1"/>
    <body pos="0 0 .12"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    <body pos="0 0 .33"><freejoint/><geom type="box" size=".08 .08 .1"/></body>
    <body pos="1 1 .12"><freejoint/><geom type="sphere" size=".1"/></body>
    <body pos="-1 1 .3">
      <joint type="hinge" axis="0 1 0" range="-30 3" frictionloss=".2"/>
      <geom type="capsule" fromto="0 0 0 .3 0 0" size=".03"/>
    </body>
    <body pos="-1 -1 .12"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
  </worldbody>
</mujoco>
"""

ELL = dict(cone=1, condim=4)


def _model(cone=0, condim=3):
    mjm = mujoco.MjModel.from_xml_string(SCENE)
    mjm.opt.cone = cone
    mjm.geom_condim[:] = condim
    mjm.geom_friction[:] = [0.8, 0.02, 0.005]
    mjm.opt.solver = mujoco.mjtSolver.mjSOL_PGS
    mjm.opt.tolerance = 1e-15
    return mjm


def _state(mjm, nstep=40, seed=0):
    """A state after ``nstep`` steps from qpos0 with random velocities (the boxes settle
    on the plane, the arm swings into its limit)."""
    d = mujoco.MjData(mjm)
    d.qvel[:] = 0.3 * np.random.default_rng(seed).standard_normal(mjm.nv)
    d.qvel[18] = 2.0                                   # hinge arm into its upper limit
    for _ in range(nstep):
        mujoco.mj_step(mjm, d)
    return dict(qpos=d.qpos.copy(), qvel=d.qvel.copy(),
                qacc_warmstart=d.qacc_warmstart.copy())


@pytest.fixture(scope="module", params=["pyramidal", "elliptic"])
def scene(request):
    kw = ELL if request.param == "elliptic" else {}
    mjm = _model(**kw)
    return mjm, model_from_mujoco(mjm), _state(mjm)


def _solve(mjm, m, st, iterations, warm):
    mjm.opt.iterations = iterations
    bit = int(mujoco.mjtDisableBit.mjDSBL_WARMSTART)
    mjm.opt.disableflags = (mjm.opt.disableflags & ~bit) | (0 if warm else bit)
    mjd = mujoco.MjData(mjm)
    for k, v in st.items():
        getattr(mjd, k)[:] = v
    mujoco.mj_forward(mjm, mjd)
    mm = m.replace(opt=m.opt.replace(iterations=iterations, disableflags=mjm.opt.disableflags))
    slot, d = inject_contacts(m, to_data(io.make_data(m), st), mjd)
    d = smooth_jit(canonical(m), d)
    return mjd, slot, d, solve_jit(mm, d)


@pytest.mark.slow                      # ~15 s per case (one solver compilation each)
@pytest.mark.parametrize("iterations,warm", [(1, False), (5, False), (5, True), (1000, True)])
def test_iterates_match_mujoco(scene, iterations, warm):
    mjm, m, st = scene
    mjd, slot, _, out = _solve(mjm, m, st, iterations, warm)
    assert mjd.nisland >= 3 and mjd.nl >= 1 and mjd.nf >= 1
    check_solution(mjd, slot, out, 1e-12)
    np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)


@pytest.mark.slow
def test_islands_match_mujoco(scene):
    """Island of every row (mj_island: trees joined by constraints, numbered by their
    smallest tree) and the per-island block counts."""
    mjm, m, st = scene
    mjd, slot, d, out = _solve(mjm, m, st, 1, False)
    lay = C.layout(m, C.slot_dims(d))
    order = pgs.block_order(m, d, lay)
    rows, _ = match_rows(mjd, out, slot)
    np.testing.assert_array_equal(np.asarray(order["rowisl"])[rows], mjd.efc_island)
    # one block per scalar row, one per elliptic contact (its rows share type and id)
    ell = mjd.efc_type == mujoco.mjtConstraint.mjCNSTR_CONTACT_ELLIPTIC
    cont = np.zeros(mjd.nefc, bool)
    cont[1:] = ell[1:] & ell[:-1] & (mjd.efc_id[1:] == mjd.efc_id[:-1])
    expect = np.bincount(mjd.efc_island[~cont], minlength=mjd.nisland)
    np.testing.assert_array_equal(np.asarray(order["nblk"])[:mjd.nisland], expect)
    assert np.all(np.asarray(order["nblk"])[mjd.nisland:] == 0)


@pytest.mark.parametrize("fit", [True, False])
def test_compact_rows_match_mujoco(fit, monkeypatch):
    """PGS on the compact rows (pgs._pgs_compact: a capacity of exactly the state's
    active rows) and, one row fewer, on the whole rows: MuJoCo's iterates after 1 and 5
    sweeps (cold, warm) to 1e-12 relative, and its iteration counts."""
    import jax
    from simjax.engine import solver
    mjm = _model()
    m = model_from_mujoco(mjm)
    st = _state(mjm)
    mjd0 = _solve(mjm, m, st, 1, False)[0]
    assert mjd0.nefc < C.layout(m, C.slot_dims(io.make_data(m))).nefc
    monkeypatch.setattr(pgs, "_COMPACT_ROWS", mjd0.nefc if fit else mjd0.nefc - 1)
    # a jit of its own (jits of one function share their programs)
    monkeypatch.setitem(globals(), "solve_jit",
                        jax.jit(lambda m, d: solver.fwd_constraint(m, d)))
    for iterations, warm in [(1, False), (5, True)]:
        mjd, slot, _, out = _solve(mjm, m, st, iterations, warm)
        check_solution(mjd, slot, out, 1e-12)
        np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)


def test_compact_rows_under_vmap(monkeypatch):
    """Worlds of a batch with all of a state's active rows and with half of them: with
    a capacity for the larger count every world is solved on the compact rows, with
    one for the smaller the batch on the whole rows; each world's forces those of its
    own solve (1e-12 relative) and its own iteration counts."""
    import jax
    import jax.numpy as jnp
    from simjax.engine import solver
    mjm = _model()
    m = model_from_mujoco(mjm)
    d = _solve(mjm, m, _state(mjm), 5, True)[2]
    mm = m.replace(opt=m.opt.replace(iterations=5, disableflags=mjm.opt.disableflags))
    on = np.nonzero(np.asarray(d.efc_active))[0]
    off = on[len(on) // 2:]
    d1 = d.replace(efc_active=d.efc_active.at[off].set(False),
                   efc_D=d.efc_D.at[off].set(0.0), efc_J=d.efc_J.at[off].set(0.0))
    worlds = [d, d1, d]
    batch = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *worlds)
    for cap in (len(on), len(on) // 2):
        monkeypatch.setattr(pgs, "_COMPACT_ROWS", cap)
        # jits of their own, traced at this capacity
        solve = jax.jit(lambda m, d: solver.fwd_constraint(m, d))
        got = jax.jit(jax.vmap(lambda m, d: solver.fwd_constraint(m, d),
                               in_axes=(None, 0)))(mm, batch)
        for i, x in enumerate(worlds):
            want = solve(mm, x)
            scale = float(np.abs(np.asarray(want.efc_force)).max())
            err = np.abs(np.asarray(got.efc_force[i]) - np.asarray(want.efc_force)).max()
            assert err / scale < 1e-12
            np.testing.assert_array_equal(np.asarray(got.solver_niter[i]),
                                          np.asarray(want.solver_niter))


def test_compact_rows_gym_humanoid():
    """The Gymnasium humanoid (PGS, pyramidal contacts; 164 rows, a compact capacity of
    41) at a state with contacts: forces and iteration counts as MuJoCo's at tight
    tolerance (1e-10 relative), its active rows fitting the compact capacity."""
    from simjax.engine.solver import spec_from_layout
    mjm, m, mjd, slot, d = oracle_case("gym_humanoid/humanoid.xml",
                                       tight(mujoco.mjtSolver.mjSOL_PGS), z=1.0, seed=2)
    lay = C.layout(m, C.slot_dims(d))
    cap = pgs._compact_capacity(spec_from_layout(lay, m.nv))
    assert mjd.ncon >= 2 and cap is not None and mjd.nefc <= cap < lay.nefc
    out = solve_jit(m, d)
    check_solution(mjd, slot, out, 1e-10)
    np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)


EQ_SCENE = """
<mujoco>
  <worldbody>
    <geom type="plane" size="5 5 .1"/>
    <body name="a" pos="0 0 .09"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    <body name="b" pos="1 0 .09"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    <body name="c" pos="0 2 1"><freejoint/><geom type="sphere" size=".1"/></body>
    <body name="d" pos=".3 2 1"><freejoint/><geom type="sphere" size=".1"/></body>
    <body name="e" pos="0 -2 1"><freejoint/><geom type="sphere" size=".1"/></body>
    <body name="f" pos=".3 -2 1"><freejoint/><geom type="sphere" size=".1"/></body>
  </worldbody>
  <equality>
    <connect body1="c" body2="d" anchor=".15 0 0"/>
    <weld body1="e" body2="f"/>
  </equality>
</mujoco>
"""


def _islands_of(xml):
    """MuJoCo's forward of the scene ``xml`` and simjax's islands of its rows (with
    MuJoCo's contacts injected): (mjm, mjd, row islands, dof islands, each MuJoCo row's
    simjax row, simjax's rows not in MuJoCo's)."""
    from simjax.engine import solver
    mjm = mujoco.MjModel.from_xml_string(xml)
    m = model_from_mujoco(mjm)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    st = dict(qpos=mjd.qpos.copy(), qvel=mjd.qvel.copy())
    slot, d = inject_contacts(m, to_data(io.make_data(m), st), mjd)
    d = smooth_jit(canonical(m), d)
    rowisl, dofisl = solver.island_ids(m, d, C.layout(m, C.slot_dims(d)))
    rows, extra = match_rows(mjd, d, slot)
    return mjm, mjd, rowisl, dofisl, rows, extra


def test_islands_equality_rows_match_mujoco():
    """Connect and weld rows join the trees of their two bodies (mj_island), whatever
    the contacts in the slots with the same index: boxes on the plane (contacts in the
    first slots), two pairs of spheres in the air joined by a connect and a weld. Four
    islands, every active row's island as MuJoCo's."""
    mjm, mjd, rowisl, _, rows, extra = _islands_of(EQ_SCENE)
    assert mjd.nisland == 4 and mjd.ncon == 8 and (rows >= 0).all() and not extra.any()
    np.testing.assert_array_equal(np.asarray(rowisl)[rows], mjd.efc_island)


TWO_TREES = """
<mujoco>
  <worldbody>
    <geom type="plane" size="5 5 .1"/>
    <body name="a" pos="{a}"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    <body name="b" pos="{b}"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
  </worldbody>
</mujoco>
"""


@pytest.mark.parametrize("a,b,nisland", [
    ("0 0 .09", "1 0 .09", 2),        # both on the plane, apart: an island each
    ("0 0 .09", "0 0 .28", 1),        # b stacked on a: one island
    ("0 0 2", "1 0 .09", 1),          # a in the air: b's island is island 0
])
def test_two_tree_islands_match_mujoco(a, b, nisland):
    """Islands of a model of two trees (found in closed form, pgs._two_islands): every
    active row's island and the dofs' islands as MuJoCo's (mj_island)."""
    mjm, mjd, rowisl, dofisl, rows, _ = _islands_of(TWO_TREES.format(a=a, b=b))
    assert mjm.ntree == 2 and mjd.nisland == nisland and (rows >= 0).all()
    np.testing.assert_array_equal(np.asarray(rowisl)[rows], mjd.efc_island)
    expect = np.where(mjd.dof_island >= 0, mjd.dof_island, 2)
    np.testing.assert_array_equal(np.asarray(dofisl), expect)


def test_two_tree_islands_match_label_propagation():
    """pgs._islands of two trees (closed form) against its label propagation (the
    same incidences with a third, untouched tree), on random incidences and active
    rows."""
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(3)
    islands = jax.jit(pgs._islands)      # one program per shape, not 200 eager traces
    for _ in range(200):
        n = int(rng.integers(1, 9))
        inc = rng.random((n, 2)) < rng.random()
        act = jnp.asarray(rng.random(n) < 0.7)
        rows, trees = islands(jnp.asarray(inc), act)
        rows3, trees3 = islands(jnp.asarray(np.pad(inc, ((0, 0), (0, 1)))), act)
        np.testing.assert_array_equal(rows, np.minimum(rows3, 2))
        np.testing.assert_array_equal(trees, np.minimum(trees3[:2], 2))


def test_pcg32_matches_64bit_reference():
    """The two-word PCG32 against its statement on 64-bit words (``pcg32_next_u64``,
    which builds the shuffle table), and that against Python's integers."""
    import jax.numpy as jnp
    mask = (1 << 64) - 1
    state = 1                                         # seeded: state 0, inc 1, one step
    s64 = np.asarray([state], np.uint64)
    hi, lo = jnp.uint32(pgs.PCG_SEED[0]), jnp.uint32(pgs.PCG_SEED[1])
    for _ in range(300):
        old = state
        state = (old * 6364136223846793005 + 1) & mask
        xs = ((((old >> 18) ^ old) >> 27) & 0xFFFFFFFF)
        rot = old >> 59
        want = ((xs >> rot) | (xs << ((-rot) & 31))) & 0xFFFFFFFF
        out, hi, lo = pgs.pcg32_next(hi, lo)
        out64, s64 = pgs.pcg32_next_u64(s64)
        assert int(out) == int(out64[0]) == want
        assert int(s64[0]) == state


def test_shuffle_table_matches_loop():
    """The visit order read from the shuffle table (:func:`pgs._shuffler`) is the order
    the shuffle loop (:func:`pgs._shuffle`, MuJoCo's shuffle_int) reaches, sweep after
    sweep: every island size up to 13 alone, and three islands of 5, 1 and 6 blocks
    (positions 0-4, 5, 6-11) with two inactive blocks after them."""
    import jax
    import jax.numpy as jnp
    # compiled once per shape (eager, each call traced its loop again: 16 s)
    shuffle = jax.jit(pgs._shuffle)
    nmax, sweeps = 13, 7
    table = pgs._shuffle_table(nmax, sweeps)
    for n in range(nmax + 1):
        perm = jnp.arange(nmax, dtype=jnp.int32)
        gen = (jnp.zeros(1, jnp.uint32), jnp.ones(1, jnp.uint32))
        for t in range(1, sweeps + 1):
            perm, gen = shuffle(perm, gen, jnp.asarray([n]), jnp.asarray([0]))
            np.testing.assert_array_equal(np.asarray(perm)[:n], table[n, t, :n])
    rng = np.random.default_rng(0)
    perm0 = jnp.asarray(rng.permutation(14), jnp.int32)          # block ids by position
    isl_of_pos = np.r_[[0] * 5, [1], [2] * 6, [3, 3]]             # 3: inactive (nisl)
    bisl = jnp.zeros(14, jnp.int32).at[perm0].set(jnp.asarray(isl_of_pos, jnp.int32))
    nblk, first = jnp.asarray([5, 1, 6]), jnp.asarray([0, 5, 6])
    table = pgs._shuffle_table(14, sweeps)
    shuffled = pgs._shuffler(perm0, table, nblk, first, bisl, 3)
    perm = perm0
    gen = (jnp.zeros(3, jnp.uint32), jnp.ones(3, jnp.uint32))
    for t in range(1, sweeps + 1):
        perm, gen = shuffle(perm, gen, nblk, first)
        got = shuffled(jnp.int32(t))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(perm))
    assert pgs._shuffle_table(164, 50) is None                  # too large: the loop


# --------------------------------------------------------------------------- noslip
def _noslip_solve(mjm, m, st, solver, noslip_iterations, noslip_tolerance, islands=True):
    """MuJoCo's and our constraint solve with the noslip post-pass on state ``st``."""
    mjm.opt.solver = solver
    mjm.opt.iterations = 1000
    mjm.opt.noslip_iterations = noslip_iterations
    mjm.opt.noslip_tolerance = noslip_tolerance
    bit = int(mujoco.mjtDisableBit.mjDSBL_ISLAND)
    mjm.opt.disableflags = (mjm.opt.disableflags & ~bit) | (0 if islands else bit)
    try:
        mjd = mujoco.MjData(mjm)
        for k, v in st.items():
            getattr(mjd, k)[:] = v
        mujoco.mj_forward(mjm, mjd)
    finally:
        mjm.opt.solver = mujoco.mjtSolver.mjSOL_PGS
        mjm.opt.noslip_iterations = 0
        mjm.opt.disableflags &= ~bit
    mm = m.replace(opt=m.opt.replace(
        solver=solver, iterations=1000, noslip_iterations=noslip_iterations,
        noslip_tolerance=noslip_tolerance, disableflags=int(mjm.opt.disableflags) |
        (0 if islands else bit)))
    slot, d = inject_contacts(m, to_data(io.make_data(m), st), mjd)
    d = smooth_jit(canonical(m), d)
    return mjd, slot, d, mm, solve_jit(mm, d)


@pytest.mark.parametrize("islands,cone", [
    pytest.param(True, "pyramidal", marks=pytest.mark.slow),   # ~40 s
    (False, "pyramidal"),
    pytest.param(True, "elliptic", marks=pytest.mark.slow)])
def test_noslip_matches_mujoco(islands, cone):
    """PGS (same iterates as MuJoCo) then noslip, per island: forces to 1e-10 relative
    (measured 1e-14) and every island's total count of PGS and noslip sweeps equal to
    MuJoCo's ``solver_niter``. At noslip tolerance 1e-9 the islands stop after
    different numbers of sweeps: one stopping rule for all islands scaled by
    meaninertia * nv gave 8e-5 force error and 142 iterations instead of 95. Elliptic cones (QCQP friction update): measured 4.5e-15."""
    mjm = _model(**(ELL if cone == "elliptic" else {}))
    m = model_from_mujoco(mjm)
    st = _state(mjm)
    mjd, slot, d, mm, out = _noslip_solve(mjm, m, st, mujoco.mjtSolver.mjSOL_PGS, 50, 1e-9,
                                          islands)
    assert (mjd.nisland >= 3) == islands
    check_solution(mjd, slot, out, 1e-10)
    np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)


def _with_noslip(extra=None):
    def edit(mjm):
        mjm.opt.noslip_iterations = 50
        mjm.opt.noslip_tolerance = 1e-9
        if extra is not None:
            extra(mjm)
    return edit


NOSLIP_CORPUS = {
    "ant": ("gym_ant/ant.xml", None, dict(z=0.2, seed=1)),
    # nine islands (one per pendulum), friction loss on every dof and tendon
    "pendula": ("mjx_pendula/pendula.xml", pendula_friction, dict(qscale=1.5, seed=10)),
}


@pytest.mark.parametrize("name", [
    "ant", pytest.param("pendula", marks=pytest.mark.slow)])
def test_noslip_corpus_matches_mujoco(name):
    """PGS then noslip on corpus models against MuJoCo: forces to 1e-10 relative
    (measured 1.3e-16 ant, 1.6e-16 pendula) and the same iteration counts."""
    rel, extra, opts = NOSLIP_CORPUS[name]
    mjm, m, mjd, slot, d = oracle_case(rel, tight(mujoco.mjtSolver.mjSOL_PGS,
                                                  extra=_with_noslip(extra)), **opts)
    out = solve_jit(m, d)
    check_solution(mjd, slot, out, 1e-10)
    np.testing.assert_array_equal(np.asarray(out.solver_niter), mjd.solver_niter)


def test_block_perm_one_key_matches_lexsort():
    """pgs._block_perm's single-key argsort gives the lexsort's order (island, class,
    key) on random blocks with distinct keys per class; past the int32 bound it is
    the lexsort."""
    import jax.numpy as jnp
    rng = np.random.default_rng(5)
    for nb, nisl, kbound in [(164, 1, 700), (300, 12, 5000), (40, 3, 1 << 28)]:
        cls = rng.integers(0, 4, nb).astype(np.int32)
        key = np.zeros(nb, np.int32)
        for c in range(4):
            at = np.nonzero(cls == c)[0]
            key[at] = rng.choice(min(kbound, 1 << 20), len(at), replace=False)
        bisl = rng.integers(0, nisl + 1, nb).astype(np.int32)
        got = np.asarray(pgs._block_perm(jnp.asarray(key), cls, jnp.asarray(bisl), kbound,
                                         nisl))
        np.testing.assert_array_equal(got, np.lexsort((key, cls, bisl)))
