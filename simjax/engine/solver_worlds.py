"""Per-world machinery of the primal solvers under ``vmap`` (:mod:`simjax.engine.solver`,
:mod:`simjax.engine.solver_rows`): work done only on the worlds of a batch that need it
(:func:`where_needed`: Newton's Hessian factorisations; :func:`needy_table`: the worlds
whose active rows pass chunk 0), written back row by row (:func:`_put_rows`), and loop
flags and initial values made unbatched / batched for ``lax.while_loop`` under vmap
(:func:`any_world`, :func:`batched_like`), and the primal solvers' loop iterating its
laggard worlds alone (:func:`live_loop`). MuJoCo solves one world at a time; these
rules keep a batch's work close to that of the worlds that need it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.math import reduce_fused, where


#: worlds per block of :func:`where_needed`. Blocks of 32 inside the Newton loop's
#: trips of 128 worlds (each block computed only where one of its worlds needs a new
#: factor) against one block: the solve alone on settled states (batch 1024, float32,
#: 10 paired rounds) humanoid 0.989 [0.895, 1.112], ant 0.888 [0.815, 1.342]; blocks of
#: 64, humanoid 1.025 [0.919, 1.240]: noise, outputs bit-identical
_WORLD_BLOCK = 128


#: whether the batch's work follows the worlds that need it (:func:`where_needed`'s
#: blocks, :func:`live_loop`'s gathered trips, the later row chunks one world at a time,
#: :func:`~simjax.engine.solver_gather.Rows`' ``blocks``), read at trace time. None: on
#: where jax's default backend is the CPU, off elsewhere; True / False force it. Those
#: loops suit a CPU, where a kernel's time follows its work. On a GPU a loop's trip is a
#: few launches over a handful of worlds and a copy of its flag to the host, and the
#: whole batch costs about what one block does. On an H200 (bench rollouts, batch 4096,
#: float32, 2 steps a call, on / off paired in one process, medians of 6 calls):
#: humanoid 5.1K -> 380.0K steps/s, ant 2.1K -> 266.5K; barkour 1.85M / 1.84M, shadow
#: hand 0.88M / 0.91M (their later row chunks are rare). Off, the same solves run on
#: the whole batch (loops to the batch's last live world, every world's result kept
#: where it needs one); on a CPU the programs are those of before (same HLO text).
_PER_WORLD_WORK = None


def per_world_work():
    """:data:`_PER_WORLD_WORK` as it applies to the program being traced."""
    if _PER_WORLD_WORK is not None:
        return _PER_WORLD_WORK
    return jax.default_backend() == "cpu"


def _first_worlds(need, k):
    """Indices of the true entries of ``need`` (n,) in order, then n, k of them: one
    sort of keys that put the true entries first, each keeping its index. For the
    worlds of a batch (one vector, not under vmap) the sort is 3 kernels where
    :func:`first_true`'s count and binary search were 18 (the humanoid's step 653 ->
    638 kernels), in the same time at 1024 worlds (27 us); over each world's rows
    (under vmap) it ran 2x slower than first_true (232 rows: 3.8 against 1.8 us per
    world)."""
    n = need.shape[0]
    # NumPy constants (jnp.arange and n + ids were a kernel of their own, made at run time)
    ids = np.arange(n, dtype=np.int32)
    key = jnp.sort(where(need, ids, n + ids))
    pos = where(key < n, key, n)
    return jnp.concatenate([pos, jnp.full((k - n,), n, jnp.int32)]) if k > n else pos[:k]


def needy_table(nact):
    """Under ``vmap``, the worlds whose active rows pass chunk 0 (``nact`` > 1), found
    once per solve for all its loops over the later chunks (:func:`~simjax.engine.
    solver_rows._world_loop`): their indices in order, then the batch size (worlds,)
    (int32). Without vmap (or for an
    unbatched ``nact``) zero, unused."""
    @jax.custom_batching.custom_vmap
    def run(n):
        return jnp.zeros((), jnp.int32)

    @run.def_vmap
    @inline.inlined
    def _rule(size, flags, n):
        if not flags[0]:
            return jnp.zeros((), jnp.int32), False
        return _needy(n, size), True

    return run(nact)


def _needy(nact, size):
    """:func:`needy_table` of the batch's ``nact`` (size,)."""
    return _first_worlds(nact > 1, size)


