"""bench.profiling: optimised-HLO statistics and kernel attribution used by
profile_contact --compile-stages / --attribute."""
import jax
import jax.numpy as jnp

from bench.profiling import (compile_stats, hlo_attribution, hlo_stats,
                             runtime_attribution)


def _loop(x):
    return jnp.sin(x)[::2].sum() + jax.lax.fori_loop(0, 3, lambda i, c: c * 2, x[0])


def test_hlo_stats_counts_kernels_and_loops():
    st = compile_stats(jax.vmap(_loop), jnp.ones((4, 8)))
    assert st["whiles"] == 1
    assert st["fusions"] >= 2
    # a fusion counts once; the ops inside fusions and loop bodies count in ``ops``
    assert st["ops"] > st["kernels"] >= st["fusions"] + st["whiles"]
    assert st["eqns"] > 0 and st["compile_s"] >= 0
    assert hlo_stats(st["exe"].as_text())["kernels"] == st["kernels"]


def test_hlo_attribution_charges_kernels_to_functions():
    st = compile_stats(jax.vmap(_loop), jnp.ones((4, 8)))
    stage, leaf = hlo_attribution(st["exe"].as_text(), package="tests", skip_modules=())
    assert sum(stage.values()) == st["kernels"]
    assert any("test_profiling." in k for k in stage), stage
    assert sum(leaf.values()) >= st["kernels"] - 1


def _carry(x):
    return jax.lax.fori_loop(0, 3, lambda i, c: c * 2 + x, x)


def test_hlo_attribution_keys_unframed_kernels_by_opcode():
    # XLA's copy of the parameter into the loop's buffer names no source frame
    st = compile_stats(jax.vmap(_carry), jnp.ones((4, 8)))
    stage, _ = hlo_attribution(st["exe"].as_text(), package="tests", skip_modules=())
    assert stage["(no source frame: copy)"] >= 1, stage
    unframed = [k for k in stage if "test_profiling." not in k]
    assert all(k.startswith("(no source frame: ") for k in unframed), stage


def _heavy(x):
    return jnp.cumsum(jnp.sin(x) * jnp.cos(x), axis=-1)


def _two_parts(x):
    return _heavy(x) + jax.lax.fori_loop(0, 3, lambda i, c: c * 2 + 1, x)


def test_runtime_attribution_charges_traced_kernels_to_functions():
    """The profiler's kernel events are charged to the functions of the package on the
    kernels' stacks (the loop's own event left out: its kernels are events too)."""
    fn = jax.jit(jax.vmap(_two_parts))
    x = jnp.ones((64, 256))
    compiled = fn.lower(x).compile()
    spent, count = runtime_attribution(compiled, (x,), nrun=2, package="tests")
    assert spent and set(spent) == set(count)
    assert all(v >= 0 for v in spent.values())
    keys = " ".join(spent)
    assert "test_profiling._heavy" in keys, spent
    # the loop body's kernels run 3 times a call
    loop = [k for k in count if "<lambda>" in k or "_two_parts" in k]
    assert loop and max(count[k] for k in loop) >= 3, count
