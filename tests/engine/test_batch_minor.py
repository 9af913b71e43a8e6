"""Batch-minor evaluation (simjax.engine.batch_minor) and the smooth step that uses it."""
import importlib

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import load, random_state, to_data
from simjax.engine import batch_minor, make_data, precision, step
from simjax.engine.batch_minor import batch_minor as minor

PENDULUM = "gym_inverted_pendulum/inverted_pendulum.xml"
HUMANOID = "mujoco_humanoid/humanoid.xml"
# the module (simjax.engine exports its function ``forward`` under the same name)
forward = importlib.import_module("simjax.engine.forward")


@pytest.fixture(autouse=True)
def _check_shapes(monkeypatch):
    # every rule's output shape and dtype checked against the unbatched program's
    monkeypatch.setattr(batch_minor, "_CHECK", True)


def _batch(m, mjm, n, seed=0):
    rng = np.random.default_rng(seed)
    states = [random_state(mjm, rng, qscale=0.1, vscale=0.3) for _ in range(n)]
    stacked = jax.tree_util.tree_map(lambda *x: np.stack(x), *states)
    return jax.vmap(lambda st: to_data(make_data(m), st))(stacked)


def _assert_trees_close(a, b, rtol, atol):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a),
                            jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


# --------------------------------------------------------------------------- interpreter
def _ops(x, y, idx):
    """A mix of the primitives the interpreter has rules for (and some it has not)."""
    a = x[idx] * 2.0 + jnp.take(y, idx[::-1], axis=0)                 # gather
    b = jnp.zeros(5, x.dtype).at[idx].add(x[:3])                      # scatter-add
    m = jnp.outer(x[:3], y[:3])                                       # dot, both batched
    c = m @ jnp.arange(3.0, dtype=x.dtype) + jnp.ones((3, 3), x.dtype) @ y[:3]
    s, ys = jax.lax.scan(lambda s, t: (s * 0.5 + t, s.sum()), x[:2], jnp.stack([y[:2]] * 3))
    d = jax.lax.dynamic_slice(x, (1,), (3,)) + jnp.pad(y[:2], (0, 1), constant_values=3.0)
    e = jnp.where(x[:3] > 0, jnp.cumsum(y[:3]), jnp.sort(x[:3]))      # sort: no rule
    f = jax.lax.cond(x[0] > 0, lambda: y[0], lambda: -y[0])          # cond: no rule
    g = jnp.concatenate([a, b, c, s, ys, d, e, f[None]]).reshape(-1, 1)
    return jnp.sum(g * g.T, axis=0)


@pytest.mark.parametrize("batch", [5, 64])
@pytest.mark.parametrize("axes", [(0, 0), (0, None), (None, 0)])
def test_interpreter_matches_vmap(batch, axes):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 5)) if axes[0] == 0 else rng.standard_normal(5)
    y = rng.standard_normal((batch, 5)) if axes[1] == 0 else rng.standard_normal(5)
    idx = np.array([0, 2, 4])
    want = jax.vmap(lambda x, y: _ops(x, y, idx), in_axes=axes)(x, y)
    got = jax.jit(jax.vmap(minor(lambda x, y: _ops(x, y, idx)), in_axes=axes))(x, y)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_unbatched_and_gradient_use_the_function():
    f = minor(lambda x: jnp.sin(x) * x[::-1])
    x = jnp.linspace(0.1, 1.0, 4)
    np.testing.assert_array_equal(f(x), jnp.sin(x) * x[::-1])
    g = jax.vmap(jax.grad(lambda x: jnp.sum(f(x))))(jnp.stack([x, 2 * x]))
    want = jax.vmap(jax.grad(lambda x: jnp.sum(jnp.sin(x) * x[::-1])))(jnp.stack([x, 2 * x]))
    np.testing.assert_allclose(g, want, rtol=1e-12)


# --------------------------------------------------------------------------- smooth step
@pytest.mark.parametrize("path", [PENDULUM, HUMANOID])
def test_smooth_step_batch_minor_matches_single(path, monkeypatch):
    # the humanoid with RK4 (batch-minor steps are RK4's); its factorisation goes
    # through the interpreter's fallback (a custom_vmap)
    mjm, m = load(path, integrator=mujoco.mjtIntegrator.mjINT_RK4)
    assert forward._use_batch_minor(m)
    calls = []
    real = batch_minor._eval
    monkeypatch.setattr(batch_minor, "_eval", lambda *a: calls.append(1) or real(*a))
    batch = _batch(m, mjm, 6)

    def two(d):
        # two steps, the step compiled once
        return jax.lax.fori_loop(0, 2, lambda i, d: step(m, d), d)
    out = jax.jit(jax.vmap(two))(batch)
    assert calls, "the batched step did not run batch-minor"
    single = jax.jit(two)
    for i in (0, 5):
        ref = single(jax.tree_util.tree_map(lambda x: np.asarray(x)[i], batch))
        _assert_trees_close(jax.tree_util.tree_map(lambda x: np.asarray(x)[i], out), ref,
                            rtol=1e-9, atol=1e-9)


def test_smooth_step_batch_of_64_float32():
    """A batch of a multiple of 64 worlds is padded on the minor axis; float32."""
    mjm, m = load(PENDULUM)
    batch = _batch(m, mjm, 64, seed=3)
    batch = jax.tree_util.tree_map(
        lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x,
        batch)
    out = jax.jit(jax.vmap(lambda d: step(m, d)))(batch)
    # the reference with step's matrix-product precision (full float32 on a GPU too)
    ref_step = precision.full_f32(forward._step)
    ref = jax.jit(jax.vmap(lambda d: ref_step(m, d)))(batch)
    _assert_trees_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow          # ~30 s: two compiles of a 3-step gradient
def test_smooth_rollout_gradient_unchanged(monkeypatch):
    mjm, m = load(PENDULUM)
    batch = _batch(m, mjm, 3, seed=1)

    def loss(qvel, d):
        d = jax.lax.fori_loop(0, 3, lambda i, d: step(m, d), d.replace(qvel=qvel))
        return jnp.sum(d.qpos ** 2) + jnp.sum(d.qvel ** 2)
    grad = jax.jit(jax.vmap(jax.value_and_grad(loss)))
    got = grad(batch.qvel, batch)
    monkeypatch.setattr(forward, "_BATCH_MINOR_MAX", 0)
    want = jax.jit(jax.vmap(jax.value_and_grad(loss)))(batch.qvel, batch)
    _assert_trees_close(got, want, rtol=1e-12, atol=1e-12)


def test_euler_and_constrained_steps_keep_the_usual_layout():
    assert not forward._use_batch_minor(load(HUMANOID)[1])                  # Euler
    rk4 = mujoco.mjtIntegrator.mjINT_RK4
    assert not forward._use_batch_minor(load(PENDULUM, integrator=rk4, constraints=True)[1])


def test_batched_model_takes_the_plain_step():
    """Model leaves batched by vmap (domain randomisation) cannot be constants of the
    batch-minor program: the step is batched as usual."""
    mjm, m = load(PENDULUM)
    masses = jnp.stack([jnp.asarray(m.body_mass) * s for s in (0.5, 2.0)])
    axes = jax.tree_util.tree_map(lambda _: None, m).replace(body_mass=0)
    data = to_data(make_data(m), random_state(mjm, np.random.default_rng(1)))
    out = jax.vmap(step, in_axes=(axes, None))(m.replace(body_mass=masses), data)
    for i in range(2):
        ref = step(m.replace(body_mass=masses[i]), data)
        np.testing.assert_allclose(out.qvel[i], ref.qvel, rtol=1e-12, atol=1e-12)
