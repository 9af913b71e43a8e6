"""simjax.engine.inline: the step traced with jax's jit disabled keeps its loops, the
caller's own disabled jit and the plugins' jit."""
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline

ENGINE = pathlib.Path(inline.__file__).parent

#: modules whose loops run outside the in-line step (the batch-minor program, the
#: length-range simulation)
_OUTSIDE_STEP = {"inline.py", "batch_minor.py", "lengthrange.py"}


def test_engine_loops_go_through_inline():
    """A jax loop called directly inside the in-line step would be unrolled (a disabled
    jit runs scans as Python loops): every engine loop goes through inline."""
    loop = re.compile(r"\blax\.(scan|while_loop|fori_loop|map)\(|jnp\.searchsorted\(")
    found = [f"{p.relative_to(ENGINE)}:{i}" for p in sorted(ENGINE.rglob("*.py"))
             if p.name not in _OUTSIDE_STEP
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if loop.search(line.split("#")[0])]
    assert found == []


def _primitives(fn, *args):
    return {e.primitive.name for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns}


def test_inline_scan_keeps_its_loop():
    def body(c, x):
        return c + x, c * x

    x = jnp.arange(5.0)
    kept = inline.inlined(lambda x: inline.scan(body, 0.0, x))
    unrolled = inline.inlined(lambda x: jax.lax.scan(body, 0.0, x))
    assert "scan" in _primitives(kept, x)
    assert "scan" not in _primitives(unrolled, x)
    a, b = kept(x), jax.lax.scan(body, 0.0, x)
    assert float(a[0]) == float(b[0]) and bool(jnp.all(a[1] == b[1]))


def test_outside_runs_with_jit():
    seen = {}

    def plugin(x):
        seen["plugin"] = bool(jax.config.jax_disable_jit)
        return x

    def step(x):
        seen["step"] = inline.active()
        return inline.outside(plugin)(x)

    inline.inlined(step)(1.0)
    assert seen == {"step": True, "plugin": False}
    assert not jax.config.jax_disable_jit


def test_callers_disabled_jit_is_left_alone():
    seen = {}

    def step(x):
        seen["active"] = inline.active()
        return inline.outside(lambda y: seen.setdefault("jit_off", bool(
            jax.config.jax_disable_jit)) and y)(x)

    with jax.disable_jit():
        inline.inlined(step)(1.0)
        assert jax.config.jax_disable_jit
    assert seen == {"active": False, "jit_off": True}


def test_scan_builds_uniform_constants_inside():
    """With ``consts_inside``, a scan body's constant arrays that are uniform (all
    entries equal) or 0, 1, ... are built in the body, not passed in as loop operands;
    other constants are; the results are the same."""
    table, zeros, idx = np.array([1.0, 2.0, 5.0]), np.zeros(3), np.arange(3)

    def body(c, x):
        return c * table + zeros[idx] + idx + x, c

    def consts(fn, *args):
        eqn = next(e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns
                   if e.primitive.name == "scan")
        return [v.aval.shape for v in eqn.invars[:eqn.params["num_consts"]]]

    c0, xs = jnp.ones(3), jnp.arange(2.0)
    plain = inline.inlined(lambda c: inline.scan(body, c, xs))
    inside = inline.inlined(lambda c: inline.scan(body, c, xs, consts_inside=True))
    assert len(consts(plain, c0)) > 1
    assert consts(inside, c0) == [(3,)]         # the table only
    for a, b in zip(jax.tree_util.tree_leaves(jax.jit(inside)(c0)),
                    jax.tree_util.tree_leaves(jax.jit(plain)(c0))):
        np.testing.assert_array_equal(a, b)


def test_scan_body_equations_copied(monkeypatch):
    """``consts_inside`` copies the traced body's equations into the scan's trace (no
    second evaluation of its jaxpr); the scan's body, its gradient and its values are
    those of the evaluated copy."""
    table, zeros = np.array([1.0, 2.0, 5.0]), np.zeros(3)

    def body(c, x):
        return jnp.sin(c * table + zeros) * x, jnp.sum(c)

    def traced():
        # a new function each time: jax caches traces by function
        def run(c):
            return inline.inlined(lambda c: inline.scan(body, c, jnp.arange(1.0, 4.0),
                                                        consts_inside=True))(c)
        return (str(jax.make_jaxpr(run)(c0)), jax.jit(run)(c0),
                jax.grad(lambda c: run(c)[0].sum())(c0))
    c0 = jnp.array([0.3, -0.2, 0.7])
    evaluated = []
    real = jax.core.eval_jaxpr
    monkeypatch.setattr(jax.core, "eval_jaxpr",
                        lambda *a, **k: evaluated.append(1) or real(*a, **k))
    copied = traced()
    assert not evaluated
    # each copied equation keeps its own source location (the body's line), as
    # eval_jaxpr's
    scan = next(e for e in jax.make_jaxpr(lambda c: inline.inlined(
        lambda c: inline.scan(body, c, jnp.arange(1.0, 4.0), consts_inside=True))(c))(
            c0).jaxpr.eqns if e.primitive.name == "scan")
    sin = next(e for e in scan.params["jaxpr"].jaxpr.eqns if e.primitive.name == "sin")
    names = [f.function_name for f in sin.source_info.traceback.frames]
    assert any(n.endswith("<locals>.body") for n in names), str(names)
    monkeypatch.setattr(inline, "COPY_EQUATIONS", False)
    again = traced()
    assert evaluated and again[0] == copied[0]
    for a, b in zip(jax.tree_util.tree_leaves(copied[1:]),
                    jax.tree_util.tree_leaves(again[1:])):
        np.testing.assert_array_equal(a, b)
