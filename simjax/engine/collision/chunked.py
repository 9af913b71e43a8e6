"""Running a costly collider group only where it is needed, under ``vmap``: the
batch-wide predicate (:func:`batch_max`) that keeps a ``lax.cond`` a branch, the skip
of a whole group (:func:`_run_or_skip`), the chunk scan over a group's broadphase-passing
pairs (:func:`_chunked`), the packing of a collider's output into one array
(:func:`_pack`) and the in-order compaction of pair indices (:func:`first_k`). Used by
:mod:`simjax.engine.collision.driver` (``narrow_group``), which re-exports these names."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.math import reduce_fused
from simjax.engine.solver_gather import count_below, cumcount, first_true
from simjax.engine.solver_worlds import batched_like
from simjax.types import GeomType as GT


@jax.custom_batching.custom_vmap
def batch_max(x):
    """``x`` (an int scalar) itself; under ``vmap`` its maximum over the batch, unbatched,
    so that a ``lax.cond`` on it stays a branch (a batched predicate would run both
    branches for every world). A collider group then runs for the whole batch when
    any world needs it, and is skipped when none does."""
    return x


@batch_max.def_vmap
def _batch_max_rule(axis_size, in_batched, x):
    del axis_size
    return (reduce_fused(x, 0, "max") if in_batched[0] else x), False


def _run_or_skip(pred, run, skip):
    """``lax.cond(pred, run, lambda: skip(types))`` with ``types`` the ``ShapeDtypeStruct``
    pytree of run's outputs: lax.cond traces its true branch first, run's output types
    are recorded there (no trace of the collider for its shapes alone); were the order
    otherwise, ``jax.eval_shape`` of run gives them. Under ``vmap`` (predicate unbatched)
    jax batches each branch twice (once to find which outputs are batched, once more
    with those; the second pass misses its cache): run is therefore a ``jax.jit`` call
    in its branch (:data:`_RUN_AS_CALL`), whose batching jax caches by the call's
    argument axes alone, so that the second pass reuses the first. Tried before: the run
    branch as a one-step ``lax.scan`` (trace 1.06x hand, 1.09x barkour) or as a
    ``jax.checkpoint`` call (1.03x hand)."""
    seen = []

    def run_branch():
        out = run()
        seen.append(jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                           out))
        return out
    branch = run_branch
    if _RUN_AS_CALL:
        # traced in line inside the call, as the step is (jit enabled for the call
        # itself only, see ``inline``)
        call = jax.jit(inline.inlined(run_branch))
        branch = inline.outside(call)
    return jax.lax.cond(pred, branch,
                        lambda: skip(seen[0] if seen else jax.eval_shape(run)))


#: the run branch of :func:`_run_or_skip` as a ``jax.jit`` call (XLA inlines it: the
#: same kernels and outputs; the branch's operands come in another order). The shadow
#: hand's second batching passes of its three run branches took 0.5, 0.02 and 0.14 s,
#: now ~1 ms each. Bench rollouts (batch 1024, float32, process CPU, loads 5-13), 6
#: rounds in one process: shadow hand trace 0.880x [0.749, 1.149], lowering 0.918x
#: [0.634, 1.093], both 0.906x [0.710, 1.068]; barkour trace 0.885x [0.824, 1.025],
#: lowering 0.923x [0.733, 1.438], both 0.908x [0.794, 1.136]; shadow hand in fresh
#: processes (5 pairs): trace 0.987x [0.909, 1.222], lowering 0.870x [0.825, 0.958], XLA
#: CPU 0.961x [0.925, 1.033], 793 kernels both. Ant and humanoid: no such branch.
#: False: the collider's equations in the branch itself (for paired measurements)
_RUN_AS_CALL = True


def _zeros(types):
    """Zeros of the ``ShapeDtypeStruct`` pytree ``types``."""
    return jax.tree_util.tree_map(lambda t: jnp.zeros(t.shape, t.dtype), types)


#: pairs per chunk of a costly collider group of more than CHUNK_MIN candidates
#: without mesh data: the group's broadphase-passing pairs, compacted in order, run
#: CHUNK at a time, and a chunk none of whose pairs passes in any world of the batch is
#: skipped; the passing pairs up to the group's pair capacity run (``nrow`` of
#: :func:`_chunked`), so the contacts are those of running all candidates unless more
#: pairs pass (then WARN_CONTACTFULL). Groups with mesh tables are not chunked, except
#: the SAT collider's (:data:`MESH_SAT_CHUNKS`): gathering their per-pair tables by
#: traced pair index makes them per-world arrays (sphere-mesh ~2x slower)
CHUNK = 4
CHUNK_MIN = 16

#: pairs per chunk of a mesh group of the SAT collider (:data:`MESH_SAT_CHUNKS`)
MESH_CHUNK = 1

#: a group of the SAT collider with a mesh runs in chunks past this many candidates,
#: not CHUNK_MIN (16): a pair's search costs tens to hundreds of us per world, so
#: running the pairs that fail the broadphase costs more than the chunk scan.
#: mjx_convex (three mesh-mesh and three box-mesh candidates, float32, batch 64,
#: settled states): step 558 -> 305 us per world-step, its compile 19.8 -> 20.4 s wall
MESH_CHUNK_MIN = 1


def chunk_of(fn):
    """Pairs per chunk of ``fn``'s chunked group: ``MESH_CHUNK`` for the SAT collider on
    a mesh pair, else ``CHUNK``."""
    return MESH_CHUNK if _mesh_sat(fn) else CHUNK


#: groups of the SAT convex collider with a mesh (mesh-mesh, box-mesh, ...) of more
#: than CHUNK_MIN candidates run in chunks too, their pairs' hull tables gathered by
#: geom id in the chunk: a pair's SAT search on the Trossen arm's meshes costs about 3
#: ms per world, and every one of its 33 mesh-mesh candidates ran where about 1 passes
#: the broadphase. Its collision stage (batch 16, float32) 118 -> 13.1 ms per world in
#: chunks of 4, 2.95 ms per world-step in chunks of 1 (MESH_CHUNK; batch 64, settled
#: states, against 13.9 ms with 4). False: every candidate runs (for paired
#: measurements)
MESH_SAT_CHUNKS = True


def _chunks(fn, n):
    """Whether a costly group of ``n`` candidates runs in chunks (:func:`_chunked`):
    groups without mesh data, and groups of the SAT collider with a mesh
    (:data:`MESH_SAT_CHUNKS`)."""
    mesh = GT.MESH in (getattr(fn, "types", None) or ())
    if mesh:
        return MESH_SAT_CHUNKS and _mesh_sat(fn) and n > MESH_CHUNK_MIN
    return n > CHUNK_MIN


def _mesh_sat(fn):
    """Whether ``fn`` is the SAT convex collider on a mesh pair (not plane-mesh, not
    sphere-mesh with its own tables)."""
    types = getattr(fn, "types", None) or ()
    return (GT.MESH in types and GT.PLANE not in types
            and not hasattr(fn, "mesh_tables"))


def _pack(tree):
    """(array (n, W) of a pytree's leaves (leading axis n, one float dtype, bools as
    0/1) side by side, unpack(array) -> the pytree): one update per scan step instead
    of one per leaf."""
    leaves, tdef = jax.tree_util.tree_flatten(tree)
    n = leaves[0].shape[0]
    dt = next(x.dtype for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))
    shapes = [(x.shape[1:], x.dtype) for x in leaves]
    packed = jnp.concatenate([x.reshape(n, -1).astype(dt) for x in leaves], 1)

    def unpack(a):
        out, k = [], 0
        for shp, xdt in shapes:
            w = int(np.prod(shp, dtype=np.int64))
            x = a[..., k:k + w].reshape(a.shape[:-1] + shp)
            out.append(x > 0.5 if xdt == jnp.bool_ else x.astype(xdt))
            k += w
        return jax.tree_util.tree_unflatten(tdef, out)
    return packed, unpack


#: a collider's chunk, packed (:func:`_pack`), as a ``jax.jit`` per collider
#: (:func:`_packed_chunk`), and the unpacking of its output by (collider, argument
#: types): :func:`_chunked` needs the packed width before the scan whose body calls the
#: collider; the jit's trace gives it, and the call in the body reuses that trace
#: (jit's trace cache) where an ``eval_shape`` traced the collider a second time
_PACKED: dict = {}
_UNPACK: dict = {}

#: inside ``simjax.step`` jax's jit is disabled (:mod:`simjax.engine.inline`), which
#: would pass the jit through and trace the collider again in the body: its trace and
#: its call run with jit enabled (``inline.outside``), so the call reuses the trace
#: (shadow hand, trace + lowering of the bench rollout 0.966x, 0.952-0.985, 8 pairs in
#: one process; the same kernels and outputs). False: passed through (to compare)
_JIT_IN_STEP = True


def _packed_chunk(fn):
    """``fn`` vmapped over a chunk's pairs and packed: an inlined jit, one per ``fn``,
    whose trace (once per argument types) records the unpacking in ``_UNPACK``."""
    jf = _PACKED.get(fn)
    if jf is None:
        def packed(*args):
            out, unpack = _pack(jax.vmap(fn)(*args))
            _UNPACK[(fn, _types(args))] = unpack
            return out
        jf = _PACKED[fn] = jax.jit(inline.inlined(packed) if _INLINE_BODY else packed,
                                   inline=_INLINE)
    return jf


#: the collider traced in line inside the chunk's jit (:func:`inline.inlined`): the
#: jit is traced with jax's jit enabled (``inline.outside``), so without this every
#: jax.numpy call of the collider was a jit of its own (the shadow hand's bench rollout:
#: 388 nested jit traces, now 22; its trace + lowering 0.90-0.92x, process CPU, pairs
#: in one process; the optimised program the same). False: traced with jit enabled
#: (for paired measurements)
_INLINE_BODY = True


#: the chunk's jit stays a call in the traced program (XLA inlines it: the same
#: kernels); inlined, its equations were bound again in the scan body (shadow hand's
#: rollout trace ~4% longer). True: inlined (for paired measurements)
_INLINE = False


def _types(tree):
    leaves, tdef = jax.tree_util.tree_flatten(tree)
    return tdef, tuple((x.shape, jnp.dtype(x.dtype), getattr(x, "weak_type", False))
                       for x in leaves)


#: a chunk's pairs searched in its branch (off: every row's pair searched before the
#: chunk loop; for paired measurements)
_SEARCH_IN_CHUNK = True


#: a chunk's pairs found by counting the cumulative counts below each of its ranks
#: (``solver_gather.count_below``: one reduction kernel, where the binary search,
#: "scan", was a loop of 8 kernels; the same indices; any method of
#: ``jnp.searchsorted`` for paired measurements)
_SEARCH = "count"


def _chunked(fn, take, ok, count, most, found, ftype, nrow=None):
    """A costly collider group run chunk by chunk (``CHUNK`` pairs, :func:`chunk_of`): a
    ``lax.scan`` over the chunks of the passing pairs (compacted in order by a
    cumulative count and, in the chunk's branch, a count of the cumulative counts below
    its pairs' ranks, see ``_SEARCH``, where :func:`first_k` of all n keys is a full
    sort), each a ``lax.cond`` on whether any world has a passing pair in it
    (:func:`batch_max`), so that the collider is compiled once and runs only on chunks
    that hold passing pairs. A chunk's arguments are gathered inside its branch
    (``take(idx)``: the collider's arguments for group-local pairs idx; from the
    component-major pair table, a few columns, where packing every pair's arguments into
    rows first wrote the whole group each step); its output, one packed array
    (:func:`_pack`), is written into the rows of the group's output that the scan
    carries (zeros first): a skipped chunk writes nothing (stacked as the scan's
    outputs, every chunk wrote its rows, zeros when skipped, and the stack was copied
    out; its width from the trace of :func:`_packed_chunk`, which the body reuses).
    ``most``: :func:`batch_max` of ``count``, the caller's (it also decides whether the
    group runs at all). Returns (the packed collider output, the group-local pair of
    each row: past the passing pairs, the last pair); the rows holding passing pairs are
    ``arange < count``, made by the caller; sets ``found["unpack"]``, the output's
    unpacking (:func:`_pack`)."""
    n = ok.shape[0]
    ch = chunk_of(fn)
    nch = -(-(n if nrow is None else nrow) // ch)      # rows: nrow, else one per pair
    jf = _packed_chunk(fn)
    width = (inline.outside(jf.trace) if _JIT_IN_STEP else jf.trace)(
        *take(jnp.zeros(ch, jnp.int32))).out_info.shape[1]
    # the cumulative count of passing pairs here, the search for a chunk's
    # pairs in its branch: only the chunks that run search theirs (searching all
    # n rows first cost the shadow hand's capsule-box group ~2.5 us per world)
    cs = cumcount(ok)
    if not _SEARCH_IN_CHUNK:
        every = jnp.minimum(first_true(ok, nch * ch)[0], n - 1).astype(jnp.int32)

    def body(carry, c):
        buf, sel = carry

        def run():
            want = c * ch + jnp.arange(1, ch + 1, dtype=jnp.int32)
            pos = (count_below(cs, want) if _SEARCH == "count" else
                   inline.searchsorted(cs, want, method=_SEARCH))
            idx = jnp.minimum(pos, n - 1).astype(jnp.int32)
            if not _SEARCH_IN_CHUNK:
                idx = jax.lax.dynamic_slice_in_dim(every, c * ch, ch)
            args = take(idx)
            out = (inline.outside(jf) if _JIT_IN_STEP else jf)(*args)
            found["unpack"] = _UNPACK[(fn, _types(args))]
            if out.shape[1:] != buf.shape[1:] or out.dtype != buf.dtype:
                raise TypeError(f"collider {fn} returned {out.shape[1:]} {out.dtype} "
                                f"packed, not ({width},) {ftype}")
            return (jax.lax.dynamic_update_slice_in_dim(buf, out, c * ch, 0),
                    jax.lax.dynamic_update_slice_in_dim(sel, idx, c * ch, 0))
        return jax.lax.cond(most > c * ch, run, lambda: (buf, sel)), None

    # batched from the start under vmap (batched_like): found batched in the body, it
    # made vmap batch the body, the collider's included, a second time. Rows of
    # skipped chunks are past every world's passing pairs: zeros, and the last pair
    buf = batched_like(jnp.zeros((nch * ch, width), ftype), ok)
    sel = batched_like(jnp.full(nch * ch, n - 1, jnp.int32), ok)
    (out, sel), _ = inline.scan(body, (buf, sel), jnp.arange(nch))
    return out, sel


# Measured, not done: the chunks as a while loop to the batch's most passing pairs (at
# most the rows'), with no branch per chunk and none around the loop (no trip where no
# pair passes); the cumulative count then in each trip, from a value made to depend on
# the trip (XLA would hoist it out of the loop onto every step). Shadow hand's bench
# rollout 733 -> 725 kernels (capsule-box group 56 -> 48), its outputs bit-identical
# (float64 and float32); the contact stress scene's (float64, 16 steps) moved by
# rounding (qpos 1.2e-15, qacc 8.5e-14). XLA compile CPU new / old 0.954 [0.832, 1.103]
# and 1.031 [0.785, 1.241] (two runs of 10 rounds in one process, load 5-12): no gain
# seen, and a crowded scene would count its pairs once per trip, not once. Variants:
# the count once before the loop inside the group's branch 731 kernels; in the first
# trip only (a branch in the loop) 729; before the loop with no branch around it 752.


#: keys up to this length are ranked by compares (:func:`_first_k_ranked`), longer ones
#: by ``lax.top_k``
_RANK_MAX = 64
# Measured and not taken: the key stored (one reduction) before the (n, n) compare,
# into which XLA fuses the key's producer (the colliders' contact tests, evaluated per
# entry pair). A profiler trace (batch 512) charged the ant's ranking 8.7 -> 1.5 us per
# world-step, but the step's CPU time did not move (batch 1024, float32, 12 paired
# rounds): ant 0.985 [0.910, 1.180], humanoid 1.014 [0.882, 1.505], barkour 0.993
# [0.762, 1.200], shadow hand 1.011 [0.926, 1.094]; float32 outputs bit-identical


def _first_k_ranked(key, k):
    """:func:`first_k` by ranks: each entry's rank is the number of smaller keys (an
    (n, n) compare), slot ``r`` takes the entry of rank ``r`` (a (k, n) compare and
    sum); slots past ``n`` point past the key, as the padded ``top_k`` does. Selects
    and sums that XLA on CPU fuses and splits over its threads, where ``top_k`` is a
    sort of its own on one thread: the contact selection of ant, barkour, humanoid and
    shadow hand (15-32 entries), 6-7 kernels fewer in each bench rollout."""
    n = key.shape[-1]
    rank = jnp.sum(key[None, :] < key[:, None], axis=1, dtype=jnp.int32)
    slot = np.arange(k, dtype=np.int32)
    hit = rank[None, :] == slot[:, None]
    idx = jnp.sum(jnp.where(hit, np.arange(n, dtype=np.int32), 0), axis=1,
                  dtype=jnp.int32)
    return jnp.where(slot < n, idx, slot)


def first_k(key, k):
    """Indices of the ``k`` smallest entries of ``key`` (distinct non-negative ints below
    2**24), ascending: ``lax.top_k`` of the negated key in float32 (exact for these
    ints), a single partial-sort kernel on CPU where a cumulative-sum compaction
    (``jnp.nonzero``) costs a dozen kernels and a scatter loop. ``top_k`` of all
    entries becomes a full sort: for ``k >= len(key)`` the key is padded (indices past
    the key's length point at the padding). Keys of at most ``_RANK_MAX`` entries
    are ranked by compares instead (:func:`_first_k_ranked`, same indices)."""
    n = key.shape[-1]
    if n <= _RANK_MAX:
        return _first_k_ranked(key, k)
    kf = -key.astype(jnp.float32)
    if k >= n:
        kf = jnp.concatenate([kf, jnp.full(k - n + 1, -2.0 ** 24, kf.dtype)])
    return jax.lax.top_k(kf, k)[1]
