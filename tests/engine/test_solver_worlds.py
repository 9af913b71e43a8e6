"""The per-world rules under vmap (simjax.engine.solver_worlds): where_needed,
any_world."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _per_world(monkeypatch):
    """The per-world machinery is what these tests check, on every backend (on a GPU
    it is off by default: solver_worlds._PER_WORLD_WORK)."""
    from simjax.engine import solver_worlds as R
    monkeypatch.setattr(R, "_PER_WORLD_WORK", True)


def _loop_count(fn, *args):
    """The number of while loops in the jaxpr of ``fn(*args)``, nested ones included."""
    from engine_helpers import jaxpr_loops
    loops = jaxpr_loops(jax.make_jaxpr(fn)(*args).jaxpr)
    return sum(name == "while" for name, _ in loops)


@pytest.mark.parametrize("branches, one_block, per_world",
                         [("blocks", False, True), ("both", False, True),
                          ("blocks", True, True), ("blocks", False, False)])
@pytest.mark.parametrize("size", [5, 128, 300])
def test_where_needed_under_vmap(size, branches, one_block, per_world, monkeypatch):
    """where_needed under vmap: fn's result on the worlds in need (gathered in blocks, a
    batch not a multiple of the block; with ``branches`` "both" the whole batch where
    most need it; with ``one_block`` a batch of one block at most computed as it is;
    without ``per_world``, as on a GPU, the whole batch with no loop), the old value
    elsewhere, bit for bit as the vmapped fn on a CPU; one world: a conditional.
    On a GPU the kernels picked for a block of worlds and for the whole batch can round
    differently (the last bit of a float64 product, seen on an H200: 5e-15 on a value
    of 0.4 whose operands are about 50), so there the values are compared to rounding
    of the largest of them."""
    from simjax.engine import solver_worlds as R
    monkeypatch.setattr(R, "_BRANCHES", branches)
    monkeypatch.setattr(R, "_ONE_BLOCK", one_block)
    monkeypatch.setattr(R, "_PER_WORLD_WORK", per_world)

    def same(got, want):
        if jax.default_backend() == "cpu":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0,
                                       atol=1e-14 * max(1.0, np.abs(want).max()))

    rng = np.random.default_rng(size)
    a = jnp.asarray(rng.standard_normal((size, 6, 6)))
    b = jnp.asarray(rng.standard_normal(6))
    old = jnp.asarray(rng.standard_normal((size, 6)))

    def fn(x, y):
        return jnp.tanh(x @ y) * jnp.sum(x * x)

    run = jax.jit(jax.vmap(lambda n, x, o: R.where_needed(fn, n, (x, b), o)))
    full = np.asarray(jax.jit(jax.vmap(fn, in_axes=(0, None)))(a, b))
    loops = _loop_count(jax.vmap(lambda n, x, o: R.where_needed(fn, n, (x, b), o)),
                        jnp.zeros(size, bool), a, old)
    assert (loops > 0) == per_world
    for p in (0.0, 0.02, 0.5, 0.9, 1.0):
        need = rng.random(size) < p
        got = np.asarray(run(jnp.asarray(need), a, old))
        same(got, np.where(need[:, None], full, np.asarray(old)))
    # the same flag for every world (not batched)
    all_on = jax.jit(jax.vmap(lambda x, o: R.where_needed(fn, jnp.asarray(True), (x, b), o)))
    same(np.asarray(all_on(a, old)), full)
    one = jax.jit(lambda n, x, o: R.where_needed(fn, n, (x, b), o))
    same(np.asarray(one(True, a[0], old[0])), full[0])
    np.testing.assert_array_equal(np.asarray(one(False, a[0], old[0])), np.asarray(old[0]))


def test_any_world_loop():
    """any_world: a loop flag true while any world's is (unbatched under vmap, nested
    vmaps included); a loop whose body leaves finished worlds as they are then gives
    every world the result of its own loop."""
    from simjax.engine import solver_worlds as R

    def count(n):
        # doubles x until it passes n; the body leaves x alone once it has
        def body(x):
            return jnp.where(x > n, x, 2.0 * x)
        return jax.lax.while_loop(lambda x: R.any_world(x <= n), body, jnp.ones(()))

    n = jnp.asarray([0.5, 3.0, 100.0, 7.0])
    want = np.asarray([1.0, 4.0, 128.0, 8.0])
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(count))(n)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(count)(n[2])), want[2])
    nested = jax.jit(jax.vmap(jax.vmap(count)))(n.reshape(2, 2))
    np.testing.assert_array_equal(np.asarray(nested), want.reshape(2, 2))
    flags = jax.jit(jax.vmap(R.any_world))(jnp.asarray([False, True, False]))
    assert np.asarray(flags).all()
    assert not np.asarray(jax.jit(jax.vmap(R.any_world))(jnp.zeros(3, bool))).any()


@pytest.mark.parametrize("compact,gather,per_world",
                         [(0, 0, True), (8, 0, True), (8, 8, True), (8, 16, True),
                          (8, 8, False)])
def test_live_loop(compact, gather, per_world, monkeypatch):
    """live_loop: every world's values those of its own loop, under vmap (the laggards
    gathered and iterated alone once at most 1/8 of the worlds are live; or, with
    ``gather``, every pass on the first 1/8 or 1/16 of the batch's live worlds gathered,
    the batch not a multiple of it; batches too small to compact; nested vmaps;
    without ``per_world``, as on a GPU, one loop over the batch) and for one world; the
    body closes over batched floats and integers and an unbatched integer."""
    from simjax.engine import solver_worlds as R
    monkeypatch.setattr(R, "_COMPACT", compact)
    monkeypatch.setattr(R, "_GATHER", gather)
    monkeypatch.setattr(R, "_PER_WORLD_WORK", per_world)
    rng = np.random.default_rng(1)

    def run(n, step, cap):
        # doubles x (step times per pass) until it passes n or has made cap passes;
        # a world that is done is left as it is
        def live(c):
            return (c[0] <= n) & (c[1] < cap)

        def body(c):
            on = live(c)
            return (jnp.where(on, c[0] * 2.0 ** step, c[0]),
                    jnp.where(on, c[1] + 1, c[1]))
        return R.live_loop(live, body, (jnp.ones(()), jnp.zeros((), jnp.int32)))

    def want(n, step, cap):
        x, k = 1.0, 0
        while x <= n and k < cap:
            x, k = x * 2.0 ** step, k + 1
        return x, k

    for size in (5, 40, 300):
        # a few laggards: most worlds stop after a pass or two
        n = np.where(rng.random(size) < 0.1, 10.0 ** rng.uniform(2, 9, size),
                     rng.uniform(0.5, 3.0, size))
        step = rng.integers(1, 3, size).astype(np.int32)
        if size == 300:
            # one loop without the machinery; with it, the gathered trips' loops too
            loops = _loop_count(jax.vmap(run, in_axes=(0, 0, None)), jnp.asarray(n),
                                jnp.asarray(step), 20)
            assert (loops == 1) == (not per_world or not compact)
        got = jax.jit(jax.vmap(run, in_axes=(0, 0, None)))(jnp.asarray(n),
                                                           jnp.asarray(step), 20)
        ref = np.asarray([want(a, b, 20) for a, b in zip(n, step)])
        np.testing.assert_array_equal(np.asarray(got[0]), ref[:, 0])
        np.testing.assert_array_equal(np.asarray(got[1]), ref[:, 1])
    nested = jax.jit(jax.vmap(jax.vmap(run, in_axes=(0, 0, None)), in_axes=(0, 0, None)))(
        jnp.asarray(n[:40].reshape(2, 20)), jnp.asarray(step[:40].reshape(2, 20)), 7)
    ref = np.asarray([want(a, b, 7) for a, b in zip(n[:40], step[:40])])
    np.testing.assert_array_equal(np.asarray(nested[0]).reshape(-1), ref[:, 0])
    np.testing.assert_array_equal(np.asarray(nested[1]).reshape(-1), ref[:, 1])
    one = jax.jit(run)(jnp.asarray(n[0]), jnp.asarray(step[0]), 20)
    assert (float(one[0]), int(one[1])) == want(n[0], step[0], 20)


@pytest.mark.parametrize("gather", [0, 8])
def test_live_loop_tables(gather, monkeypatch):
    """live_loop remakes a needy_table the body closes over for the worlds it gathers
    (the laggards, or with ``gather`` the worlds of every pass): the table lists worlds
    of the batch (a rule reading it as such, as the solver's loops over later row chunks
    do, gives each world its own result only with the table of the batch it runs
    on)."""
    from simjax.engine import solver_worlds as R
    monkeypatch.setattr(R, "_GATHER", gather)

    @jax.custom_batching.custom_vmap
    def bump(tab, nact, x):
        # x + 1 where nact > 1; under vmap by the table's list of worlds
        return jnp.where(nact > 1, x + 1.0, x)

    @bump.def_vmap
    def _rule(size, flags, tab, nact, x):
        x = x if flags[2] else jnp.broadcast_to(x, (size,))

        def put(c):
            j, y = c
            w = tab[j]
            return j + 1, y.at[w].add(1.0)

        def more(c):
            return (c[0] < size) & (tab[jnp.minimum(c[0], size - 1)] < size)

        return jax.lax.while_loop(more, put, (jnp.zeros((), jnp.int32), x))[1], True

    def run(nact, cap):
        tab = R.needy_table(nact)

        def live(c):
            return c[1] < cap

        def body(c):
            on = live(c)
            return (jnp.where(on, bump(tab, nact, c[0]), c[0]),
                    jnp.where(on, c[1] + 1, c[1]))
        return R.live_loop(live, body, (jnp.zeros(()), jnp.zeros((), jnp.int32)),
                           tables=((tab, nact),))

    rng = np.random.default_rng(2)
    size = 64
    nact = rng.integers(0, 4, size).astype(np.int32)
    # a few laggards (most worlds stop after one pass)
    cap = np.where(rng.random(size) < 0.1, rng.integers(3, 9, size), 1).astype(np.int32)
    got = jax.jit(jax.vmap(run))(jnp.asarray(nact), jnp.asarray(cap))
    np.testing.assert_array_equal(np.asarray(got[0]), np.where(nact > 1, cap, 0))
    np.testing.assert_array_equal(np.asarray(got[1]), cap)


def test_hoisted_body_traced_in_line():
    """Inside simjax's in-line trace (simjax.engine.inline), a live_loop body hoisted by
    _hoisted is traced in line too: its jax.numpy calls bind their primitives (no call
    of jnp.where's own jit left in the body), with the same values."""
    from simjax.engine import inline
    from simjax.engine import solver_worlds as R

    def body(c):
        return jnp.where(c > 1.0, c * 0.5, c + 1.0)

    def hoisted(x):
        g, consts = R._hoisted(body, x)
        return g(x, *consts)

    x = jnp.asarray([0.5, 3.0])
    eqns = jax.make_jaxpr(inline.inlined(hoisted))(x).jaxpr.eqns
    assert {e.primitive.name for e in eqns} == {"gt", "mul", "add", "select_n"}
    np.testing.assert_array_equal(np.asarray(inline.inlined(hoisted)(x)), [1.5, 1.5])


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("shared_nact", [False, True])
def test_live_loop_lazy(lazy, shared_nact, monkeypatch):
    """live_loop's gathered loop passes the arrays named ``lazy`` (read by the body only
    where nact > 1) gathered for the trip's worlds on the trips that include such a
    world, and on the others arrays no world reads (here NaN, solver_worlds._POISON):
    every world's values those of its own loop, one or two worlds per trip, the worlds
    reading them among others that do not. ``shared_nact``: one nact for every world
    (unbatched), 2 in one batch and 1 in the other."""
    from simjax.engine import solver_worlds as R
    monkeypatch.setattr(R, "_GATHER", 16)
    monkeypatch.setattr(R, "_LAZY", lazy)
    monkeypatch.setattr(R, "_POISON", True)

    def run(nact, src, cap):
        def live(c):
            return c[1] < cap

        def body(c):
            on = live(c)
            # the source row the pass reads: where nact > 1 only
            add = jnp.where(nact > 1, src[c[1] % src.shape[0]], 0.5)
            return jnp.where(on, c[0] + add, c[0]), jnp.where(on, c[1] + 1, c[1])
        return R.live_loop(live, body, (jnp.zeros(()), jnp.zeros((), jnp.int32)),
                           lazy=(nact, [src]))

    rng = np.random.default_rng(3)
    for size in (20, 40):
        nact = np.where(rng.random(size) < 0.2, 2, 1).astype(np.int32)
        if shared_nact:
            nact[:] = 2 if size == 20 else 1
        src = rng.random((size, 5)).astype(np.float32)
        cap = rng.integers(1, 7, size).astype(np.int32)
        vrun = jax.vmap(run, in_axes=(None if shared_nact else 0, 0, 0))
        got = jax.jit(vrun)(jnp.asarray(nact[0] if shared_nact else nact),
                            jnp.asarray(src), jnp.asarray(cap))
        want = [sum(float(src[w, i % 5]) if nact[w] > 1 else 0.5 for i in range(cap[w]))
                for w in range(size)]
        np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(got[1]), cap)


