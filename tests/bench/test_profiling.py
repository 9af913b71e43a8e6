"""bench.profiling: optimised-HLO statistics and kernel attribution used by
profile_contact --compile-stages / --attribute."""
import jax
import jax.numpy as jnp

from bench.profiling import compile_stats, hlo_attribution, hlo_stats


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
