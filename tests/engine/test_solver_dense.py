"""Dense factorisation and solves of the constraint solvers (solver_dense): the batched
LAPACK calls stay on the calling thread, and chunking changes no value."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine_helpers import load
from simjax.engine import lapack_chol, make_data, solver_dense
from simjax.engine.forward import step

# jaxlib's CPU LAPACK kernels hand a batch to the thread pool from this much work on
# (batch x cost per matrix: potrf n^3 / 3, trsm n^2 per right-hand side)
_POOL_WORK = 200_000


def _lapack_calls(text):
    """(routine, batch, n, columns) of every LAPACK potrf / trsm call in lowered
    (StableHLO) text: trsm's shape is that of its right-hand sides."""
    out = []
    pat = (r"stablehlo\.custom_call @lapack_[sd](potrf|trsm)_ffi\(([^)]*)\).*?:\s*"
           r"\(([^)]*)\)")
    for kind, _, types in re.findall(pat, text):
        shapes = re.findall(r"tensor<([0-9x]+)xf(?:32|64)>", types)
        dims = [int(x) for x in shapes[-1 if kind == "trsm" else 0].split("x")]
        out.append((kind, int(np.prod(dims[:-2])), dims[-2], dims[-1]))
    return out


def _cost(kind, n, cols):
    return n ** 3 // 3 if kind == "potrf" else n * n * cols


def _spd(rng, shape, n):
    r = rng.standard_normal(shape + (n, n))
    return r @ np.swapaxes(r, -1, -2) + n * np.eye(n)


@pytest.mark.parametrize("n", [6, 27, 48])
def test_factor_and_solve_stay_below_the_pool_threshold(n):
    """factor_t and factor_solve under vmap (one and two levels) make every LAPACK
    call small enough to run on the calling thread, and give the values of one call
    on the whole batch: NumPy's factor and solve, NaN where a matrix is not positive
    definite."""
    if not lapack_chol.enabled(n):
        pytest.skip("LAPACK path not used here")
    rng = np.random.default_rng(n)
    a = _spd(rng, (4, 150), n)
    a[1, 7] = -np.eye(n)                       # not positive definite: marked NaN
    b = rng.standard_normal((4, 150, n))

    def factor_solve(x, y):
        u = solver_dense.factor_t(x)
        return u, solver_dense.factor_solve(u, y)

    for f, x, y in ((jax.vmap(factor_solve), a[0], b[0]),
                    (jax.vmap(jax.vmap(factor_solve)), a, b)):
        calls = _lapack_calls(jax.jit(f).lower(x, y).as_text())
        assert {c[0] for c in calls} == {"potrf", "trsm"}
        for kind, batch, size, cols in calls:
            assert size == n and batch * _cost(kind, size, cols) < _POOL_WORK
        u, sol = jax.jit(f)(x, y)
        ok = np.ones(x.shape[:-2], bool)
        if x.ndim == 4:
            ok[1, 7] = False
            assert np.isnan(u[1, 7, 0, 0]) and np.isnan(sol[1, 7]).all()
        np.testing.assert_allclose(np.triu(u[ok]), np.swapaxes(
            np.linalg.cholesky(x[ok]), -1, -2), rtol=1e-10, atol=1e-10)
        ref = np.linalg.solve(x[ok], y[ok][..., None])[..., 0]
        np.testing.assert_allclose(sol[ok], ref, rtol=1e-8,
                                   atol=1e-10)


def test_factor_and_solve_chunks_bit_identical():
    """Chunked calls give the bits of one LAPACK call on the whole batch."""
    if not lapack_chol.enabled(27):
        pytest.skip("LAPACK path not used here")
    rng = np.random.default_rng(3)
    a = jnp.asarray(_spd(rng, (300,), 27))
    b = jnp.asarray(rng.standard_normal((300, 27)))
    u = jax.jit(jax.vmap(solver_dense.factor_t))(a)
    sym = 0.5 * (a + jnp.swapaxes(a, -1, -2))
    whole = jax.jit(lambda x: solver_dense._potrf(x)[0])(sym)
    np.testing.assert_array_equal(np.triu(u), np.triu(whole))
    x = jax.jit(jax.vmap(solver_dense.factor_solve))(u, b)
    ref = jax.jit(solver_dense.spd_solve)(jnp.swapaxes(u, -1, -2), b)
    np.testing.assert_array_equal(x, ref)


def test_humanoid_step_and_grad_lapack_calls_stay_on_the_calling_thread():
    """The batched step of the humanoid (27 dofs, Newton: a factorisation and two
    triangular solves per pass) at 4096 worlds, whose Newton trips hold 512, and its
    gradient: two CPU devices running the step hung in jaxlib's thread pool when a call
    reached the threshold."""
    if not lapack_chol.enabled(27):
        pytest.skip("LAPACK path not used here")
    _, m = load("mujoco_humanoid/humanoid.xml", constraints=True)
    d = jax.vmap(lambda q: make_data(m).replace(qpos=q))(
        jnp.tile(jnp.asarray(m.qpos0), (4096, 1)))
    text = jax.jit(jax.vmap(lambda x: step(m, x))).lower(d).as_text()

    # and its gradient at 512 worlds (the solver's implicit gradient solves the batch)
    def loss(qvel, x):
        return jnp.sum(step(m, x.replace(qvel=qvel)).qvel ** 2)

    half = jax.tree_util.tree_map(lambda x: x[:512], d)
    grad_text = jax.jit(jax.vmap(jax.grad(loss))).lower(half.qvel, half).as_text()
    for t in (text, grad_text):
        calls = _lapack_calls(t)
        assert {c[0] for c in calls} == {"potrf", "trsm"}
        for kind, batch, size, cols in calls:
            assert batch * _cost(kind, size, cols) < _POOL_WORK, (kind, batch, size, cols)


def test_sym_solve_gradient_chunked():
    """sym_solve (the solver's implicit gradient): h^-1 b, its reverse-mode gradients
    in b and h, and under vmap of the gradient every LAPACK call below the threshold."""
    if not lapack_chol.enabled(27):
        pytest.skip("LAPACK path not used here")
    rng = np.random.default_rng(7)
    h = jnp.asarray(_spd(rng, (300,), 27))
    b = jnp.asarray(rng.standard_normal((300, 27)))
    w = jnp.asarray(rng.standard_normal(27))

    def loss(hh, bb):
        return w @ solver_dense.sym_solve(hh, bb)

    grad = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))
    calls = _lapack_calls(grad.lower(h, b).as_text())
    assert {c[0] for c in calls} == {"potrf", "trsm"}
    for kind, batch, size, cols in calls:
        assert batch * _cost(kind, size, cols) < _POOL_WORK, (kind, batch, size, cols)
    gh, gb = grad(h, b)
    hn, bn = np.asarray(h), np.asarray(b)
    x = np.linalg.solve(hn, bn[..., None])[..., 0]
    y = np.linalg.solve(hn, np.broadcast_to(np.asarray(w), bn.shape)[..., None])[..., 0]
    np.testing.assert_allclose(jax.jit(jax.vmap(loss))(h, b), x @ np.asarray(w),
                               rtol=1e-9)
    # d(w' h^-1 b)/db = h^-1 w; d/dh = -(h^-1 w)(h^-1 b)', h read symmetrised
    np.testing.assert_allclose(gb, y, rtol=1e-9, atol=1e-12)
    dh = -y[:, :, None] * x[:, None, :]
    np.testing.assert_allclose(gh, 0.5 * (dh + np.swapaxes(dh, -1, -2)), rtol=1e-8,
                               atol=1e-12)
