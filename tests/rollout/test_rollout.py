"""rollout under vmap with a partly batched initial state: the scan's body is batched
once (rollout._batched_with), with the same values and derivatives."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import batching

import simjax
from test_rollout_batch import _euler_cartpole

# the module (simjax.rollout is the function)
rollout_mod = importlib.import_module("simjax.rollout")

NSTEP = 5


@pytest.fixture(scope="module")
def cartpole():
    m = _euler_cartpole()
    d = simjax.make_data(m)
    q = jnp.asarray(0.3 * np.random.default_rng(0).standard_normal((3, m.nq)), d.qpos.dtype)
    return m, d, q


def _batch_rounds(monkeypatch, fn, *args):
    """How often a jaxpr is batched while ``fn(*args)`` is traced (every loop's body
    once per fixpoint round of its batching rule)."""
    calls = []
    real = batching.batch_jaxpr
    monkeypatch.setattr(batching, "batch_jaxpr",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    jax.make_jaxpr(fn)(*args)
    return len(calls)


def test_partly_batched_state_traces_like_a_batched_one(cartpole, monkeypatch):
    m, d, q = cartpole

    def qpos_only():            # a new function each time: make_jaxpr caches its traces
        return jax.vmap(lambda q: simjax.rollout(m, d.replace(qpos=q), nstep=NSTEP))
    whole = jax.vmap(lambda d: simjax.rollout(m, d, nstep=NSTEP))
    data = jax.vmap(lambda q: d.replace(qpos=q))(q)
    n_whole = _batch_rounds(monkeypatch, whole, data)
    assert _batch_rounds(monkeypatch, qpos_only(), q) == n_whole
    # without the helper the scan's body is batched again once the rest of the state
    # turns out batched: the count above can tell the two apart
    monkeypatch.setattr(rollout_mod, "_batched_with", lambda tree, like: tree)
    assert _batch_rounds(monkeypatch, qpos_only(), q) > n_whole


def test_values_unchanged(cartpole):
    m, d, q = cartpole
    data = jax.vmap(lambda q: d.replace(qpos=q))(q)
    want = jax.jit(jax.vmap(lambda d: simjax.rollout(m, d, nstep=NSTEP)))(data)
    got = jax.jit(jax.vmap(lambda q: simjax.rollout(m, d.replace(qpos=q), nstep=NSTEP)))(q)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _toy(x0, y0, batched_with):
    """A scan whose carry's second half turns batched after one step where only the
    first half is batched (the case the helper is for)."""
    def body(c, _):
        x, y = c
        return (jnp.sin(x) * 0.9, y * 0.5 + jnp.sum(x ** 2)), None
    (x, y), _ = jax.lax.scan(body, batched_with((x0, y0), ()), None, length=4)
    return jnp.sum(x * y)


def test_derivatives_through_the_helper():
    """grad (batched and not) and jvp through the helper (a custom vmap rule behind a
    custom jvp) equal those of the same scan without it."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 4)))
    y, t = jnp.full(4, 0.5), jnp.ones((3, 4))
    plain = lambda tree, like: tree                                  # noqa: E731

    def grad(bw):
        return jax.grad(lambda x: _toy(x, y, bw))

    def tangent(bw):
        return lambda x, t: jax.jvp(lambda x: _toy(x, y, bw), (x,), (t,))[1]
    helper = rollout_mod._batched_with
    for got, want in [(jax.vmap(grad(helper))(x), jax.vmap(grad(plain))(x)),
                      (grad(helper)(x[0]), grad(plain)(x[0])),
                      (jax.vmap(tangent(helper))(x, t), jax.vmap(tangent(plain))(x, t))]:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert np.all(np.isfinite(got)) and np.any(np.asarray(got) != 0)


def test_batched_model_alone(cartpole):
    """Domain randomisation: a batched Model leaf, one initial state."""
    m, d, _ = cartpole
    masses = jnp.stack([m.body_mass * s for s in (0.5, 1.0, 2.0)])
    axes = jax.tree_util.tree_map(lambda _: None, m).replace(body_mass=0)
    d1 = d.replace(qpos=d.qpos.at[1].set(0.3))
    got = jax.jit(jax.vmap(lambda mm: simjax.rollout(mm, d1, nstep=NSTEP),
                           in_axes=(axes,)))(m.replace(body_mass=masses))
    one = jax.jit(lambda mm: simjax.rollout(mm, d1, nstep=NSTEP))
    for i in range(3):
        ref = one(m.replace(body_mass=masses[i]))
        np.testing.assert_allclose(np.asarray(got.qpos[i]), np.asarray(ref.qpos),
                                   rtol=1e-12, atol=1e-12)


def test_outside_vmap_the_tree_itself():
    tree = {"a": jnp.ones(3), "b": jnp.zeros((0,))}
    assert rollout_mod._batched_with(tree, ()) is tree