#: the loops' dynamic indices (chunk, block, entry counters) are never negative: their
#: slices and updates are made without jax's wrap of negative indices (a select per
#: index, a scalar kernel of its own or a select in the slice's kernel); read at trace
#: time (False: with the wrap, kept to compare). Barkour's bench rollout one kernel
#: fewer (a dynamic slice in the Newton pass's loop over the later chunks), the
#: selects gone from the others; outputs bit-identical
_NONNEG = True


def nonneg():
    """Keyword arguments of jax's dynamic slices and updates for indices that are never
    negative (:data:`_NONNEG`)."""
    return dict(allow_negative_indices=False) if _NONNEG else {}


def entry(a, i):
    """Entry ``i`` (traced, not negative) of the vector ``a``."""
    return jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False, **nonneg())


def _put_rows(full, ids, rows):
    """``full`` (a tree, leading axis the worlds) with entry ``ids()[j]`` replaced by
    ``rows``' entry j for the entries of ``ids()`` (a function: the indices computed
    where used) before the first past the last world:
    one loop of in-place row updates for every leaf (a scatter is a loop of its own per
    leaf on XLA CPU: :func:`where_needed`'s Hessian factors, humanoid and ant 2 kernels
    more), over the worlds of the block only."""
    size = jax.tree_util.tree_leaves(full)[0].shape[0]
    n = jax.tree_util.tree_leaves(rows)[0].shape[0]

    def put(c):
        j, full = c

        def one(f, r):
            return jax.lax.dynamic_update_index_in_dim(
                f, jax.lax.dynamic_index_in_dim(r, j, 0, keepdims=True, **nonneg()),
                entry(ids(), j), 0, **nonneg())

        return j + 1, jax.tree_util.tree_map(one, full, rows)

    def more(c):
        return (c[0] < n) & (entry(ids(), jnp.minimum(c[0], n - 1)) < size)

    return inline.while_loop(more, put, (jnp.zeros((), jnp.int32), full))[1]


#: :func:`where_needed` writes a block's results back by :func:`_put_rows`, a loop to
#: the block's last world, read at trace time (False: a scatter per leaf, a loop over
#: every entry of the block, kept to compare): humanoid's bench rollout 660 -> 658
#: kernels, ant 592 -> 590; outputs bit-identical; run time within noise (scatter /
#: put rows: humanoid 1.063 [0.93, 1.34], ant 1.016 [0.85, 1.29], 8 paired rounds)
_PUT_ROWS = True


#: where_needed's branches, read at trace time: "blocks", the worlds in need in blocks
#: whatever their number; "both" (kept to compare), a conditional between fn on the
#: whole batch, where more than 3/5 of the worlds need it, and the blocks. Inside
#: Newton's loop the conditional's operand and result, the Hessian factors of the
#: batch, were copied on every pass (two f32[1024, 27, 27] copies per pass on the
#: humanoid). Bench rollouts (batch 1024, float32, from the state after 12 steps,
#: paired in one process, process CPU, loads 5-10): humanoid 0.940 [0.758, 1.097]
#: (10 rounds), 0.921 [0.712, 1.269] (20), 0.984 [0.717, 1.118] (20); ant 0.961
#: [0.764, 1.505] (14), 1.016 [0.945, 1.124] (20); with every world in need on every
#: pass (humanoid, chunk 0 cut to 8 rows past the equality rows) 1.029 [0.928,
#: 1.081] (12). Kernels (fn compiled once): humanoid 618 -> 610, ant 534 -> 526; XLA
#: CPU time 0.96, 0.95 (3 pairs). Float32 outputs bit-identical; float64 ant
#: bit-identical, humanoid within 2e-13 relative (XLA's fusions around the loop
#: differ; a factor alone is the same bits either way)
_BRANCHES = "blocks"


