"""Row chunks of the primal constraint problem (Newton / CG in :mod:`simjax.engine.solver`).

The row capacity (every row that could be active: all contact slots, both sides of every
limit) is many times the number of active rows in a typical state, and the iterations
cost O(rows) per line-search point and O(rows nv^2) per Hessian. The active rows are
therefore gathered, in order, into ``C`` chunks of one static layout (a capacity of
scalar rows, then a capacity of contacts per elliptic block; :func:`row_capacity`),
enough chunks for every row, and every sum over rows runs over the chunks in use only
(``nact``, traced): chunk 0 inline, then a loop over the other chunks holding active
rows. A typical state fills one chunk (the loop runs no iteration), a crowded one more,
and both run the same program: the result never depends on the chunk size, and the
solver body is compiled once (before, a state that overflowed a single compact buffer
was solved again on the full rows, a second copy of the solver that was about half of
its compile time). The iterations run on stop-gradient inputs (the solution is
differentiated implicitly in :mod:`simjax.engine.solver`).

Under ``vmap`` a loop with a batched trip count would batch its counter, and every
chunk access would become a gather: :func:`rest_chunks` is a ``custom_vmap`` whose rule
runs to the largest count of the batch with an unbatched counter (worlds with fewer
chunks add the zero contributions of their padding rows, which are exact), on the
whole batch or, where chunk 0 is small (:attr:`Rows.blocks`), on the worlds that use
the later chunks alone, one world at a time (:func:`_world_loop`; in blocks of worlds
with :data:`_PER_WORLD` off, :func:`_needy_loop`).

The one-chunk path must cost what a single compact buffer cost: chunk 0's values are
kept apart from the later chunks' (:class:`Chunked`), the later chunks' rows are
searched once per solve by a loop over the chunks in use and gathered only when
visited, and only the values carried from one pass over the rows to the next are
stored for them. Under vmap every array of the loops is a (worlds, ...) temporary
allocated on every call whether the loop runs or not: a program's temporaries past
glibc's largest mmap threshold (32 MiB) are mapped afresh on every call and their pages
faulted in (system time), which cost the barkour solve 25% when a (worlds, rows, chunk
rows) search count pushed them there.

This module holds the loops over the chunks (:func:`head_chunk`, :func:`find_chunks`,
:func:`rest_chunks`, :func:`_world_loop`, :func:`_needy_loop` with its tables of
bits); the chunks' layout,
index search and gathers are in :mod:`simjax.engine.solver_gather`, the per-world rules
under vmap in :mod:`simjax.engine.solver_worlds`.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.math import reduce_fused, where
from simjax.engine.solver_gather import (
    Chunked, Rows, _chunk_positions, _chunk_rows, _chunk_spec, _take_rows, count_below,
    cumcount, ell_mask, first_true, gather, heads, row_capacity, rests, spread, whole)
from simjax.engine.solver_worlds import (
    _put_rows, any_world, batched_like, entry, needy_table, nonneg, where_needed)

#: the loops over the chunks, and (re-exported) the chunks' layout and gathers
#: (:mod:`simjax.engine.solver_gather`) and the per-world rules
#: (:mod:`simjax.engine.solver_worlds`)
__all__ = ["head_chunk", "rest_chunks", "find_chunks", "rest_zeros",
           "Chunked", "Rows", "row_capacity", "ell_mask", "first_true", "cumcount",
           "count_below", "gather", "whole", "spread", "heads", "rests",
           "where_needed", "any_world", "batched_like", "needy_table"]


# --------------------------------------------------------------------------- loops
def _index(tree, c, axis):
    return jax.tree_util.tree_map(
        lambda a, ax: jax.lax.dynamic_index_in_dim(a, c, ax, keepdims=False, **nonneg()),
        tree, axis)


def _loop(fn, n, xs, args, acc, state, batch=None, args_axis=None, from_zero=True):
    """acc, state = fold of fn(c, x_c, s_c, args, acc) -> (acc, s_c) over the chunks
    1 <= c < n, x_c and s_c entry c - 1 of xs and state (leading axis the chunk), s_c
    written back; ``n`` a scalar or a function computing it in the loop's condition;
    ``batch``: None, or the batched flags of (xs, args) inside the vmap rule (fn then
    runs vmapped over worlds, with an unbatched chunk counter; acc, state batched),
    ``args_axis`` then the vmap axes of args in place of those its flags give;
    ``from_zero``: the counter runs from 0 (see below; False: from 1)."""
    if batch is None:
        g, xaxis, cax = fn, jax.tree_util.tree_map(lambda _: 0, xs), 0
    else:
        xb, ab = batch

        def ax(b):
            return jax.tree_util.tree_map(lambda f: 0 if f else None, b)

        aax = ax(ab) if args_axis is None else args_axis
        g = jax.vmap(fn, in_axes=(None, ax(xb), 0, aax, 0))
        xaxis = jax.tree_util.tree_map(lambda f: 1 if f else 0, xb)
        cax = 1

    # the loop counts k = c - 1 from 0: a ``c - 1`` in the body is rewritten by XLA as
    # c + (-1), whose negation of a constant its loop-invariant code motion hoists out of
    # every enclosing loop before folding it; the folded constant then sinks back one
    # loop level per round of XLA's simplification fixpoint (rounds of the bench
    # rollout's fixpoints: ant 16 -> 14, humanoid 15 -> 13). Not in _needy_loop's blocks
    # (``from_zero`` False), where the chunk index c = k + 1 feeds the rows' positions
    # c k_cap + j: there it cost rounds (barkour 16 -> 21, shadow hand 11 -> 13)
    zero = inline.LEAN and from_zero

    def body(s):
        # the counter i: the entry k = c - 1 of chunk c = i + 1 (zero), else c itself
        i, acc, state = s
        c, k = (i + 1, i) if zero else (i, i - 1)
        sc = _index(state, k, jax.tree_util.tree_map(lambda _: cax, state))
        acc, sc = g(c, _index(xs, k, xaxis), sc, args, acc)
        state = jax.tree_util.tree_map(
            lambda b, o: jax.lax.dynamic_update_index_in_dim(b, o, k, cax, **nonneg()),
            state, sc)
        return (c if zero else c + 1), acc, state

    # n a function: the count computed in the loop's condition
    bound = n if callable(n) else lambda: n
    _, acc, state = inline.while_loop(
        lambda s: (s[0] + 1 if zero else s[0]) < bound(), body,
        (jnp.full((), 0 if zero else 1, jnp.int32), acc, state))
    return acc, state


def head_chunk(rows, fn, acc, extra=(), args=(), jac=False):
    """``fn(spec_0, x_0, e_0, J_0, args, acc) -> (acc, out)`` on chunk 0 (the rows
    gathered once): ``x_0`` its problem rows, ``e_0`` the heads of ``extra`` (a tree of
    :class:`Chunked`), ``spec_0`` its row structure and ``J_0`` its Jacobian rows (None
    unless ``jac``)."""
    x0 = rows.x0
    return fn(_chunk_spec(rows.spec, x0), x0, heads(extra), rows.J0 if jac else None,
              args, acc)


def rest_chunks(rows, fn, acc, extra=(), args=(), jac=False, state=()):
    """:func:`find_chunks` without the rows: (acc, state)."""
    return find_chunks(rows, fn, acc, extra, args, jac, state)[:2]


def find_chunks(rows, fn, acc, extra=(), args=(), jac=False, state=(), finish=None,
                fresh=False):
    """Fold over the chunks in use after chunk 0, 1 <= c < rows.nact: ``acc, s_c =
    fn(spec_c, x_c, e_c, s_c, J_c, args, acc)`` as :func:`head_chunk`, with ``e_c``
    chunk ``c`` of ``extra`` (a tree of :class:`Chunked`) and ``s_c`` chunk ``c`` of
    ``state`` (a tree of per-chunk arrays, leading axis the chunks after chunk 0),
    updated in place. Returns (acc, state, rows), ``rows`` with the later chunks'
    source rows: the first loop over the chunks finds them (counts on the
    cumulative counts) for the loops after it (a loop of its own compiled its own
    bookkeeping). ``fn`` must close over no traced value: pass them in ``args``.

    The loop usually runs no iteration; the rows of a chunk are found and gathered
    when it is visited. Only values carried from one pass over the rows to the next
    (the rows' J qacc - aref) are kept per chunk, in ``state``; the others are
    recomputed on a visit: (chunk, ...) buffers zero-filled on every pass cost the
    one-chunk solves about 10%. (Every chunk in the loop compiles about 1 s faster on
    the humanoid but runs the solve 2x slower: XLA CPU gathers are slow, and the loop's
    chunk 0 needs its rows either gathered on every visit or copied out of a
    conditional.)

    ``finish``: None, or ``(g, local, out)``: ``fn`` then folds ``(acc, local)``,
    ``local`` a per-world accumulator (a tree of ``jax.ShapeDtypeStruct``, zero at the
    start) kept only by the worlds that visit the chunks (under vmap with
    :attr:`Rows.blocks`, by the world, or its block: never a (worlds, ...) array to
    fill on every call), and where a world visits them its ``out`` becomes ``g(acc,
    local, out)`` (every world without blocks: ``g`` must keep ``out`` for a ``local``
    of zeros); the returned acc is then (acc, out).

    ``fresh``: ``state`` is zero on entry (the worlds' blocks under vmap then start it
    from zeros, :data:`_FRESH`; the worlds of :func:`_world_loop` likewise)."""
    spec, nchunk = rows.spec, rows.nchunk
    g, local_like, fin = finish if finish is not None else (None, (), ())

    # zeros made where used: the loops close over no traced value
    def local0(*size):
        return jax.tree_util.tree_map(
            lambda x: jnp.zeros(size + tuple(x.shape), x.dtype), local_like)

    if nchunk == 1:
        return (acc, fin) if g is not None else acc, state, rows
    src = dict(rows.src)
    J = src.pop("J")
    static = {key: v for key, v in src.items() if isinstance(v, np.ndarray)}
    src = {key: v for key, v in src.items() if key not in static}
    finding = not rows.rest
    if finding:
        where, counts, like = rows.find
        state = (state, jax.tree_util.tree_map(
            lambda o: jnp.zeros((nchunk - 1,) + o.shape, o.dtype), like))
    else:
        counts = ()

    def inner(c, e, sc, a, acc):
        user, src, J, counts = a
        e, found = e
        if finding:
            layout, caps, nefc = where
            found = _chunk_rows(layout, caps, nefc, _chunk_positions(counts, caps, c))
            sc = sc[0]
        idx, pos = found
        # the table is made to depend on the chunk: XLA would otherwise build it
        # before the loop (loop-invariant), on every call (one-chunk solves 15% slower)
        src, _ = jax.lax.optimization_barrier((src, idx))
        src = dict(src, **static)
        x, J = _take_rows(spec.nisl, src, idx, pos, J)
        acc, sc = fn(_chunk_spec(spec, x), x, e, sc, J, user, acc)
        return acc, ((sc, found) if finding else sc)

    a = (args, src, J if jac else None, counts)

    def whole_loop(n, xs, a, acc, state, fin, batch=None, size=None):
        # every world (or the one world) folds the later chunks, then finishes
        if g is None:
            return _loop(inner, n, xs, a, acc, state, batch=batch) + ((),)
        local = local0() if size is None else local0(size)
        (acc, local), state = _loop(inner, n, xs, a, (acc, local), state, batch=batch)
        return acc, state, (g if size is None else jax.vmap(g))(acc, local, fin)

    @jax.custom_batching.custom_vmap
    def run(n, tab, xs, a, acc, state, fin):
        return whole_loop(n, xs, a, acc, state, fin)

    @run.def_vmap
    @inline.inlined
    def _rule(size, flags, n, tab, xs, a, acc, state, fin):
        nb, tb, xb, ab, accb, sb, fb = flags
        # the accumulators and states are updated per world: batched
        acc, state, fin = jax.tree_util.tree_map(
            lambda v, f: v if f else jnp.broadcast_to(v, (size,) + v.shape),
            (acc, state, fin), (accb, sb, fb))
        if nb and tb and _PER_WORLD:
            out = _world_loop(inner, size, n, tab, xs, a, acc, state, (xb, ab),
                              (g, local0, fin), fresh=_FRESH and fresh,
                              found=_FRESH and finding)
        elif nb and tb:
            out = _needy_loop(inner, size, n, tab, xs, a, acc, state, (xb, ab),
                              (g, local0, fin), fresh=_FRESH and fresh,
                              found=_FRESH and finding)
        else:
            out = whole_loop(reduce_fused(n, 0, "max") if nb else n, xs, a, acc, state, fin,
                             batch=(xb, ab), size=size)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    tab = rows.needy if rows.blocks else jnp.zeros((), jnp.int32)
    acc, state, fin = run(rows.nact, tab, (rests(extra), () if finding else rows.rest), a,
                          acc, state, fin)
    if g is not None:
        acc = (acc, fin)
    if finding:
        state, found = state
        return acc, state, dataclasses.replace(rows, rest=found)
    return acc, state, rows


#: a block of :func:`_needy_loop` starts a state that is zero on entry (``fresh`` of
#: :func:`find_chunks`, and the rows the first loop finds) from zeros, not from a
#: gather of the block's worlds; read at trace time (False: gathered, kept to
#: compare). Barkour's warm start: two gathers fewer (zero fills instead: the kernel
#: count stays), XLA compile of the bench rollout 1/1.041 [0.971, 1.076] (paired,
#: 6 rounds, loaded machine: noise-level alone); outputs bit-identical. With
#: solver_gather._EVEN, solver_worlds._NONNEG and math._EVEN_WINDOWS, all four off /
#: on: XLA compile of the bench rollout barkour 1.032 [0.957, 1.153] (8 rounds),
#: shadow hand 1.023 [0.986, 1.057] (6 rounds), humanoid 1.032 [0.952, 1.108] (5),
#: ant 1.027 [0.977, 1.072] (4); kernels barkour 640 -> 639, hand 858 -> 857,
#: humanoid 652 -> 650, ant 585 -> 583; run time 0.997 [0.950, 1.058] (barkour, 12
#: rounds), 1.011 [0.926, 1.128] (hand, 10 rounds): noise
_FRESH = True

_CHUNK_BLOCK = 32    # worlds per block of :func:`_needy_loop`
_PACK = 8            # leaves per table of :func:`_needy_loop`


#: a block's tables (:func:`_needy_loop`) are transposed to (worlds, columns) once,
#: before its loop over the chunks (a copy kernel: copies cost no LLVM time), read at
#: trace time (False: the loop's kernels read them (columns, worlds), every leaf they
#: unpack a transposed read, kept to compare). The loops' kernels' optimised LLVM IR
#: (bench rollouts): shadow hand 11200 -> 9959 lines (the line search's sum 1834 ->
#: 1091), barkour 10619 -> 9723 with :data:`~simjax.engine.solver_warmstart._HAX` and
#: ``_ONE_DOT``; kernels +3 (the copies); float32 bench rollouts bit-identical. The
#: three off / on, paired XLA compile CPU of the bench rollout (6 rounds, loaded
#: machine): shadow hand 1.032 [1.005, 1.081], barkour 0.986 [0.946, 1.047]; barkour's
#: run time 1.049 [0.915, 1.244] (10 rounds): noise
_MAJOR = True


def _bits(dtype):
    """The unsigned integer type as wide as ``dtype``."""
    return {4: jnp.uint32, 8: jnp.uint64}[np.dtype(dtype).itemsize]


#: leaves of a :func:`_needy_loop` table with the same number of entries per world are
#: stacked into one operand of its concatenation, read at trace time (False: one
#: operand a leaf, kept to compare). The Newton update's and line search's loops then
#: gather one table, not two: barkour's bench rollout 650 -> 648 kernels (optimised
#: LLVM IR -1.5%), shadow hand 878 -> 875 (-1.8%); outputs bit-identical (bench
#: rollouts, batch 1024, float32). Paired (one process, alternated, process CPU), without
#: / with: XLA compile within noise (barkour medians 0.85-1.06 over three runs of 6-8
#: rounds, ranges 0.80-1.12), run time 1.018 [0.92, 1.09] (barkour, 12 rounds), 1.041
#: [0.93, 1.17] (shadow hand, 10 rounds)
_STACK = True


def _tables(like):
    """The leaves (world entries ``like``) of :func:`_needy_loop`'s tables: for each
    table its operands (lists of leaf indices), at most _PACK. With :data:`_STACK`
    the leaves with as many entries are one operand (stacked, a concatenation of its
    own inside the table's: XLA CPU fuses a concatenation of at most 8 operands)."""
    if _STACK:
        groups = {}
        for i, v in enumerate(like):
            groups.setdefault(int(np.prod(v.shape)), []).append(i)
        ops = [g[i:i + _PACK] for g in groups.values() for i in range(0, len(g), _PACK)]
    else:
        ops = [[i] for i in range(len(like))]
    return [ops[i:i + _PACK] for i in range(0, len(ops), _PACK)]


def _pack(leaves, size):
    """Leaves (size, ...) as one (columns, size) table of unsigned integers as wide as
    the widest leaf (an entry of ``leaves`` may be a list of leaves of as many entries
    per world: one stacked operand, :func:`_tables`), every entry's bits kept
    (:func:`_unpack`), each leaf's columns transposed and concatenated on the major
    axis: a gather of the table's columns is
    then one kernel, the concatenation fused into it (XLA CPU built a concatenation on
    the minor axis apart, a copy of every leaf for the whole batch; leaves padded to
    the table's width and or'ed fused, but cost every gathered entry a select per
    leaf)."""
    wide = _bits(max([jnp.float32] + [v.dtype for v in jax.tree_util.tree_leaves(leaves)],
                     key=lambda t: np.dtype(t).itemsize))
    signed = jnp.dtype(wide).name[1:]

    def col(v):
        v = v.reshape(size, -1)
        if v.dtype == jnp.bool_:
            v = v.astype(wide)
        elif jnp.issubdtype(v.dtype, jnp.floating):
            v = jax.lax.bitcast_convert_type(v, _bits(v.dtype)).astype(wide)
        else:
            v = jax.lax.bitcast_convert_type(v.astype(signed), wide)
        return v.T

    cols = [col(v) if not isinstance(v, list) else
            col(v[0]) if len(v) == 1 else jnp.stack([col(x) for x in v]).reshape(-1, size)
            for v in leaves]
    return jnp.concatenate(cols, 0) if cols else jnp.zeros((0, size), wide)


def _unpack(col, like):
    """The leaves of one world's column ``col`` of a :func:`_pack` table, shaped and
    typed as ``like``'s (world entries)."""
    out, at = [], 0
    for v in like:
        k = int(np.prod(v.shape))
        x = col[at:at + k].reshape(v.shape)
        at += k
        if v.dtype == jnp.bool_:
            x = x != 0
        elif jnp.issubdtype(v.dtype, jnp.floating):
            x = jax.lax.bitcast_convert_type(x.astype(_bits(v.dtype)), v.dtype)
        else:
            signed = jnp.dtype(x.dtype).name[1:]
            x = jax.lax.bitcast_convert_type(x, signed).astype(v.dtype)
        out.append(x)
    return out


def _needy_loop(inner, size, n, tab, xs, a, acc, state, batch, finish, fresh=False,
                found=False):
    """:func:`_loop` under vmap on the worlds with chunks after chunk 0 only (with
    :data:`_PER_WORLD` off; kept to compare with :func:`_world_loop`), from
    their table ``tab`` (:func:`needy_table`, made once per solve): in blocks of
    _CHUNK_BLOCK worlds, looped to the block's largest count, their (acc, state)
    written back over the block's worlds (:func:`_put_rows`); the other worlds' are
    left as they are (a loop over no chunk), and the work follows the number of worlds
    in need (bench rollouts: about 1% of them), not the batch size. A batch with no
    such world runs no block (no copy of the accumulators). The block's batched inputs
    that the loop does not update (the rows' entries, Jacobian, per-chunk values,
    arguments) are gathered as tables of bits (:func:`_pack`, _PACK operands a table,
    :func:`_tables`) and unpacked per world inside the loop over the chunks, (acc,
    state) one gather per leaf: a gather per leaf, the worlds in need found again at
    every loop and a write back over all _CHUNK_BLOCK entries made barkour's step 635
    kernels, then 596 (shadow hand 917, then 875; 525 and 786 with the whole batch
    alone). What remains
    per loop over the later chunks: about 12 kernels of loops and indices, and a
    gather and a row update per (acc, state) leaf. The results are those of the loop
    on the whole batch up to rounding, the block's kernels rounding differently (4
    steps, 12 rows per chunk: barkour bit for bit in float32, qacc within 2e-11 in
    float64; shadow hand float32 qacc within 0.15, where changing the chunk size
    moves it 0.4). The loop body is compiled once: a conditional between one block
    and the whole batch compiled it twice (barkour's step 729 kernels against 635).
    (The table ordered by chunk count, the largest first, so that a block's largest
    count is its first world's, not a reduction in each loop's condition: the same
    kernels, optimised IR -0.45% on the shadow hand; float32 bench rollouts of barkour
    and the shadow hand bit-identical.)
    ``finish``: (g, local, out) of :func:`find_chunks` (g None: none), ``local`` a
    function making the zero local accumulators of n worlds (the block's only);
    returns (acc, state, out). ``fresh``: the state is zero on entry; ``found``: its
    second part (the later chunks' rows found by the first loop) is (:func:`_block_state`)."""
    xb, ab = batch
    g, local0, fin = finish
    blk = min(_CHUNK_BLOCK, size)
    nblk = -(-size // blk)
    leaves, tree = jax.tree_util.tree_flatten((xs, a))
    flags = jax.tree_util.tree_leaves((xb, ab))
    on = [v for v, f in zip(leaves, flags) if f]
    off = [v for v, f in zip(leaves, flags) if not f]
    like = [jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for v in on]
    tables = _tables(like)
    orders = [[i for op in t for i in op] for t in tables]

    def fn(c, e, sc, pa, acc):
        rows, off = pa
        # unpacked in the loop over the chunks: XLA would otherwise copy every leaf out
        # of the table before it (loop-invariant), a kernel per leaf
        rows, _ = jax.lax.optimization_barrier((rows, c))
        got = [None] * len(like)
        for r, order in zip(rows, orders):
            for i, x in zip(order, _unpack(r, [like[i] for i in order])):
                got[i] = x
        got, off = iter(got), iter(off)
        xs, a = jax.tree_util.tree_unflatten(tree, [next(got) if f else next(off)
                                                    for f in flags])
        return inner(c, _index(xs, c - 1, jax.tree_util.tree_map(lambda _: 0, xs)), sc,
                     a, acc)

    if nblk * blk > size:
        tab = jnp.concatenate([tab, jnp.full((nblk * blk - size,), size, jnp.int32)])

    # the worlds of block b (padding entries, index size, read the last world and are
    # not written), sliced where used (not made a buffer of its own: a kernel)
    def block(b):
        return jax.lax.dynamic_slice_in_dim(tab, b * blk, blk, **nonneg())

    def body(c):
        b, acc_all, state_all, fin_all = c
        # the table depends on the block: XLA would otherwise build it for the whole
        # batch before the loop (loop-invariant), on every call
        src, ids = jax.lax.optimization_barrier((on, block(b)))
        # at most _PACK operands a table: XLA CPU fuses no concatenation of more
        rows = [jnp.take(_pack([[src[i] for i in op] for op in t], size), ids, axis=1,
                         mode="clip")
                for t in tables]
        if _MAJOR:
            # one transposing copy per table before the loop (:data:`_MAJOR`)
            rows = jax.lax.optimization_barrier([r.T for r in rows])

        def take(v):
            return jnp.take(v, ids, axis=0, mode="clip")

        # the block's largest count
        def most():
            return jnp.max(where(block(b) < size, jnp.take(n, block(b), mode="clip"), 1))

        acc, fin = jax.tree_util.tree_map(take, (acc_all, fin_all))
        state = _block_state(state_all, take, blk, fresh, found)
        if g is not None:
            acc = (acc, local0(blk))
        acc, state = _loop(fn, most, (), (rows, off), acc, state,
                           batch=((), (True, [False] * len(off))),
                           args_axis=(0 if _MAJOR else 1, None), from_zero=False)
        if g is not None:
            (acc, local) = acc
            fin = jax.vmap(g)(acc, local, fin)
        return (b + 1,) + _put_rows((acc_all, state_all, fin_all), lambda: block(b),
                                    (acc, state, fin))

    # blocks while one holds a world in need
    def more(c):
        return (c[0] < nblk) & (entry(tab, jnp.minimum(c[0], nblk - 1) * blk) < size)

    return inline.while_loop(more, body,
                             (jnp.zeros((), jnp.int32), acc, state, fin))[1:]


#: the later chunks of the worlds in need run one world at a time (:func:`_world_loop`)
#: rather than in blocks of worlds (:func:`_needy_loop`), read at trace time (False:
#: blocks, kept to compare). No tables of bits, block gathers or write-back loops: bench
#: rollouts (batch 1024, float32) shadow hand 820 -> 795 kernels and 11259 -> 11026
#: jaxpr equations, barkour 622 -> 597 and 6456 -> 6235 (ant and humanoid, without
#: blocks, the same program). Barkour's step ran 0.826x [0.754, 0.908] and 1/1.212x
#: [0.891, 1.376] (paired in one process, 12 rounds each order; a block gathered every
#: input of its 32 worlds, the whole Jacobian among them, on every pass, and ran each
#: chunk to the block's largest count), the hand's 1/1.023x [0.850, 1.206] (12
#: rounds); float32 outputs within rounding (barkour qfrc_constraint 8e-6 of 1370).
#: With barkour's chunk 0 of 40 rows (solver_gather._THIRD) what is left of the later
#: chunks is small: the loops over them left out altogether (a measurement only, the
#: worlds in need then solved wrongly) ran its bench sequence (batch 1024, float32, 16
#: calls of 4 steps from the bench's start) 0.981x [0.835, 1.084] (8 rounds) and the
#: calls from the state after 16 calls 1.003x [0.899, 1.265] (12 rounds), paired in one
#: process on a loaded machine: a faster way through them (their line-search terms
#: over the batch, say) can gain barkour 2% at most. Their compile is the larger
#: share: without them the bench rollout has 493 kernels, not 587 (warm start's loop
#: 28, Newton update's 18, line search's 14, the rest their tables, states and
#: copies), XLA compile CPU 0.88x [0.79, 1.13] (3 pairs, load 8-10). A world's later
#: chunks visited at once, as one chunk of their rows end to end (80 rows on barkour,
#: padding rows adding exact zeros; the inner loop over chunks gone) cut 27 kernels
#: (barkour 584 -> 557, shadow hand 793 -> 767) but did not compile faster: XLA CPU
#: barkour 0.942 [0.766, 1.154] (6 pairs) and 1.010 [0.908, 1.470] (4), the hand 1.096
#: [0.977, 1.260] and 1.172 [1.039, 1.304] (4 pairs each); barkour's run 1.024 [0.834,
#: 1.193] (12 rounds); and its Newton step, reading and writing the world's slice of
#: the batch's row state in one loop body, made XLA copy that state twice per visit
#: until the step wrote into a zeroed state
_PER_WORLD = True


def _world_loop(inner, size, n, tab, xs, a, acc, state, batch, finish, fresh=False,
                found=False):
    """:func:`_needy_loop` one world at a time (:data:`_PER_WORLD`): for each world of
    ``tab`` (in order, up to the first entry past the last world) the loop over its
    chunks runs on the world alone (unbatched, as without vmap), its inputs sliced
    inside that loop (fused into the kernels that read them); the other worlds' (acc,
    state, out) are left as they are. The work follows the rows in use of the worlds
    in need, not a block's largest count. A world's results are those of the loop
    without vmap (same kernels, up to XLA's fusion choices). ``finish``, ``fresh`` and
    ``found`` as for :func:`_needy_loop`; returns (acc, state, out).

    The accumulators are read and written in place in the batch's arrays on every
    visit of a chunk (the slice read fused into the kernels that read it, the write
    into the one that makes it), and so is the state's chunk, which a step that reads
    it (not zero on entry: ``fresh``, ``found``) reads from a copy of the world's
    state made before its chunks: read and written in place in the batch, XLA copied
    the batch's array twice per visit. Before, the world's (acc, state) were copied
    out of the batch, carried through its loop and written back after it, two kernels
    more per leaf and two copies of a state the step reads (bench rollouts, batch
    1024: shadow hand 713 -> 703 kernels, barkour 532 -> 522; float64 outputs
    bit-identical, the four bench models with chunks of a third of the rows)."""
    xb, ab = batch
    g, local0, fin = finish

    def pick(w):
        return lambda v: jax.lax.dynamic_index_in_dim(v, w, 0, keepdims=False, **nonneg())

    def put(*at):
        # entry ``at`` (leading indices) of ``full`` set to ``v``
        return lambda full, v: jax.lax.dynamic_update_slice(
            full, v.reshape((1,) * len(at) + v.shape), at + (np.int32(0),) * v.ndim,
            **nonneg())

    def body(c):
        j, acc_all, state_all, fin_all = c
        w = entry(tab, j)
        leaves, tree = jax.tree_util.tree_flatten(state_all)
        zero = _zero_flags(state_all, fresh, found)
        own = [None if z else pick(w)(v) for v, z in zip(leaves, zero)]

        def step(s):
            i, acc_all, leaves, local = s
            k = i - 1
            # the world's inputs sliced in the loop over its chunks: XLA would otherwise
            # copy each leaf out of the batch before it (loop-invariant), a kernel per
            # leaf
            wi, _ = jax.lax.optimization_barrier((w, i))
            get = pick(wi)
            xw, aw = jax.tree_util.tree_map(lambda v, f: get(v) if f else v, (xs, a),
                                            (xb, ab))
            accw = jax.tree_util.tree_map(pick(w), acc_all)
            sc = [jnp.zeros(v.shape[2:], v.dtype) if z else
                  jax.lax.dynamic_index_in_dim(o, k, 0, keepdims=False, **nonneg())
                  for v, o, z in zip(leaves, own, zero)]
            if g is not None:
                accw = (accw, local)
            accw, sc = inner(i, _index(xw, k, jax.tree_util.tree_map(lambda _: 0, xw)),
                             jax.tree_util.tree_unflatten(tree, sc), aw, accw)
            sc = jax.tree_util.tree_leaves(sc)
            if g is not None:
                accw, local = accw
            acc_all = jax.tree_util.tree_map(put(w), acc_all, accw)
            leaves = [put(w, k)(v, x) for v, x in zip(leaves, sc)]
            return i + 1, acc_all, leaves, local

        _, acc_all, leaves, local = inline.while_loop(
            lambda s: s[0] < entry(n, w), step,
            (jnp.full((), 1, jnp.int32), acc_all, leaves,
             local0() if g is not None else ()))
        state_all = jax.tree_util.tree_unflatten(tree, leaves)
        if g is not None:
            get = pick(w)
            fin_all = jax.tree_util.tree_map(
                put(w), fin_all, g(jax.tree_util.tree_map(get, acc_all), local,
                                   jax.tree_util.tree_map(get, fin_all)))
        return j + 1, acc_all, state_all, fin_all

    def more(c):
        return (c[0] < size) & (entry(tab, jnp.minimum(c[0], size - 1)) < size)

    return inline.while_loop(more, body,
                             (jnp.zeros((), jnp.int32), acc, state, fin))[1:]


def _zero_flags(state, fresh, found):
    """Per leaf of ``state`` (flattened): whether :func:`_block_state` starts it from
    zeros."""
    if found:
        user, rows = state
        return (_zero_flags(user, fresh, False) +
                [True] * len(jax.tree_util.tree_leaves(rows)))
    return [fresh] * len(jax.tree_util.tree_leaves(state))


def _block_state(state, take, blk, fresh, found):
    """A block's initial per-chunk state (a tree, leading axis the ``blk`` worlds):
    ``take`` (the block's worlds), or zeros where the caller knows it is zero on entry
    (:data:`_FRESH`): ``fresh``, all of it; ``found``, its second part (the rows the
    loop finds)."""
    def zeros(tree):
        return jax.tree_util.tree_map(lambda v: jnp.zeros((blk,) + v.shape[1:], v.dtype),
                                      tree)

    if found:
        user, rows = state
        rows = zeros(rows)
        return (_block_state(user, take, blk, fresh, False), rows)
    return zeros(state) if fresh else jax.tree_util.tree_map(take, state)


def rest_zeros(rows, like):
    """Per-chunk arrays for the chunks after chunk 0 (zero), shaped as ``like``'s
    (chunk 0's) entries."""
    return jax.tree_util.tree_map(
        lambda o: jnp.zeros((rows.nchunk - 1,) + o.shape, o.dtype), like)
