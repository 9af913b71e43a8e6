"""LAPACK mass-matrix factorisation (tree_linalg.factor_ld, lapack_chol)."""
import re

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import load, random_state, set_state, to_data
from simjax.engine import lapack_chol, make_data, smooth, support, tree_level, tree_linalg

# jaxlib's CPU LAPACK kernels hand a batch to the thread pool from this much work on
_POOL_WORK = 200_000
# nv 27 (15 tree levels: solved in a scan), 14, 36 (many trees), 3 (factorised entry
# by entry)
_MODELS = ["mujoco_humanoid/humanoid.xml", "gym_ant/ant.xml", "mjx_pendula/pendula.xml",
           "gym_inverted_double_pendulum/inverted_double_pendulum.xml"]


def _qm(m, d):
    d = smooth.kinematics(m, d)
    d = smooth.com_pos(m, d)
    return smooth.crb(m, d).qM


@pytest.mark.parametrize("rel", _MODELS)
def test_factor_ld_matches_mujoco(rel):
    mjm, m = load(rel)
    rng = np.random.default_rng(5)
    mjd = mujoco.MjData(mjm)
    for _ in range(3):
        state = random_state(mjm, rng)
        set_state(mjm, mjd, state)
        mujoco.mj_forward(mjm, mjd)
        qm = jax.jit(_qm, static_argnums=0)(m, to_data(make_data(m), state))
        qld = jax.jit(tree_linalg.factor_ld, static_argnums=0)(m, qm)
        np.testing.assert_allclose(support.pack_m(m, qld), mjd.qLD, rtol=1e-10, atol=1e-12)
        x = np.asarray(tree_linalg.solve_ld(m, qld, jnp.asarray(mjd.qfrc_smooth)))
        ref = np.zeros(mjm.nv)
        mujoco.mj_solveM(mjm, mjd, ref[None], mjd.qfrc_smooth[None])
        np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-10)
        # several right-hand sides at once (as the constraint solver passes them)
        rhs = rng.standard_normal((mjm.nv, 3))
        x = np.asarray(jax.jit(tree_linalg.solve_ld, static_argnums=0)(
            m, qld, jnp.asarray(rhs)))
        ref = np.zeros((3, mjm.nv))
        mujoco.mj_solveM(mjm, mjd, ref, np.ascontiguousarray(rhs.T))
        np.testing.assert_allclose(x, ref.T, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("path", ["gym_hopper/hopper.xml"] + [
    pytest.param(p, marks=pytest.mark.slow)
    for p in ("gym_ant/ant.xml", "mujoco_humanoid/humanoid.xml")])
def test_factor_ld_damped_and_grad(path):
    mjm, m = load(path)
    rng = np.random.default_rng(6)
    qpos = jnp.asarray(mjm.qpos0[None] + 0.3 * rng.standard_normal((4, mjm.nq)))
    d0 = make_data(m)
    qm = jax.jit(jax.vmap(lambda q: _qm(m, d0.replace(qpos=q))))(qpos)
    add = jnp.asarray(rng.uniform(0.1, 1.0, mjm.nv))
    # jitted: op-by-op dispatch of the tree recursions and their gradients takes minutes
    ours = jax.jit(jax.vmap(lambda a: tree_linalg.factor_ld(m, a, add_diag=add)))(qm)
    pure = jax.jit(jax.vmap(lambda a: tree_linalg._factor_ld_pure(m, a + jnp.diag(add))))(qm)
    np.testing.assert_allclose(ours, pure, rtol=1e-11, atol=1e-12)
    v = jnp.asarray(rng.standard_normal(mjm.nv))

    def loss(fac, q):
        return jnp.sum(tree_linalg.solve_ld(m, fac(_qm(m, d0.replace(qpos=q))), v) ** 2)
    g = jax.jit(jax.vmap(jax.grad(
        lambda q: loss(lambda a: tree_linalg.factor_ld(m, a), q))))(qpos)
    g_ref = jax.jit(jax.vmap(jax.grad(
        lambda q: loss(lambda a: tree_linalg._factor_ld_pure(m, a), q))))(qpos)
    np.testing.assert_allclose(g, g_ref, rtol=1e-8, atol=1e-8 * np.abs(g_ref).max())


def _potrf_calls(hlo):
    """(batch, n) of every LAPACK Cholesky in compiled HLO text."""
    pat = (r"\(f(?:32|64)\[([0-9,]*)\][^)]*\) custom-call\([^)]*\), "
           r"custom_call_target=\"lapack_[sd]potrf")
    out = []
    for dims in re.findall(pat, hlo):
        shape = [int(x) for x in dims.split(",")]
        out.append((int(np.prod(shape[:-2])), shape[-1]))
    return out


@pytest.mark.parametrize("n", [6, 27, 48])
def test_cholesky_never_reaches_the_thread_pool(n):
    """Every LAPACK call stays below jaxlib's threshold for handing work to the
    thread pool (where concurrent calls can deadlock), at any vmap nesting."""
    if not lapack_chol.enabled(n):
        pytest.skip("LAPACK path not used here")
    rng = np.random.default_rng(n)
    r = rng.standard_normal((8, 300, n, n))
    a = r @ np.swapaxes(r, -1, -2) + n * np.eye(n)
    for f, x in ((jax.vmap(lapack_chol.cholesky), a[0]),
                 (jax.vmap(jax.vmap(lapack_chol.cholesky)), a)):
        hlo = jax.jit(f).lower(x).compile().as_text()
        calls = _potrf_calls(hlo)
        assert calls
        for batch, size in calls:
            assert size == n and batch * (n ** 3 // 3) < _POOL_WORK
        np.testing.assert_allclose(jax.jit(f)(x), np.linalg.cholesky(x), rtol=1e-10,
                                   atol=1e-10)


def _pair_batch(mjm, m, seed):
    """(rng, qpos (6, nq), d0, qM (6, nv, nv), added diagonals (6, nv)) of 6 random
    states around qpos0, for the pair factorisation and solve tests."""
    rng = np.random.default_rng(seed)
    qpos = jnp.asarray(mjm.qpos0[None] + 0.3 * rng.standard_normal((6, mjm.nq)))
    d0 = make_data(m)
    qm = jax.jit(jax.vmap(lambda q: _qm(m, d0.replace(qpos=q))))(qpos)
    return rng, qpos, d0, qm, jnp.asarray(rng.uniform(0.0, 1.0, (6, mjm.nv)))


@pytest.mark.parametrize("path,impl", [                     # ~10-15 s each
    ("gym_ant/ant.xml", "lapack"),
    pytest.param("gym_ant/ant.xml", "level", marks=pytest.mark.slow)] + [
    pytest.param("mujoco_humanoid/humanoid.xml", impl, marks=pytest.mark.slow)
    for impl in ("level", "lapack")])
def test_factor_ld_pair_batched(path, impl):
    """The pair factorisations, level by level (tree_level) and by one LAPACK call on
    both matrices (tree_linalg, whose program must hold one Cholesky call), vmapped (a
    batch not a multiple of the lane block), nested vmap: equal to two factor_ld calls
    and MuJoCo's qLD; their gradient is the pure-JAX factorisation's."""
    mjm, m = load(path)
    rng, qpos, d0, qm, add = _pair_batch(mjm, m, 7)
    mod = tree_level if impl == "level" else tree_linalg
    assert impl == "level" or tree_linalg.lapack_ok(m)

    def ours(a, x):
        return mod.factor_ld_pair(m, a, x)
    pair = jax.jit(jax.vmap(ours))
    got0, got1 = pair(qm[:5], add[:5])
    want0 = jax.jit(jax.vmap(lambda a: tree_linalg.factor_ld(m, a)))(qm[:5])
    want1 = jax.jit(jax.vmap(lambda a, x: tree_linalg.factor_ld(m, a, add_diag=x)))(
        qm[:5], add[:5])
    np.testing.assert_allclose(got0, want0, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(got1, want1, rtol=1e-11, atol=1e-12)
    if impl == "lapack":
        assert len(_potrf_calls(pair.lower(qm, add).compile().as_text())) == 1
    n0, n1 = jax.jit(jax.vmap(jax.vmap(ours)))(qm.reshape((2, 3) + qm.shape[1:]),
                                               add.reshape(2, 3, -1))
    np.testing.assert_allclose(n0.reshape(qm.shape)[:5], want0, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(n1.reshape(qm.shape)[:5], want1, rtol=1e-11, atol=1e-12)
    mjd = mujoco.MjData(mjm)
    mjd.qpos[:] = np.asarray(qpos[0])
    mujoco.mj_forward(mjm, mjd)
    np.testing.assert_allclose(support.pack_m(m, got0[0]), mjd.qLD, rtol=1e-10, atol=1e-12)
    v = jnp.asarray(rng.standard_normal(mjm.nv))

    def loss(fac, q, x):
        f0, f1 = fac(_qm(m, d0.replace(qpos=q)), x)
        return (jnp.sum(tree_linalg.solve_ld(m, f0, v) ** 2) +
                jnp.sum(tree_linalg.solve_ld(m, f1, v) ** 2))

    def ref(a, y):
        return (tree_linalg._factor_ld_pure(m, a),
                tree_linalg._factor_ld_pure(m, a + jnp.diag(y)))
    g, g_ref = (jax.jit(jax.vmap(jax.grad(lambda q, x: loss(fac, q, x), argnums=(0, 1))))(
        qpos, add) for fac in (ours, ref))
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8 * np.abs(b).max())


def _spied_batch(monkeypatch, module, attr, mjm, m, seed, n):
    """(calls, batch): ``module.attr`` wrapped to record its calls in the list, and a
    batched Data of ``n`` random states (small qpos offsets, moderate velocities)."""
    calls = []
    real = getattr(module, attr)
    monkeypatch.setattr(module, attr, lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(seed)
    states = [random_state(mjm, rng, qscale=0.1, vscale=0.3) for _ in range(n)]
    stacked = jax.tree_util.tree_map(lambda *x: np.stack(x), *states)
    return calls, jax.vmap(lambda st: to_data(make_data(m), st))(stacked)


def _two_steps(m):
    """Two steps of ``m`` (the second warm-started by the first), the step compiled
    once."""
    from simjax.engine import step
    return lambda d: jax.lax.fori_loop(0, 2, lambda i, d: step(m, d), d)


def test_contact_step_factorises_the_pair_once(monkeypatch):
    """The batched humanoid step with contact rows and damped Euler factorises qM and
    the damped matrix by one LAPACK pair (forward._PAIR_LAPACK) and equals the step
    that factorises them apart."""
    import importlib
    forward = importlib.import_module("simjax.engine.forward")
    mjm, m = load("mujoco_humanoid/humanoid.xml", constraints=True)
    calls, batch = _spied_batch(monkeypatch, tree_linalg, "factor_ld_pair", mjm, m, 3, 4)
    assert batch.efc_J.shape[-2] and forward._lapack_pair(m, make_data(m))

    two = _two_steps(m)
    out = jax.jit(jax.vmap(two))(batch)
    assert calls, "the batched step did not factorise the pair"
    monkeypatch.setattr(forward, "_PAIR_LAPACK", False)
    apart = jax.jit(jax.vmap(two))(batch)
    # the factors agree to the last bit or so; the programs around them fuse
    # differently and the constraint solver's iterations carry such roundings (seen:
    # 5e-12 relative in qacc_warmstart)
    for (p, x), y in zip(jax.tree_util.tree_leaves_with_path(apart),
                         jax.tree_util.tree_leaves(out)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-9, atol=1e-9,
                                   err_msg=jax.tree_util.keystr(p))


@pytest.mark.slow                         # ~24 s (nb 5); test_level_ld.test_lower_factors
@pytest.mark.parametrize("nb", [5, 16])   # runs the lower factors in the default set
def test_factor_ld_pair_lower_factors(nb):
    """qM's lower triangle given as its factors (smooth.crb_lower, ``a`` None) to the
    pair factorisation (a padded lane block and whole ones): both factors, the solves
    and qM equal the dense path's up to rounding; unbatched, qM is crb's bit for bit;
    the derivatives are the dense path's."""
    mjm, m = load("mujoco_humanoid/humanoid.xml")
    assert tree_level.level_plan_fits(m)
    rng, qpos, d0, _, add = _pair_batch(mjm, m, 13)
    qpos = jnp.asarray(np.resize(np.asarray(qpos), (nb, mjm.nq)))
    add = jnp.asarray(np.resize(np.asarray(add), (nb, mjm.nv)))
    rhs = jnp.asarray(rng.standard_normal((nb, mjm.nv)))

    def fwd(q, y, b, factors):
        d = smooth.com_pos(m, smooth.kinematics(m, d0.replace(qpos=q)))
        d, lower = smooth.crb_lower(m, d, factors=factors)
        assert isinstance(lower, tuple) == factors
        q0, q1, packed, qm = tree_level.factor_ld_pair_packed(
            m, None if factors else d.qM, y, lower, with_matrix=True)
        return (q0, q1, qm) + tree_level.solve_ld_pair(m, packed, q0, q1, b)

    got = jax.jit(jax.vmap(lambda *a: fwd(*a, True)))(qpos, add, rhs)
    want = jax.jit(jax.vmap(lambda *a: fwd(*a, False)))(qpos, add, rhs)
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=1e-11, atol=1e-12 * np.abs(y).max())
    one = jax.jit(lambda *a: fwd(*a, True))(qpos[0], add[0], rhs[0])
    np.testing.assert_array_equal(one[2], jax.jit(lambda q: _qm(m, d0.replace(qpos=q)))(
        qpos[0]))

    def loss(factors, *a):
        return sum(jnp.sum(jnp.sin(x)) for x in fwd(*a, factors))
    g = jax.jit(jax.vmap(jax.grad(lambda *a: loss(True, *a), argnums=(0, 1))))(
        qpos[:6], add[:6], rhs[:6])
    g_ref = jax.jit(jax.vmap(jax.grad(lambda *a: loss(False, *a), argnums=(0, 1))))(
        qpos[:6], add[:6], rhs[:6])
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8 * np.abs(b).max())


@pytest.mark.parametrize("path", [                          # the humanoid: ~9 s
    pytest.param("mujoco_humanoid/humanoid.xml", marks=pytest.mark.slow), "gym_ant/ant.xml"])
def test_solve_ld_pair_batched(path):
    """The pair solve on packed factors (vmapped: a batch not a multiple of the lane
    block, nested vmap) equals two solve_ld calls; unbatched it is solve_ld; its
    gradient is the dense solves'."""
    mjm, m = load(path)
    rng, qpos, d0, qm, add = _pair_batch(mjm, m, 11)
    rhs = jnp.asarray(rng.standard_normal((6, mjm.nv)))

    def both(a, y, b):
        q0, q1, packed = tree_level.factor_ld_pair_packed(m, a, y)
        assert packed is not None
        return tree_level.solve_ld_pair(m, packed, q0, q1, b)

    def ref(a, y, b):
        q0, q1 = tree_linalg.factor_ld(m, a), tree_linalg.factor_ld(m, a, add_diag=y)
        return tree_linalg.solve_ld(m, q0, b), tree_linalg.solve_ld(m, q1, b)
    want = jax.jit(jax.vmap(ref))(qm, add, rhs)
    got = jax.jit(jax.vmap(both))(qm[:5], add[:5], rhs[:5])
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y[:5], rtol=1e-10, atol=1e-10 * np.abs(y).max())
    nested = jax.jit(jax.vmap(jax.vmap(both)))(
        qm.reshape((2, 3) + qm.shape[1:]), add.reshape(2, 3, -1), rhs.reshape(2, 3, -1))
    for x, y in zip(nested, want):
        np.testing.assert_allclose(x.reshape(y.shape), y, rtol=1e-10,
                                   atol=1e-10 * np.abs(y).max())
    single = jax.jit(both)(qm[0], add[0], rhs[0])
    for x, y in zip(single, want):
        np.testing.assert_allclose(x, y[0], rtol=1e-12, atol=1e-12 * np.abs(y).max())
    # one right-hand side for every world (unbatched under vmap)
    shared = jax.jit(jax.vmap(both, in_axes=(0, 0, None)))(qm, add, rhs[0])
    want_shared = jax.jit(jax.vmap(ref, in_axes=(0, 0, None)))(qm, add, rhs[0])
    for x, y in zip(shared, want_shared):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-10 * np.abs(y).max())

    def loss(fn, a, y, b):
        x0, x1 = fn(a, y, b)
        return jnp.sum(x0 ** 2) + jnp.sum(jnp.sin(x1))
    g = jax.jit(jax.vmap(jax.grad(lambda *a: loss(both, *a), argnums=(0, 1, 2))))(
        qm, add, rhs)
    g_ref = jax.jit(jax.vmap(jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2))))(
        qm, add, rhs)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8 * np.abs(b).max())


def test_batched_euler_step_matches_single(monkeypatch):
    """The batched smooth Euler step (both factorisations and solves on packed
    factors in lane blocks, see forward._forward_parts) equals the unbatched step."""
    import importlib
    forward = importlib.import_module("simjax.engine.forward")
    mjm, m = load("mujoco_humanoid/humanoid.xml")
    assert forward._euler_damped(m) is True
    calls, batch = _spied_batch(monkeypatch, tree_level, "_level_solve_blocks", mjm, m,
                                2, 5)

    two = _two_steps(m)
    out = jax.jit(jax.vmap(two))(batch)
    assert calls, "the batched step did not solve on the packed factors"
    for i in (0, 4):
        ref = jax.jit(two)(jax.tree_util.tree_map(lambda x: np.asarray(x)[i], batch))
        for (p, x), y in zip(jax.tree_util.tree_leaves_with_path(ref),
                             jax.tree_util.tree_leaves(out)):
            np.testing.assert_allclose(np.asarray(y[i]), np.asarray(x), rtol=1e-9,
                                       atol=1e-9, err_msg=jax.tree_util.keystr(p))