def where_needed(fn, need, args, old):
    """``fn(*args)`` where ``need``, else ``old`` (a tree shaped as fn's output).

    One world computes fn only where needed (a conditional). Under ``vmap`` (a
    ``custom_vmap`` rule) the worlds that need it are found, gathered in blocks of
    _WORLD_BLOCK and computed block by block, their results written into ``old``:
    the work follows the number of worlds in need, not the batch size, and every world's
    result is computed as the vmapped fn computes it (the same bits on a CPU; on a GPU
    a block's kernels may round the last bit differently). A batch of one block at
    most (:data:`_ONE_BLOCK`: the trips of :func:`live_loop`) is computed as it is,
    where any world needs it, and kept where needed. Where most worlds need it,
    they are still computed in blocks (:data:`_BRANCHES`): a conditional between fn on
    the whole batch and the blocks compiled fn twice, and inside Newton's loop its
    operand and result (the Hessian factors of the batch) were copied on every pass,
    about what gathering and writing back the worlds costs."""
    @jax.custom_batching.custom_vmap
    def run(need, args, old):
        return jax.lax.cond(need, lambda: fn(*args), lambda: old)

    @run.def_vmap
    @inline.inlined
    def _rule(size, flags, need, args, old):
        nb, ab, ob = flags
        # an unbatched flag (the same for every world) is spread like the rest
        need, old = jax.tree_util.tree_map(
            lambda v, f: v if f else jnp.broadcast_to(v, (size,) + v.shape),
            (need, old), (nb, ob))
        axes = jax.tree_util.tree_map(lambda f: 0 if f else None, ab)
        vfn = jax.vmap(fn, in_axes=tuple(axes))
        count = reduce_fused(need.astype(jnp.int32), 0)

        def whole():
            def keep(n, o):
                return where(need.reshape((size,) + (1,) * (o.ndim - 1)), n, o)

            return jax.tree_util.tree_map(keep, vfn(*args), old)

        def blocks():
            blk = min(_WORLD_BLOCK, size)
            nblk = -(-size // blk)
            pos = _first_worlds(need, nblk * blk)

            def body(c):
                b, out = c
                ids = jax.lax.dynamic_slice_in_dim(pos, b * blk, blk, **nonneg())
                # padding entries (index size) read the last world and are not written
                sub = jax.tree_util.tree_map(
                    lambda a, f: jnp.take(a, ids, axis=0, mode="clip") if f else a,
                    args, ab)
                new = vfn(*sub)
                if _PUT_ROWS:
                    out = _put_rows(out, lambda: jax.lax.dynamic_slice_in_dim(
                        pos, b * blk, blk, **nonneg()), new)
                else:
                    out = jax.tree_util.tree_map(
                        lambda o, n: o.at[ids].set(n, mode="drop"), out, new)
                return b + 1, out

            return inline.while_loop(lambda c: c[0] * blk < count, body,
                                     (jnp.zeros((), jnp.int32), old))[1]

        def one_block():
            # every world of the batch in the one block: fn on the batch as it is, kept
            # where needed (no gather, sort or row write-back)
            def body(c):
                b, out = c
                return b + 1, jax.tree_util.tree_map(
                    lambda n, o: where(need.reshape((size,) + (1,) * (o.ndim - 1)), n, o),
                    vfn(*args), out)

            return inline.while_loop(lambda c: (c[0] == 0) & (count > 0), body,
                                     (jnp.zeros((), jnp.int32), old))[1]

        if not per_world_work():
            out = whole()
        elif _ONE_BLOCK and size <= _WORLD_BLOCK:
            out = one_block()
        elif _BRANCHES == "blocks":
            out = blocks()
        else:
            out = jax.lax.cond(5 * count > 3 * size, whole, blocks)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(need, args, old)


#: where_needed on a batch of at most one block (:data:`_WORLD_BLOCK`; Newton's
#: factorisations inside :func:`live_loop`'s gathered trips, 128 worlds at batch 1024)
#: computes fn on the batch as it is, where any world needs it, and keeps it where
#: needed, read at trace time (False: the worlds gathered and written back as a
#: block's, kept to compare). A block computes fn on a full block anyway (padding
#: worlds included): this leaves out the sort, the gathers of fn's operands and the
#: row-by-row write-back. The solve alone (bench states after 12 steps, batch 1024,
#: float32, process CPU, paired in one process), on / off: ant 0.978 [0.878, 1.168]
#: (40 rounds) and, order reversed, 1 / 1.038 [0.930, 1.208] (40); humanoid 0.965
#: [0.886, 1.109] and 1 / 1.040 [0.893, 1.171] (30 each). Bench rollouts (14 rounds):
#: ant 0.993 [0.846, 1.100], humanoid 0.990 [0.746, 1.281] (the solve is a part of
#: the step); on an idle host, wall time, ant 0.902 [0.800, 1.019] and, order
#: reversed, humanoid 1 / 1.006 [0.851, 1.285] (10 rounds each). Kernels ant 535 ->
#: 524, humanoid 613 -> 602; XLA compile CPU (8 rounds) ant 0.972 [0.884, 1.198],
#: humanoid 1.003 [0.949, 1.069]; barkour's and the shadow hand's programs unchanged.
#: Outputs: float64 (batch 64, 8 steps) bit-identical on both, the humanoid's at batch
#: 1024 (4 steps) too; the ant's at batch 1024 within rounding (float64, one step: the
#: last forward's constraint forces 4e-15 relative in 3 of 1024 worlds, qacc within
#: 1.2e-13 in 233 through RK4's stages; fn's inputs are fused into other kernels,
#: whose multiply-adds LLVM contracts otherwise)
_ONE_BLOCK = True


def any_world(flag):
    """A loop's continue flag, made unbatched under ``vmap``: true while it is true for
    any world. For a loop whose body leaves a world's carried values as they are once
    its flag is false, the loop is then the same, world by world: with the flag batched,
    vmap would instead select, every trip, between the body's outputs and its inputs for
    every carried value (all of them, the Newton factor included)."""
    @jax.custom_batching.custom_vmap
    def run(flag):
        return flag

    @run.def_vmap
    @inline.inlined
    def _rule(size, flags, flag):
        return (reduce_fused(flag.reshape(size, -1), 0, "any").any(-1) if flags[0]
                else flag), False

    return run(flag)


def batched_like(tree, like):
    """``tree`` as it is; under ``vmap``, where ``like`` is batched, every leaf batched
    (broadcast over the worlds). For a loop's initial values: vmap batches a loop body
    again for every round in which an unbatched initial value is found to become
    batched in the body (Newton's loop: four rounds, each one re-tracing the
    conditionals and custom rules inside); with every value batched from the start,
    one."""
    @jax.custom_batching.custom_vmap
    def run(tree, like):
        return tree

    @run.def_vmap
    @inline.inlined
    def _rule(size, flags, tree, like):
        out = jax.tree_util.tree_map(
            lambda v, f: v if f else jnp.broadcast_to(v, (size,) + jnp.shape(v)), tree,
            flags[0])
        if _NESTED:
            # under nested vmaps (a collider's pairs inside the batch's worlds) the
            # broadcast values are batched at this level only: batched at the outer
            # levels too where ``like`` is
            out = batched_like(out, like)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(tree, like)


#: :func:`batched_like` under nested vmaps batches at every level where ``like`` is
#: batched (read at trace time; False: at the innermost level only, kept to compare).
#: GJK's loop inside a collider's vmap over its pairs was batched twice at the batch's
#: level. With the polygonQuad walk's start batched too: the pusher's bench rollout
#: (batch 64) traced in 1.74-2.03 -> 1.66-1.84 s CPU (5 fresh-process pairs), the
#: lowering 0.43-0.55 -> 0.43-0.51; the four bench models, the Trossen arm and the
#: Gymnasium humanoid within noise; outputs bit-identical (pusher, Trossen, humanoid,
#: ant, barkour, shadow hand; 5 steps, batch 16, float32 and float64)
_NESTED = True


#: :func:`live_loop`'s compaction, read at trace time: under vmap, once at most
#: 1/_COMPACT of the batch's worlds are live, they are gathered and iterated alone
#: (0: never, the loop on the whole batch to the end, kept to compare). Newton's loop
#: on the humanoid's bench rollout (batch 1024, float32) runs 8-10 passes for 3-4
#: iterations per world on average; its last passes have 2-7% of the worlds live.
#: Bench rollouts (4 steps, paired in one process, process CPU, loads 7-9), 0 / 8:
#: humanoid 0.921 [0.809, 1.087] (16 rounds) and 0.939 [0.760, 1.047] (10), wall
#: time 0.856 [0.299, 1.061] (10); ant 0.868 [0.790, 0.919] and 0.869 [0.725, 0.984]
#: (8 each); barkour 0.970 [0.864, 1.094], shadow hand 0.992 [0.939, 1.069] (8 each).
#: 4 and 16 against 8 on the humanoid: 0.998, 1.006 (8 rounds each). Float32 states
#: bit-identical on the humanoid, barkour and shadow hand; the ant's differ from the
#: second step on, by the last bit of a world (float64: 1.4e-17 relative): kernels
#: of another batch size. The loop's body is compiled twice: the humanoid's rollout
#: 606 -> 735 kernels, compile CPU 1.178 [1.145, 1.297] (4 rounds). Measured again
#: on an idle machine (wall time, 8 rounds): the ant's step without / with 1.267
#: [0.938, 1.334]
_COMPACT = 8


def live_loop(live, body, init, tables=(), lazy=None):
    """``while any world is live: init = body(init)``, with ``live(c)`` a world's flag,
    for a body that leaves a world's values as they are once it is not live (Newton's
    and CG's passes). One world: a while loop on ``live``. Under ``vmap``
    the batch's last passes, run for its laggards, would cost a pass over the batch
    each: by default (:data:`_GATHER`) every pass gathers the first 1/8 of the batch's
    live worlds (the loop's carry and the arrays ``body`` and ``live`` close over),
    makes one pass on them and writes them back, the body compiled once; with
    :data:`_GATHER` 0, passes over the batch until at most 1/:data:`_COMPACT` of the
    worlds are live, then those gathered and iterated to the end alone. Every world
    makes the same passes as it would alone.

    ``tables``: pairs (table, nact) of :func:`needy_table`'s tables that ``body`` closes
    over (lists of worlds of the batch, not values per world): remade for the gathered
    worlds.

    ``lazy``: None, or (nact, arrays): arrays ``body`` closes over that it reads only
    for the worlds whose ``nact`` > 1 (the later row chunks' sources); the loop of
    :data:`_GATHER` gathers them only on the passes whose worlds include one."""
    if not _COMPACT or not per_world_work():
        return inline.while_loop(lambda c: any_world(live(c)), body, init)
    bfun, bconsts = _hoisted(body, init)
    lfun, lconsts = _hoisted(live, init)
    # the positions of the tables among body's hoisted values, and their nact
    where_tab = [next((i for i, c in enumerate(bconsts) if c is t), None)
                 for t, _ in tables]
    keys = [n for (_, n), i in zip(tables, where_tab) if i is not None]
    where_tab = [i for i in where_tab if i is not None]
    # the positions of the lazy arrays among body's hoisted values, and their nact
    lazy_nact, lazy_ids = (None, []) if lazy is None else (lazy[0], [
        i for i, c in enumerate(bconsts) if any(c is a for a in lazy[1])])
    keys = (keys, lazy_nact)

    @jax.custom_batching.custom_vmap
    def run(bconsts, lconsts, init, keys):
        return inline.while_loop(lambda c: lfun(c, *lconsts), lambda c: bfun(c, *bconsts),
                                 init)

    @run.def_vmap
    @inline.inlined
    def _rule(size, flags, bconsts, lconsts, init, keys):
        bf, lf, cf, (kf, nf) = flags
        keys, nact = keys
        init = jax.tree_util.tree_map(
            lambda v, f: v if f else jnp.broadcast_to(v, (size,) + jnp.shape(v)), init, cf)
        vbody = jax.vmap(bfun, in_axes=(0,) + tuple(0 if f else None for f in bf))
        vlive = jax.vmap(lfun, in_axes=(0,) + tuple(0 if f else None for f in lf))
        k = size // _COMPACT

        def count(c, lc):
            return reduce_fused(vlive(c, *lc).astype(jnp.int32), 0)

        if k < 1:
            out = inline.while_loop(lambda c: count(c, lconsts) > 0,
                                    lambda c: vbody(c, *bconsts), init)
            return out, jax.tree_util.tree_map(lambda _: True, out)
        if _GATHER:
            lz = ((nact, nf, [i for i in lazy_ids if bf[i]])
                  if _LAZY and nact is not None else None)
            out = _gathered(max(1, size // _GATHER), vbody, vlive, bconsts, lconsts,
                            init, bf, lf, [(i, key, f) for i, key, f in
                                           zip(where_tab, keys, kf) if bf[i]], lz)
            return out, jax.tree_util.tree_map(lambda _: True, out)
        c = inline.while_loop(lambda c: count(c, lconsts) > k,
                              lambda c: vbody(c, *bconsts), init)
        pos = _first_worlds(vlive(c, *lconsts), k)

        def sub(tree, fl):
            return jax.tree_util.tree_map(
                lambda a, f: jnp.take(a, pos, axis=0, mode="clip") if f else a, tree, fl)

        sb, sl = list(sub(bconsts, bf)), sub(lconsts, lf)
        for i, key, f in zip(where_tab, keys, kf):
            # a table of the batch's worlds: that of the gathered worlds
            if bf[i]:
                sb[i] = _needy(jnp.take(key, pos, axis=0, mode="clip") if f else
                               jnp.broadcast_to(key, (k,)), k)
        s = inline.while_loop(lambda s: count(s, sl) > 0, lambda s: vbody(s, *sb),
                              sub(c, jax.tree_util.tree_map(lambda _: True, c)))
        out = _put_rows(c, lambda: pos, s)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(bconsts, lconsts, init, keys)


#: :func:`live_loop` under vmap, read at trace time: 0, the batch's passes until at most
#: 1/:data:`_COMPACT` of its worlds are live, then those gathered and iterated alone
#: (the body compiled at two batch sizes); n > 0, :func:`_gathered` at 1/n of the
#: batch (the body compiled once). Bench rollouts (batch 1024,
#: float32, the state after 4 steps, process CPU, paired in one process, loads 6-11),
#: _gathered / the two phases: humanoid n = 16 0.989 [0.756, 1.125], 1.153 [0.907,
#: 1.345], 1.014 [0.832, 1.232] (8, 10, 10 rounds); n = 8 1.128, 1.058, 1.104; n = 32
#: 1.026; n = 4, 2: 1.208, 1.354 (8 rounds each); ant n = 16 1.171 [1.035, 1.340],
#: 1.212 [0.922, 1.647] (8, 10), n = 8 1.187: the ant's worlds are mostly done after
#: one or two passes, one pass over the batch in the phases, 1/n-sized trips (a fixed
#: cost each) and gathers here. Kernels ant 634 -> 528, humanoid 725 -> 617; XLA
#: compile CPU ant 0.813 [0.727, 1.003], humanoid 0.889 [0.735, 1.138] (8 rounds);
#: outputs (batch 64, 8 steps) bit-identical in float32 and float64 on both. The cost
#: per trip beyond the body's is the gathers of the arrays the body closes over (ant
#: 13 KB a world, humanoid 40 KB, two thirds of it the later row chunks' sources),
#: not the kernels' launches: a pass on 128 of the ant's worlds (each trip the second
#: pass of its worlds, 1024 worlds) 0.28 ms with those arrays gathered once, 0.50 ms
#: gathered on every trip, 0.36 ms with the later chunks' sources gathered only where
#: read (:data:`_LAZY`), against 2.43 ms for a pass on the 1024 worlds (humanoid
#: 0.77, 1.15, 0.85 against 7.68 ms). With :data:`_LAZY`, n = 8 against the two
#: phases (bench rollouts, process CPU, 10 rounds, loads 7-8): ant 1.080 [1.032,
#: 1.256], humanoid 0.972 [0.855, 1.018]; XLA compile CPU (8 rounds) ant 0.792
#: [0.666, 0.859], humanoid 0.850 [0.811, 0.906]. On an idle machine (wall time, 10
#: rounds each): ant 1.062 [0.995, 1.317] and 1.082 [0.913, 1.535], humanoid 0.934
#: [0.780, 1.148]; ant XLA compile CPU 0.814 [0.771, 0.978] (6 rounds). The default is
#: 8 (0 kept to compare): the ant's step about 7% slower, its compile about a fifth
#: shorter (compile is where the bench rollouts miss their target, not run time
#: against MJX), the humanoid's run and compile both shorter. Small batches, whose
#: trips hold few worlds (one below 16 worlds), 8 against 0, idle, 8 rounds each: ant
#: 1.053 [0.797, 1.180] at 32 worlds, 0.988 [0.874, 1.250] at 128, 0.947 [0.784, 1.297]
#: at 4; humanoid 1.068 [0.836, 1.276] at 4 (the step's other costs dominate there)
_GATHER = 8


#: :func:`_gathered` gathers the arrays ``live_loop``'s ``lazy`` names only on the
#: trips whose worlds include one that reads them (False: on every trip, kept to
#: compare), read at trace time. The ant's solve (batch 1024, float32, n = 8, paired
#: against the two phases, 6 rounds): 1.341 [1.277, 2.728] without, 1.172 [0.994,
#: 2.356] with; outputs bit-identical. Bench rollouts (process CPU, paired, _GATHER 8),
#: without / with: ant 0.951 [0.902, 1.044] (10 rounds), humanoid 0.938 [0.874,
#: 1.203] (8)
_LAZY = True

# Measured and not taken (batch 1024, float32; "solve": fwd_constraint alone on the
# bench's states after 12 steps, process CPU, paired in one process): a trip keeping
# the last trip's worlds, their carry and gathered arrays, while they still are the
# first live worlds (the ant's solve 17 gathers for 20 trips; settled states 8 for 16):
# bench rollouts ant 0.973 [0.866, 1.142], humanoid 0.996 [0.893, 1.260] (12 rounds
# each), but XLA compile CPU ant 1.101 [0.992, 1.173] (8 rounds). Slots refilled world
# by world, each world gathered and written back once by loops of row updates: the
# ant's solve 1.425 [1.275, 1.585] (8 rounds; a kernel per array per world moved). The
# write-back by a scatter: the ant's solve 1.013 [0.923, 1.094] (6 rounds). Trips of
# 1/4 of the batch: solve ant 0.999, humanoid 1.107 (8 rounds). The carry packed into
# one (worlds, n) array per dtype, so that a trip gathers and writes back one row per
# world, not five (a trip's sort, gathers and write-back alone, the ant's shapes: 51-57
# -> 36-39 us; the ant's bench call makes 115 trips): the unpacking slices and the
# packing concatenation cost more than that: solve ant 1.047 [0.904, 1.179] (40
# rounds), humanoid 1.072 [0.767, 1.393] (30; float32 solutions moved by rounding);
# the ant's bench rollout 1.037 [0.952, 1.141] (12); the vectors alone packed (the
# factor apart) ant 1.004 [0.916, 1.098] (40). Newton's first pass made on the whole
# batch before the loop (a second body, without line search): XLA compile CPU ant
# 1.092 [1.049, 1.297] (6 rounds). The write-back of the entries that fall in a window
# of 2k worlds from a trip's first one (most trips: the first pass takes the worlds in
# order) by one select per leaf over the window's rows, the loop of row updates for the
# rest: bench rollouts at 512 worlds (the bench's chunk), paired in one process,
# outputs bit-identical: ant 0.928 [0.794, 1.029] (10 rounds), 0.969 and 0.982 (30
# each), 0.995 at 1024 worlds (30); humanoid 1.032, barkour 0.985, shadow hand 1.014
# (10 each); windows of 4k and 8k worlds: ant 1.050 and 1.199 against 2k. A profiler
# trace charged the loop of row updates 26 of the ant's 102 us per world-step, most of
# it the trace's own cost per kernel (18000 loop kernels a call)

#: for tests, read at trace time: :func:`_gathered` passes NaN (floats) or garbage
#: (integers, flags) for the lazy arrays of a trip that does not read them
_POISON = False


def _gathered(k, vbody, vlive, bconsts, lconsts, init, bf, lf, tables, lazy=None):
    """:func:`live_loop`'s loop under vmap (:data:`_GATHER`), its body compiled once, at
    ``k`` worlds: every trip gathers the first ``k`` live worlds of the batch (their
    carry and the per-world arrays the body closes over; ``tables``, (position among
    ``bconsts``, nact, whether batched), remade for them), makes one pass on them and
    writes them back, until no world is live. ``lazy``: None, or (nact, whether
    batched, positions among ``bconsts``): those arrays are gathered only on a trip
    whose worlds include one with nact > 1 (a loop of zero or one trip, its arrays
    carried from trip to trip and written in place), else the last ones gathered are
    passed, unread (:data:`_LAZY`)."""
    lz = [] if lazy is None else lazy[2]

    def trip(carry):
        c, cache = carry
        pos = _first_worlds(vlive(c, *lconsts), k)

        def take(a):
            return jnp.take(a, pos, axis=0, mode="clip")

        sb = [b if (i in lz or not f) else take(b)
              for i, (b, f) in enumerate(zip(bconsts, bf))]
        for i, key, f in tables:
            sb[i] = _needy(take(key) if f else jnp.broadcast_to(key, (k,)), k)
        if lz:
            nact, nf = lazy[:2]
            # an unbatched nact (one value for every world) is the trip's flag itself
            need = (reduce_fused((take(nact) > 1).astype(jnp.int32), 0, "max") > 0
                    if nf else nact > 1)
            cache = inline.while_loop(
                lambda s: s[0],
                lambda s: (jnp.zeros((), bool), [take(bconsts[i]) for i in lz]),
                (need, cache))[1]
            for i, v in zip(lz, cache):
                sb[i] = v if not _POISON else where(need, v, _garbage(v))
        s = vbody(jax.tree_util.tree_map(take, c), *sb)
        return _put_rows(c, lambda: pos, s), cache

    def more(carry):
        return reduce_fused(vlive(carry[0], *lconsts).astype(jnp.int32), 0) > 0

    cache = [jnp.zeros((k,) + bconsts[i].shape[1:], bconsts[i].dtype) for i in lz]
    return inline.while_loop(more, trip, (init, cache))[0]


def _garbage(v):
    """An array like ``v`` of values no pass may read (:data:`_POISON`)."""
    if jnp.issubdtype(v.dtype, jnp.floating):
        return jnp.full_like(v, jnp.nan)
    return jnp.full_like(v, True if v.dtype == jnp.bool_ else 7)


def _hoisted(fn, arg):
    """(g, consts): ``fn`` traced once at ``arg``, as ``g(arg, *consts)`` with the traced
    values it closes over (of every type, as jax.closure_convert does for floats only)
    passed as ``consts``. Inside simjax's in-line trace ``fn`` is traced in line too
    (:func:`simjax.engine.inline._body`, taken before jit is enabled for make_jaxpr: in
    that block ``inline.active()`` is False, and ``fn``'s jax.numpy calls were jits of
    their own; the ant's bench rollout traced 102 nested jits, now 6, this trace 0.09 ->
    0.06 s CPU; the optimised program the same)."""
    body = inline._body(fn)
    with jax.disable_jit(False):
        closed, shape = jax.make_jaxpr(body, return_shape=True)(arg)
    consts = closed.consts
    traced = [isinstance(c, jax.core.Tracer) for c in consts]
    out_tree = jax.tree_util.tree_structure(shape)

    def g(a, *hoisted):
        it = iter(hoisted)
        full = [next(it) if t else c for c, t in zip(consts, traced)]
        out = inline._replay(closed.jaxpr, full, jax.tree_util.tree_leaves(a))
        return jax.tree_util.tree_unflatten(out_tree, out)

    return g, [c for c, t in zip(consts, traced) if t]
