"""simjax.engine.tables: the run-time skip of terms whose parameters are zero
(run_if_nonzero, on_or_differentiated), on a stand-in model of one traced field."""
import types

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import tables


def _term(m, x, calls):
    """x times the field's sum, skipped where the field is zero."""
    def fn(x):
        calls.append("fn")
        return x * jnp.sum(m.k)
    return tables.run_if_nonzero(m, ("k",), fn, jnp.zeros_like, x)


def test_concrete_fields_call_the_term_directly():
    calls = []
    out = _term(types.SimpleNamespace(k=np.zeros(3)), jnp.ones(2), calls)
    assert calls == ["fn"]
    np.testing.assert_array_equal(out, 0.0)
    jaxpr = str(jax.make_jaxpr(lambda x: _term(types.SimpleNamespace(k=np.ones(3)), x,
                                                []))(jnp.ones(2)))
    assert "cond" not in jaxpr


def test_traced_fields_branch_at_run_time():
    def f(k, x):
        return _term(types.SimpleNamespace(k=k), x, [])
    assert "cond" in str(jax.make_jaxpr(f)(jnp.zeros(3), jnp.ones(2)))
    np.testing.assert_array_equal(jax.jit(f)(jnp.zeros(3), jnp.ones(2)), 0.0)
    np.testing.assert_array_equal(jax.jit(f)(jnp.asarray([1.0, 2, 0]), jnp.ones(2)), 3.0)
    # a batched field: the branch becomes a select, each world its own value
    out = jax.vmap(f, (0, None))(jnp.asarray([[0.0, 0, 0], [1, 1, 1]]), jnp.ones(2))
    np.testing.assert_array_equal(out, [[0.0, 0.0], [3.0, 3.0]])


def test_differentiated_fields_take_the_term():
    """At zero the skipped branch has no derivative; differentiated with respect to
    the field, the term is computed: d/dk sum(x * sum(k)) = sum(x) for each k_i.
    Differentiated with respect to x alone, the skip stands (zero either way)."""
    def f(k, x):
        return jnp.sum(_term(types.SimpleNamespace(k=k), x, []))
    x = jnp.asarray([1.0, 2.0])
    np.testing.assert_array_equal(jax.grad(f)(jnp.zeros(3), x), [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(jax.jacfwd(f)(jnp.zeros(3), x), [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(jax.jit(jax.grad(f))(jnp.zeros(3), x), [3.0] * 3)
    np.testing.assert_array_equal(jax.grad(f, 1)(jnp.zeros(3), x), [0.0, 0.0])
    hess = jax.hessian(f, argnums=(0, 1))(jnp.zeros(3), x)
    np.testing.assert_array_equal(hess[0][1], np.ones((3, 2)))
    assert not bool(tables.on_or_differentiated(jnp.zeros((), bool), jnp.zeros(3)))
