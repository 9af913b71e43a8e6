"""The row chunks' layout and gathers (:mod:`simjax.engine.solver_rows`): the chunk
capacity (:func:`row_capacity`), the index search of the active rows (:func:`first_true`,
:func:`cumcount`, :func:`count_below`), the per-row values of the chunks
(:class:`Chunked`) and their rows (:class:`Rows`), chunk 0 gathered once per solve
(:func:`gather`, or every row as one chunk: :func:`whole`), a later chunk's rows found
and gathered when a loop visits it (:func:`_chunk_rows`, :func:`_take_rows`), and the
chunks' values spread back to the problem's rows (:func:`spread`). MuJoCo iterates on
its active rows (mj_constraintUpdate's efc arrays hold those alone); the chunks are the
same rows in a static layout."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.math import unstack, where
from simjax.engine.solver_worlds import any_world, needy_table, per_world_work


#: where a quarter of the rows is under two per dof: the later chunks run on the worlds
#: that use them (:func:`~simjax.engine.solver_rows._world_loop`); False: chunk 0 takes
#: 3/8 of the rows there instead, and the later chunks run on the whole batch (kept to
#: compare the two)
_BLOCKS = True


def _few_rows(spec):
    """Whether the rows that are not equality rows are fewer than 7 per dof (barkour 6.7,
    shadow hand 3.6; humanoid 7.5, ant 8.3): such a chunk 0 overflows in states in
    motion (:func:`row_capacity`). The bound was 8 while every dof had a friction-loss
    row; without the rows of zero losses each model has about one row per dof fewer.
    Humanoid bench rollouts (batch 1024) reach 32 active rows, under its chunk of 51: the
    blocks would cost it 58 kernels (compile 0.96x, 4 rounds) for nothing (run 0.99x,
    16 rounds, noise)."""
    rest = int(np.sum(~ell_mask(spec))) - int(np.sum(spec.eq))
    return rest < 7 * spec.nv


#: where a quarter of the rows is under two per dof (:func:`_few_rows`) and a third of
#: them holds two per dof, chunk 0 takes that third (barkour 30 -> 40 rows, 4 -> 3
#: chunks; the shadow hand's third, 36 of 108 rows, is under its 60 = two per dof: it
#: keeps its quarter), read at trace time (False: the quarter, kept to compare)
_THIRD = True


def row_capacity(spec):
    """Static size of a chunk: (scalar rows, contacts per elliptic block).

    Equality rows are usually all active and are always kept; the remaining rows get a
    quarter of their capacity, at most two per dof (at least 16 rows / 4 contacts).
    Typical states have about nv active rows or fewer (bench states: barkour 1.6 nv,
    humanoid 1.3 nv, ant 1.1 nv, shadow hand 0.5 nv), while the capacity, every contact
    slot of the broadphase's worst case, grows faster than nv: the shadow hand's quarter
    was 86 rows (nv 30) for 14 active rows, and every row of a chunk costs work in
    every pass (the Hessian's rows nv^2) and memory, in use or not (shadow hand at 60
    rows: solve 120 -> 90 us per world, batch 1024). States with more rows run more
    chunks (same solution, up to rounding). Where a quarter is under two rows per dof
    (:func:`_few_rows`; barkour, shadow hand: 35 rows) bench rollouts (batch 1024)
    reach 49 active rows on barkour and 51 on the hand, and about 1% of the worlds
    pass 35 on every step: the later chunks run on those worlds only
    (:func:`_world_loop`, formerly in blocks of worlds, :func:`_needy_loop`). With
    the later chunks on the whole batch, one world past chunk 0 cost barkour's step
    13-17%, the hand's 8%, and 3/8 of the rows (52) were
    taken instead, which cost 6-8% on batches that never pass 35 (MuJoCo-settled
    states). Against that, the blocks ran barkour's step 0.93x (settled states) and
    0.94x (bench states), the hand's 0.90x and 0.98x (paired, batch 1024, float32,
    5-step rollouts, loaded machine: ranges of +-15%), for more kernels: barkour
    525 -> 596 (compile 6.7-7.5 -> 6.9-8.3 s CPU, about +10%), shadow hand 786 ->
    875. Since zero friction losses have no rows, the chunks are 30 rows (barkour) and
    27 (hand), and 35-60% of barkour's bench worlds pass 30 active rows after the first
    step; chunks of 35 ran barkour 0.987x and the hand 0.982x (12 rounds each, ranges
    +-15%): noise, so the quarter stayed. With the later chunks one world at a time, each
    world in need runs about 15 small kernels per pass and chunk: where a third of the
    rows holds two per dof (:data:`_THIRD`: barkour, 40 rows; 0-0.6% of its bench worlds
    pass 36 on a step) chunk 0 takes that third. Barkour's bench sequence (from the
    bench's start, 6 calls of 4 steps) ran 0.904x [0.760, 1.103] (12 rounds, load 15),
    states after 1-2 calls 0.82-0.90x, after 8 calls 0.97-1.05x (noise).

    Chunk 0 holds at least ``spec.resting`` rows, those of the model's rigid objects
    (trees of one body) resting on static geoms at their largest patch
    (:func:`~simjax.engine.collision.pairs.resting_rows`): objects lying on the floor
    keep their rows active in most states, which a quarter did not hold (a MuJoCo run
    of 500 steps: mjx_sensor 48 active rows in every state against a chunk of 42,
    mjx_convex 28 on average, 65% of the states past 24), so the later chunks ran on
    most passes. With it (64 rows each; settled states, batch 256, float32, process
    CPU, alternating processes): mjx_sensor 144.5, 145.5 -> 114.3, 113.9 us per
    world-step, mjx_convex 390, 333 -> 306, 276. A robot's own links are no such
    object, nor are SDF pairs' slots: the bench models' chunks are unchanged (the
    shadow hand's object 4 rows, under its 27)."""
    in_ell = ell_mask(spec)
    ns = int(np.sum(~in_ell))
    neq = int(np.sum(spec.eq))
    rest, nv = ns - neq, spec.nv
    quarter = -(-rest // 4)
    if not _BLOCKS and _few_rows(spec):
        # fewer than 8 rows per dof: 3/8 of them, at most 3 per dof
        cap = min(-(-3 * rest // 8), 3 * nv)
    elif _THIRD and _few_rows(spec) and 3 * 2 * nv <= rest:
        # a third of the rows, where that holds two per dof (barkour)
        cap = -(-rest // 3)
    else:
        cap = min(quarter, 2 * nv)
    # at least the rows of the rigid objects resting on static geoms (Spec.resting)
    ks = min(ns, neq + max(16, cap, spec.resting))
    ke = tuple(min(n, max(4, -(-n // 4))) for (_, n, _) in spec.ell)
    return ks, ke


def ell_mask(spec):
    in_ell = np.zeros(spec.nefc, bool)
    for start, n, dim in spec.ell:
        in_ell[start:start + n * dim] = True
    return in_ell


_TRIU_MAX = 1024     # rows up to which cumcount counts in one pass (cumsum, or _cumcount)


#: cumulative counts up to _TRIU_MAX rows by jnp.cumsum (XLA CPU: two reduce-windows,
#: as many kernels) instead of :func:`_cumcount`'s triangular products, read at trace
#: time. Once faster (138 rows 0.59 -> 0.36 us per world), the reduce-windows of jax
#: 0.10's XLA CPU are now about 5x slower than the triangular products: 120 rows
#: (barkour's solver rows, batch 1024, process CPU, one core) 2.0 against 0.35 us per
#: world, and 2.3 against 0.6-0.7 on two loaded cores; the counts are the same
#: (integers)
_CUMSUM = False


_BLOCK = 16          # block of _cumcount's triangular products


def _cumcount(a):
    """Cumulative count of the true entries of ``a`` (n,) (int32): triangular products
    within blocks of _BLOCK entries, then of the block totals (exact in float32 below
    2^24). One (n, n) triangular product did n^2 work per world: shadow hand (n 342)
    5.2 -> 1.5 us per world (batch 1024), barkour (n 170) 1.7 -> 1.0."""
    n = a.shape[0]
    nb = -(-n // _BLOCK)
    x = jnp.pad(a.astype(jnp.float32), (0, nb * _BLOCK - n)).reshape(nb, _BLOCK)
    within = x @ np.triu(np.ones((_BLOCK, _BLOCK), np.float32))
    before = within[:, -1] @ np.triu(np.ones((nb, nb), np.float32), 1)
    return (within + before[:, None]).reshape(-1)[:n].astype(jnp.int32)


def first_true(a, k):
    """Indices of the first ``k`` true entries of the boolean vector ``a`` in order,
    len(a) where there are fewer, and the cumulative count of true entries (jnp.nonzero(a,
    size=k) without its scatter). The cumulative count is :func:`cumcount` (an
    associative scan emitted ~15 kernels, for no run-time gain) and the indices a
    binary search (a loop, so that they are materialised once: a direct count fuses
    into every gather that uses them)."""
    cs = cumcount(a)
    # a constant (NumPy): an iota made a kernel of its own as the search loop's input
    q = np.arange(1, k + 1, dtype=np.int32)
    if not inline.LEAN:
        return inline.searchsorted(cs, q, method="scan"), cs
    return _bisect(cs, q), cs


def _bisect(cs, q):
    """jax.numpy's ``searchsorted`` (``method="scan"``, side "left", int32) of the sorted
    int32 ``cs`` (n,) for the queries ``q`` (k,): the same bisection, as a while loop
    carrying one counter and int32 bounds (jax's scan carries two counters and halves
    unsigned bounds by a division whose divisor XLA's loop-invariant code motion makes
    a loop input, dropped only in a late round of XLA's simplification fixpoint)."""
    n = cs.shape[0]
    levels = int(np.ceil(np.log2(n + 1)))

    def body(s):
        i, lo, hi = s
        mid = lo + jax.lax.shift_right_logical(hi - lo, jnp.ones_like(lo))
        left = q <= cs[mid]
        return i + 1, jnp.where(left, lo, mid), jnp.where(left, mid, hi)
    init = (jnp.zeros((), jnp.int32), jnp.zeros(q.shape, jnp.int32),
            jnp.full(q.shape, n, jnp.int32))
    return inline.while_loop(lambda s: s[0] < levels, body, init)[2]


def cumcount(a):
    """Cumulative count (int32) of the true entries of the boolean vector ``a``, as
    :func:`first_true` takes it (its binary search for the k-th true entry is
    ``searchsorted(cumcount(a), k)``); of a vector of small non-negative integers, their
    cumulative sum (exact while the sum stays below 2^24). The colliders' compactions
    take it too: jnp.cumsum is two reduce-windows on XLA CPU (see ``_CUMSUM``)."""
    if a.shape[0] <= _TRIU_MAX:
        if _CUMSUM:
            return jnp.cumsum(a, dtype=jnp.int32)
        return _cumcount(a)
    # the constants and work per world would outgrow the scan
    return jax.lax.associative_scan(jnp.add, a.astype(jnp.int32))


#: per-row problem entries gathered into the chunks, and the value of padding rows
#: (inactive one-sided rows with D = 0: zero force, cost and Hessian terms whatever
#: their Jacobian rows, :func:`_take_J`)
_FILL = {"aref": 0.0, "D": 0.0, "R": 1.0, "floss": 0.0, "active": False}


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Chunked:
    """A per-row value of the chunks: ``head`` that of chunk 0, ``rest`` those of the
    later chunks (leading axis the chunk, nchunk - 1 of them; zero past the chunks in
    use). Apart, chunk 0 (usually the only one in use) never reads or writes a
    (chunk, ...) buffer: the solves of one-chunk states ran 10-20% slower with the
    chunk values in one (nchunk, ...) array."""
    head: object
    rest: object

    def tree_flatten(self):
        return (self.head, self.rest), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)


def _is_chunked(x):
    return isinstance(x, Chunked)


def heads(tree):
    """``tree`` with every :class:`Chunked` value replaced by its ``head``."""
    return jax.tree_util.tree_map(lambda c: c.head, tree, is_leaf=_is_chunked)


def rests(tree):
    return jax.tree_util.tree_map(lambda c: c.rest, tree, is_leaf=_is_chunked)


@dataclasses.dataclass(frozen=True)
class Rows:
    """The rows of a primal problem in ``nchunk`` chunks of the layout ``spec`` (a
    :class:`simjax.engine.solver.Spec` of one chunk; its masks are per-chunk entries
    where the rows were gathered, else static). ``x0``: the per-row problem entries of
    chunk 0 (``mu`` / ``fr`` tuples per elliptic block) and ``J0`` its Jacobian rows,
    gathered once; ``nact`` the chunks in use (traced, at least 1). The later chunks
    are gathered when visited (usually never) from ``src`` (the problem's per-row
    entries, full Jacobian ``J``) at their source rows ``rest`` (leading axis the
    chunk; () until the first loop over the later chunks has found them from ``find``:
    the rows' (layout, caps, nefc) of :func:`_chunk_rows`, their cumulative counts and
    chunk 0's (rows, positions), for shapes; :func:`find_chunks`): XLA CPU gathers are
    slow, and gathering every chunk up front cost the humanoid / shadow hand solves
    10-50%; searching every chunk's rows up front cost the one-chunk solves about 10%.
    ``rank``: the cumulative count of active rows over the scalar rows (None: the
    whole rows in one chunk, :func:`whole`), for :func:`spread`. ``blocks``: under
    vmap the later chunks run on the worlds that use them (:func:`_world_loop`, from
    their table ``needy``, :func:`needy_table`), else on the whole batch."""
    spec: object
    nchunk: int
    x0: dict
    nact: object
    J0: object
    src: dict = None
    rest: tuple = ()
    find: tuple = ()
    rank: object = None
    blocks: bool = False
    needy: object = None


def spread(rows, active, vals):
    """Per-row values of the chunks (a list of :class:`Chunked`, or of plain arrays for
    whole rows) at the problem's rows: (nefc, len(vals)), zero on inactive rows.
    Without elliptic blocks the active rows fill the chunks in row order, so an active
    row's entry is entry ``rank - 1`` of the chunks laid end to end (``rank``: the
    cumulative count of active rows, :func:`gather`): a gather from chunk 0's values
    and one from the later chunks' (:data:`_SPREAD_SELECT`), the rows' products not
    made again at their full capacity. None where the chunks hold elliptic
    contacts."""
    if rows.rank is None:
        if isinstance(vals[0], Chunked):
            vals = [v.head for v in vals]
        return where(active[:, None], jnp.stack(vals, 1), 0.0)
    if rows.spec.ell:
        return None

    def take(cols, in_table):
        return _take_at(cols, in_table, rows.rank - 1)

    head = [v.head for v in vals]
    ks = head[0].shape[0]
    if rows.nchunk == 1:
        return take(head, active)
    if not _SPREAD_SELECT:
        # the later chunks only where a world uses them (usually none): their values
        # laid after chunk 0's are a table of every chunk's rows to copy
        return jax.lax.cond(
            any_world(rows.nact > 1),
            lambda: take([jnp.concatenate([v.head, v.rest.reshape(-1)]) for v in vals],
                         active),
            lambda: take(head, active & (rows.rank <= ks)))
    # (:data:`_SPREAD_SELECT`) a row past chunk 0 is entry rank - 1 - ks of the later
    # chunks laid end to end; the zero row of either table is that of the rows not in it
    later = [v.rest.reshape(-1) for v in vals]
    return where((rows.rank <= ks)[:, None], take(head, active & (rows.rank <= ks)),
                 _take_at(later, active & (rows.rank > ks), rows.rank - 1 - ks))


def _take_at(cols, in_table, idx):
    """Entries ``idx`` of the columns ``cols`` (a list of (n,) arrays) as (rows,
    len(cols)), zero where not ``in_table``: a zero row appended for those, in bounds,
    no fill select."""
    tab = jnp.stack(cols, 1)
    n = tab.shape[0]
    tab = jnp.concatenate([tab, jnp.zeros((1, len(cols)), tab.dtype)])
    return tab.at[where(in_table, idx, n)].get(mode="promise_in_bounds")


#: :func:`spread` takes a row past chunk 0 from the later chunks' values (a second
#: gather and a select, for every world), read at trace time (False: a conditional
#: between chunk 0's table and every chunk's values end to end, where a world of the
#: batch uses the later chunks, kept to compare). The conditional, its flag over the
#: batch and the branches' concatenations were 9 kernels; the two gathers are 2 (ant's
#: bench rollout 514 -> 506 kernels); the same values (float64 bench rollouts
#: bit-identical)
_SPREAD_SELECT = True


def _chunk_rows(layout, caps, nefc, pos):
    """Source rows (rows,) and source contacts per elliptic block of a chunk whose
    ``pos`` are the positions of its scalar rows among the scalar rows and of its
    contacts in their blocks (``len`` of the source where there are fewer). (Taken
    in bounds from the rows with the padding row appended, without jax's wrap of
    negative indices and its fill test: shadow hand bench rollout 1 kernel fewer,
    optimised IR -0.6% (ant -0.4%), its run 1/0.975 [0.918, 1.181] slower, paired over
    6 rounds; humanoid float64 steps moved by rounding. The island ids taken so as
    well: 2-3 kernels more.)"""
    srows, ell = layout
    ks, ke = caps
    idx = [jnp.take(jnp.asarray(srows, jnp.int32), pos[0], mode="fill", fill_value=nefc)]
    for (start, n, dim), ps in zip(ell, pos[1:]):
        rows = start + ps[:, None] * dim + np.arange(dim)
        idx.append(where(ps[:, None] < n, rows, nefc).reshape(-1))
    return jnp.concatenate(idx), tuple(pos[1:])


#: :func:`count_below`'s blocks are of equal sizes, at most 32 (``cs`` padded only where
#: they do not divide it: barkour's 120 rows are 4 blocks of 30, the hand's 108 of
#: 27), not of 32 entries with the last one padded; read at trace time (False: the
#: former way, kept to compare). A pad fused into the reduction made the kernel
#: costlier to compile; XLA compile of barkour's bench rollout 1/1.042 [0.938, 1.078]
#: (paired, 6 rounds, loaded machine). The same counts (integers); float32 bench
#: rollouts bit-identical (all four bench models), float64 steps within rounding
#: (humanoid qacc 2e-11 of 707 after 4 steps: kernels fused differently)
_EVEN = True


def count_below(cs, q):
    """Entries of the sorted ``cs`` (n,) below each of ``q`` (k,) (int32; searchsorted's
    left positions): a count over blocks of at most 32 entries, summed. With every reduction at
    most 32 long (XLA CPU splits longer ones into a reduce-window, whose input is
    materialised: a (worlds, n, k) array) the comparisons fuse into one reduction;
    the binary search (a loop) compiled 9 kernels in the loop over the later chunks."""
    n = cs.shape[0]
    if n == 0:          # no rows of this kind (e.g. a model without elliptic contacts)
        return jnp.zeros(q.shape, jnp.int32)
    nb = -(-n // 32)
    w = -(-n // nb) if _EVEN else 32
    big = jnp.iinfo(jnp.int32).max
    blocks = jnp.pad(cs, (0, nb * w - n), constant_values=big).reshape(nb, w)
    per = jnp.sum((blocks[None] < q[:, None, None]).astype(jnp.int32), -1,
                  dtype=jnp.int32)
    return jnp.sum(per, -1, dtype=jnp.int32)


def _chunk_positions(counts, caps, c):
    """Positions of chunk ``c``'s rows (:func:`_chunk_rows`) from the cumulative counts:
    entry j of a chunk of capacity k is the (c k + j + 1)-th active one."""
    ks, ke = caps
    out = []
    for cs, k in zip(counts, (ks,) + tuple(ke)):
        q = c * k + np.arange(1, k + 1, dtype=np.int32)
        out.append(count_below(cs, q))
    return out


#: the row masks of a chunk's table (:func:`_take_rows`) and their padding
_MASKS = {"eq": False, "fric": False, "ineq": True}


#: a row mask (static) whose rows are all its padding value is that value on every row
#: of a chunk (:func:`_uniform`), read at trace time (False: gathered, kept to compare).
#: The bench models' rows are all one-sided (no equality or friction-loss rows): bench
#: rollouts (batch 1024, float32) barkour 637 -> 634 kernels, ant 585 -> 584; paired XLA
#: compile CPU (6 rounds, loaded machine) off / on barkour 1.042 [0.982, 1.113], ant
#: 1.029 [1.008, 1.063]; barkour run 1.014 [0.918, 1.132] (8 rounds). The steps are
#: bit-identical; the last forward's solver outputs differ by rounding (kernels fused
#: differently: barkour float32 qacc 6e-5 of 974)
_STATIC_MASKS = True


def _uniform(mask, fill, n):
    """The static mask (n,) of a chunk's rows where every row of ``mask`` (static) is
    ``fill`` (the padding rows' value): known without a gather; else None."""
    if _STATIC_MASKS and isinstance(mask, np.ndarray) and np.all(mask == fill):
        return np.full(n, fill)
    return None


#: a layout without friction-loss rows gathers its rows' friction losses as a static
#: zero (:func:`gather`), read at trace time (False: the problem's, kept to compare)
_NO_FLOSS = True


#: :func:`_take_rows` stacks the table's columns at once and splits the gathered rows'
#: columns once (:func:`~simjax.engine.math.unstack`), not a reshape and a slice each
#: (the same table and slices lowered); read at trace time (False: one by one, kept
#: to compare). The bench's batched rollout: ant 3789 -> 3733 equations; the
#: optimised HLO the same up to names (ant, humanoid, barkour, shadow hand)
_SPLIT = True


def _take_rows(nisl, src, idx, pos, J):
    """A chunk's entries at source rows ``idx`` and elliptic contacts ``pos`` (padding
    rows: the padding entries) and, unless ``J`` is None, its Jacobian rows: the
    per-row entries (the static masks not known without a gather, :func:`_uniform`, as
    one constant column of codes, exact small numbers) are stacked into one table, its
    last row the padding row's entries, and the chunk's rows are one gather from it
    (XLA fuses the table into it), (mu, friction) one per elliptic block, the island
    ids one. Built inside the loop over the later chunks, the table costs nothing
    where the loop runs no iteration; a gather per entry compiled about 10 kernels per
    loop, and an integer column or three broadcast masks in the table made it a kernel
    of its own with their conversions (shadow hand: 27 kernels over its five loops).
    (With the Jacobian in the table as well, XLA built the whole table on every visit:
    the solves with several chunks in use ran 25% slower.) Chunk 0 is taken the same
    way: against a gather per entry, bench rollouts (batch 1024, float32) barkour 638
    -> 633 kernels, shadow hand 854 -> 849, humanoid 649 -> 647, run time within noise
    (barkour 0.998 [0.864, 1.079], 12 paired rounds), the same values gathered."""
    dtype = src["aref"].dtype
    known = {key: _uniform(src[key], v, idx.shape[0])
             for key, v in list(_MASKS.items()) + list(_FILL.items())}
    # the columns known statically (:data:`_NO_FLOSS`) are not gathered
    keys = [(key, v) for key, v in _FILL.items() if known[key] is None]
    known = {key: v if v is None or key in _MASKS else v.astype(dtype)
             for key, v in known.items()}
    masks = [key for key in _MASKS if known[key] is None]
    # the static masks as one constant column of codes, eq + 2 fric + 4 ineq
    code = sum(np.asarray(src[key]).astype(np.float32) * 2.0 ** j
               for j, key in enumerate(masks))
    pad = sum(float(_MASKS[key]) * 2.0 ** j for j, key in enumerate(masks))
    cols = ([src[key].astype(dtype) for key, _ in keys]
            + ([code.astype(dtype)] if masks else []))
    fill = [float(v) for _, v in keys] + ([pad] if masks else [])
    # (:data:`_SPLIT`: the columns stacked at once and the rows' columns split once)
    tab = jnp.concatenate([jnp.stack(cols, 1) if _SPLIT else
                           jnp.concatenate([c[:, None] for c in cols], 1),
                           jnp.asarray(fill, dtype)[None]])
    rows = tab.at[idx].get(mode="promise_in_bounds")
    rows = unstack(rows, 1) if _SPLIT else [rows[:, j] for j in range(len(cols))]
    x = {key: v for key, v in known.items() if v is not None}
    for j, (key, v) in enumerate(keys):
        x[key] = rows[j] != 0 if isinstance(v, bool) else rows[j]
    if masks:
        bits = rows[len(keys)].astype(jnp.int32)
        for j, key in enumerate(masks):
            x[key] = (bits & (1 << j)) != 0
    if "rowisl" in src:
        x["rowisl"] = jnp.take(src["rowisl"], idx, mode="fill", fill_value=nisl)
    ell = [jnp.concatenate([jnp.concatenate([mu[:, None], fr], 1),
                            jnp.ones((1, fr.shape[1] + 1), dtype)]
                           ).at[ps].get(mode="promise_in_bounds")
           for mu, fr, ps in zip(src["mu"], src["fr"], pos)]
    x.update(mu=tuple(e[:, 0] for e in ell), fr=tuple(e[:, 1:] for e in ell))
    if J is not None:
        J = _take_J(J, idx)
    return x, J


def _take_J(J, idx):
    """Jacobian rows at ``idx`` (padding entries past the last row). A padding row is
    the last row's copy, not zero: with D = 0 (and inactive, :data:`_FILL`) its force,
    cost, Hessian and line-search terms are exactly zero whatever its Jacobian, and a
    clamped gather needs no select of the fill value (a kernel as long as the gather
    on CPU)."""
    return jnp.take(J, idx, axis=0, mode="clip")


def gather(spec, p, caps):
    """The active rows of problem ``p`` (row structure ``spec``) in the chunks of
    :class:`Rows`, chunk sizes ``caps`` (:func:`row_capacity`)."""
    ks, ke = caps
    nefc = spec.nefc
    act = p["active"]
    srows = np.nonzero(~ell_mask(spec))[0]
    ns = len(srows)
    nchunk = max([-(-ns // ks) if ks else 0]
                 + [-(-n // k) for (_, n, _), k in zip(spec.ell, ke)] + [1])
    pos, cs = first_true(act[srows], ks)
    pos, counts = [pos], [cs]
    nact = _chunks_of(cs[-1], ks) if ks else jnp.zeros((), jnp.int32)
    ell = []
    row = ks
    for (start, n, dim), k in zip(spec.ell, ke):
        ps, cs = first_true(act[start:start + n * dim:dim], k)
        pos.append(ps)
        counts.append(cs)
        nact = jnp.maximum(nact, _chunks_of(cs[-1], k))
        ell.append((row, k, dim))
        row += k * dim
    layout = (srows, tuple(spec.ell))
    idx, cpos = _chunk_rows(layout, caps, nefc, pos)
    nact = jnp.maximum(nact, 1).astype(jnp.int32)
    # the later chunks' rows are found by the first loop over them (find_chunks)
    like = (idx, cpos) if nchunk > 1 else ()
    find = ((layout, caps, nefc), tuple(counts), like) if nchunk > 1 else ()
    # materialised once: fused into the gathers, the index search would be recomputed
    # for every gathered element
    idx, cpos = jax.lax.optimization_barrier((idx, cpos))
    src = {key: p[key] for key in tuple(_FILL) + ("mu", "fr", "rowisl") if key in p}
    if _NO_FLOSS and not np.any(spec.fric):
        # the rows' friction losses are read on friction-loss rows only: without any
        # they are a static zero, not a (worlds, rows) array that the later chunks'
        # loops and the primal solvers' gathered trips carry and gather
        src["floss"] = np.zeros(nefc, np.float32)
    # the static masks stay numpy: every chunk's gather (_take_rows; the later chunks'
    # loops close over them) takes them as one constant column of codes
    src.update(eq=np.asarray(spec.eq), fric=np.asarray(spec.fric),
               ineq=np.asarray(spec.ineq))
    x0, _ = _take_rows(spec.nisl, src, idx, cpos, None)
    cspec = dataclasses.replace(spec, eq=None, fric=None, ineq=None, ell=tuple(ell),
                                nefc=row)
    J0 = _take_J(p["J"], idx)
    src["J"] = p["J"]
    blocks = nchunk > 1 and _BLOCKS and _few_rows(spec) and per_world_work()
    return Rows(cspec, nchunk, x0, nact, J0, src, (), find, counts[0], blocks,
                needy_table(nact) if blocks else None)


def _chunks_of(count, k):
    """Chunks of ``k`` rows that ``count`` rows fill (int32, ``count`` >= 0): one
    truncating division (jnp's floor division of signed integers adds a remainder and
    its sign fix-up, two kernels under vmap)."""
    return jax.lax.div(count + (k - 1), jnp.int32(k))


def whole(spec, p):
    """All rows of ``p`` as a single chunk (static masks: no gather)."""
    x0 = {key: p[key] for key in tuple(_FILL) + ("mu", "fr", "rowisl") if key in p}
    return Rows(spec, 1, x0, jnp.ones((), jnp.int32), p["J"])


def _chunk_spec(spec, x):
    if "eq" in x:
        spec = dataclasses.replace(spec, eq=x["eq"], fric=x["fric"], ineq=x["ineq"])
    return spec
