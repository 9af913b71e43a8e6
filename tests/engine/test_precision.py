"""Full float32 matrix products asked for on accelerators (simjax.engine.precision)."""
import jax
import jax.numpy as jnp
import pytest

import simjax
from simjax.engine import precision
from mujoco_oracle import corpus_path


def _dot_precisions(jaxpr, out):
    """The precision of every dot_general in ``jaxpr`` and the jaxprs inside it."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn.params["precision"])
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    _dot_precisions(sub.jaxpr, out)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    _dot_precisions(sub, out)
    return out


def _step_precisions(fn):
    m = simjax.load_model(corpus_path("gym_ant/ant.xml"))
    d = simjax.make_data(m)
    batch = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (2,) + x.shape), d)
    jaxpr = jax.make_jaxpr(jax.vmap(fn, in_axes=(None, 0)))(m, batch).jaxpr
    return _dot_precisions(jaxpr, [])


@pytest.fixture
def accelerator(monkeypatch):
    monkeypatch.setattr(precision, "_cpu", lambda: False)


@pytest.mark.parametrize("fn", [simjax.step, simjax.forward, simjax.inverse])
def test_highest_on_accelerators(accelerator, fn):
    found = _step_precisions(fn)
    assert len(found) > 10
    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    assert all(p == highest for p in found), set(found)


def test_cpu_program_unchanged(monkeypatch):
    monkeypatch.setattr(precision, "_cpu", lambda: True)
    found = _step_precisions(simjax.step)
    assert len(found) > 10
    assert all(p is None for p in found), set(found)


def test_users_own_precision_kept(accelerator):
    with jax.default_matmul_precision("tensorfloat32"):
        found = _step_precisions(simjax.step)
    high = (jax.lax.Precision.HIGH, jax.lax.Precision.HIGH)
    assert found and all(p == high for p in found), set(found)


def test_switch_off(accelerator, monkeypatch):
    monkeypatch.setattr(precision, "ON", False)
    assert all(p is None for p in _step_precisions(simjax.step))