@pytest.mark.parametrize("nested", [True, False])
def test_batched_like_batches_every_vmap_level(nested, monkeypatch):
    """A loop whose start is made batched_like its input is batched in one round of
    the carry fixpoint at every vmap level (two nested vmaps, as a collider's pairs
    inside the batch's worlds); with batched_like at the innermost level only
    (_NESTED False) the outer level takes a second round; without it, both do. The
    values are the same either way."""
    from simjax.engine import inline
    from simjax.engine import solver_worlds as R
    rounds = pytest.importorskip("bench.profile_batching").rounds
    monkeypatch.setattr(R, "_NESTED", nested)

    def walk(x, start):
        init = (jnp.zeros(()), jnp.zeros(3))
        if start:
            init = R.batched_like(init, x)
        return inline.fori_loop(0, 4, lambda i, c: (c[0] + x[0], c[1] * 0.5 + x), init)

    x = jnp.arange(12.0).reshape(2, 2, 3)
    for start in (True, False):
        fn = jax.vmap(jax.vmap(lambda v, s=start: walk(v, s)))
        found = rounds(fn, x)
        assert sum(v[1] for v in found.values()) == 2        # batched at both levels
        most = [v[0] for v in found.values()]
        assert most == ([1] if start and nested else [2]), (start, nested, found)
        ref = jax.vmap(jax.vmap(lambda v: walk(v, False)))(x)
        np.testing.assert_array_equal(jax.jit(fn)(x)[1], ref[1])
