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
whole batch or, where chunk 0 is small (:attr:`Rows.blocks`), on blocks of the worlds
that use the later chunks (:func:`_needy_loop`).

The one-chunk path must cost what a single compact buffer cost: chunk 0's values are
kept apart from the later chunks' (:class:`Chunked`), the later chunks' rows are
searched once per solve by a loop over the chunks in use and gathered only when
visited, and only the values carried from one pass over the rows to the next are
stored for them. Under vmap every array of the loops is a (worlds, ...) temporary
allocated on every call whether the loop runs or not: a program's temporaries past
glibc's largest mmap threshold (32 MiB) are mapped afresh on every call and their pages
faulted in (system time), which cost the barkour solve 25% when a (worlds, rows, chunk
rows) search count pushed them there.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.math import reduce_fused, where


#: where a quarter of the rows is under two per dof: the later chunks run on the worlds
#: that use them (:func:`_needy_loop`); False: chunk 0 takes 3/8 of the rows there
#: instead, and the later chunks run on the whole batch (kept to compare the two)
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
    (:func:`_needy_loop`). With the later chunks on the whole batch, one world past
    chunk 0 cost barkour's step 13-17%, the hand's 8%, and 3/8 of the rows (52) were
    taken instead, which cost 6-8% on batches that never pass 35 (MuJoCo-settled
    states). Against that, the blocks ran barkour's step 0.93x (settled states) and
    0.94x (bench states), the hand's 0.90x and 0.98x (paired, batch 1024, float32,
    5-step rollouts, loaded machine: ranges of +-15%), for more kernels: barkour
    525 -> 596 (compile 6.7-7.5 -> 6.9-8.3 s CPU, about +10%), shadow hand 786 ->
    875. Since zero friction losses have no rows, the chunks are 30 rows (barkour) and
    27 (hand), and 35-60% of barkour's bench worlds pass 30 active rows after the first
    step; chunks of 35 ran barkour 0.987x and the hand 0.982x (12 rounds each, ranges
    +-15%): noise, so the quarter stays."""
    in_ell = ell_mask(spec)
    ns = int(np.sum(~in_ell))
    neq = int(np.sum(spec.eq))
    rest, nv = ns - neq, spec.nv
    quarter = -(-rest // 4)
    if not _BLOCKS and _few_rows(spec):
        # fewer than 8 rows per dof: 3/8 of them, at most 3 per dof
        cap = min(-(-3 * rest // 8), 3 * nv)
    else:
        cap = min(quarter, 2 * nv)
    ks = min(ns, neq + max(16, cap))
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
#: time. Alone (batch 1024, process CPU): 138 rows 0.59 -> 0.36 us per world, 342 rows
#: 1.12 -> 0.75, 60 rows 0.20 both; barkour's bench step 0.968-0.971x (paired, 16
#: rounds). The same counts (integers)
_CUMSUM = True
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
    pos = inline.searchsorted(cs, jnp.arange(1, k + 1, dtype=jnp.int32), method="scan")
    return pos, cs


def cumcount(a):
    """Cumulative count (int32) of the true entries of the boolean vector ``a``, as
    :func:`first_true` takes it (its binary search for the k-th true entry is
    ``searchsorted(cumcount(a), k)``)."""
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
    vmap the later chunks run on the worlds that use them (:func:`_needy_loop`, from
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
    cumulative count of active rows, :func:`gather`): one gather, the rows' products
    not made again at their full capacity. None where the chunks hold elliptic
    contacts."""
    if rows.rank is None:
        if isinstance(vals[0], Chunked):
            vals = [v.head for v in vals]
        return where(active[:, None], jnp.stack(vals, 1), 0.0)
    if rows.spec.ell:
        return None

    def take(cols, in_table):
        tab = jnp.stack(cols, 1)
        n = tab.shape[0]
        # a zero row for the rows not in the table: in bounds, no fill select
        tab = jnp.concatenate([tab, jnp.zeros((1, len(vals)), tab.dtype)])
        idx = where(in_table, rows.rank - 1, n)
        return tab.at[idx].get(mode="promise_in_bounds")

    head = [v.head for v in vals]
    ks = head[0].shape[0]
    if rows.nchunk == 1:
        return take(head, active)
    # the later chunks only where a world uses them (usually none): their values laid
    # after chunk 0's are a table of every chunk's rows to copy
    return jax.lax.cond(
        any_world(rows.nact > 1),
        lambda: take([jnp.concatenate([v.head, v.rest.reshape(-1)]) for v in vals], active),
        lambda: take(head, active & (rows.rank <= ks)))


def _chunk_rows(layout, caps, nefc, pos):
    """Source rows (rows,) and source contacts per elliptic block of a chunk whose
    ``pos`` are the positions of its scalar rows among the scalar rows and of its
    contacts in their blocks (``len`` of the source where there are fewer)."""
    srows, ell = layout
    ks, ke = caps
    idx = [jnp.take(jnp.asarray(srows, jnp.int32), pos[0], mode="fill", fill_value=nefc)]
    for (start, n, dim), ps in zip(ell, pos[1:]):
        rows = start + ps[:, None] * dim + np.arange(dim)
        idx.append(where(ps[:, None] < n, rows, nefc).reshape(-1))
    return jnp.concatenate(idx), tuple(pos[1:])


def count_below(cs, q):
    """Entries of the sorted ``cs`` (n,) below each of ``q`` (k,) (int32; searchsorted's
    left positions): a count over blocks of 32 entries, summed. With every reduction at
    most 32 long (XLA CPU splits longer ones into a reduce-window, whose input is
    materialised: a (worlds, n, k) array) the comparisons fuse into one reduction;
    the binary search (a loop) compiled 9 kernels in the loop over the later chunks."""
    n = cs.shape[0]
    nb = -(-n // 32)
    big = jnp.iinfo(jnp.int32).max
    blocks = jnp.pad(cs, (0, nb * 32 - n), constant_values=big).reshape(nb, 32)
    per = jnp.sum((blocks[None] < q[:, None, None]).astype(jnp.int32), -1,
                  dtype=jnp.int32)
    return jnp.sum(per, -1, dtype=jnp.int32)


def _chunk_positions(counts, caps, c):
    """Positions of chunk ``c``'s rows (:func:`_chunk_rows`) from the cumulative counts:
    entry j of a chunk of capacity k is the (c k + j + 1)-th active one."""
    ks, ke = caps
    out = []
    for cs, k in zip(counts, (ks,) + tuple(ke)):
        q = c * k + jnp.arange(1, k + 1, dtype=jnp.int32)
        out.append(count_below(cs, q))
    return out


def _take_chunk(nisl, src, idx, pos):
    """Chunk entries at source rows ``idx`` and elliptic contacts ``pos`` (fill:
    padding rows, inactive one-sided rows)."""
    take = lambda x, fill: jnp.take(x, idx, axis=0, mode="fill", fill_value=fill)
    x = {key: take(src[key], fill) for key, fill in _FILL.items()}
    x.update(eq=take(src["eq"], False), fric=take(src["fric"], False),
             ineq=take(src["ineq"], True),
             mu=tuple(jnp.take(mu, ps, mode="fill", fill_value=1.0)
                      for mu, ps in zip(src["mu"], pos)),
             fr=tuple(jnp.take(fr, ps, axis=0, mode="fill", fill_value=1.0)
                      for fr, ps in zip(src["fr"], pos)))
    if "rowisl" in src:
        x["rowisl"] = take(src["rowisl"], nisl)
    return x


#: the row masks of a later chunk's table (:func:`_take_rest`) and their padding
_MASKS = {"eq": False, "fric": False, "ineq": True}


def _take_rest(nisl, src, idx, pos, J):
    """:func:`_take_chunk` (and the Jacobian rows, unless ``J`` is None) on a later
    chunk: the per-row entries (the static masks as one constant column of codes,
    exact small numbers) are stacked into one table, its last row the padding row's
    entries, and the chunk's rows are one gather from it (XLA fuses the table into
    it), (mu, friction) one per elliptic block, the island ids one. Built inside the
    loop over the later chunks, the table costs nothing where the loop runs no
    iteration; a gather per entry compiled about 10 kernels per loop, and an integer
    column or three broadcast masks in the table made it a kernel of its own with
    their conversions (shadow hand: 27 kernels over its five loops). (With the
    Jacobian in the table as well, XLA built the whole table on every visit: the
    solves with several chunks in use ran 25% slower.)"""
    dtype = src["aref"].dtype
    keys = list(_FILL.items())
    # the static masks as one constant column of codes, eq + 2 fric + 4 ineq
    code = sum(np.asarray(src[key]).astype(np.float32) * 2.0 ** j
               for j, key in enumerate(_MASKS))
    pad = sum(float(v) * 2.0 ** j for j, v in enumerate(_MASKS.values()))
    cols = [src[key].astype(dtype)[:, None] for key, _ in keys] + [code.astype(dtype)[:, None]]
    fill = [float(v) for _, v in keys] + [pad]
    tab = jnp.concatenate([jnp.concatenate(cols, 1), jnp.asarray(fill, dtype)[None]])
    rows = tab.at[idx].get(mode="promise_in_bounds")
    x = {}
    for j, (key, v) in enumerate(keys):
        x[key] = rows[:, j] != 0 if isinstance(v, bool) else rows[:, j]
    bits = rows[:, len(keys)].astype(jnp.int32)
    for j, key in enumerate(_MASKS):
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
    nact = -(-cs[-1] // ks) if ks else jnp.zeros((), jnp.int32)
    ell = []
    row = ks
    for (start, n, dim), k in zip(spec.ell, ke):
        ps, cs = first_true(act[start:start + n * dim:dim], k)
        pos.append(ps)
        counts.append(cs)
        nact = jnp.maximum(nact, -(-cs[-1] // k))
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
    # the static masks stay numpy: the later chunks' loops close over them and gather
    # them as one constant column of codes (_take_rest)
    src.update(eq=np.asarray(spec.eq), fric=np.asarray(spec.fric),
               ineq=np.asarray(spec.ineq))
    x0 = _take_chunk(spec.nisl, src, idx, cpos)
    cspec = dataclasses.replace(spec, eq=None, fric=None, ineq=None, ell=tuple(ell),
                                nefc=row)
    J0 = _take_J(p["J"], idx)
    src["J"] = p["J"]
    blocks = nchunk > 1 and _BLOCKS and _few_rows(spec)
    return Rows(cspec, nchunk, x0, nact, J0, src, (), find, counts[0], blocks,
                needy_table(nact) if blocks else None)


def whole(spec, p):
    """All rows of ``p`` as a single chunk (static masks: no gather)."""
    x0 = {key: p[key] for key in tuple(_FILL) + ("mu", "fr", "rowisl") if key in p}
    return Rows(spec, 1, x0, jnp.ones((), jnp.int32), p["J"])


def _chunk_spec(spec, x):
    if "eq" in x:
        spec = dataclasses.replace(spec, eq=x["eq"], fric=x["fric"], ineq=x["ineq"])
    return spec


# --------------------------------------------------------------------------- loops
def _index(tree, c, axis):
    return jax.tree_util.tree_map(
        lambda a, ax: jax.lax.dynamic_index_in_dim(a, c, ax, keepdims=False), tree, axis)


def _loop(fn, n, xs, args, acc, state, batch=None, args_axis=None):
    """acc, state = fold of fn(c, x_c, s_c, args, acc) -> (acc, s_c) over the chunks
    1 <= c < n, x_c and s_c entry c - 1 of xs and state (leading axis the chunk), s_c
    written back; ``n`` a scalar or a function computing it in the loop's condition;
    ``batch``: None, or the batched flags of (xs, args) inside the vmap rule (fn then
    runs vmapped over worlds, with an unbatched chunk counter; acc, state batched),
    ``args_axis`` then the vmap axes of args in place of those its flags give."""
    if batch is None:
        g, xaxis, cax = fn, jax.tree_util.tree_map(lambda _: 0, xs), 0
    else:
        xb, ab = batch
        ax = lambda b: jax.tree_util.tree_map(lambda f: 0 if f else None, b)
        aax = ax(ab) if args_axis is None else args_axis
        g = jax.vmap(fn, in_axes=(None, ax(xb), 0, aax, 0))
        xaxis = jax.tree_util.tree_map(lambda f: 1 if f else 0, xb)
        cax = 1

    def body(s):
        c, acc, state = s
        sc = _index(state, c - 1, jax.tree_util.tree_map(lambda _: cax, state))
        acc, sc = g(c, _index(xs, c - 1, xaxis), sc, args, acc)
        state = jax.tree_util.tree_map(
            lambda b, o: jax.lax.dynamic_update_index_in_dim(b, o, c - 1, cax), state, sc)
        return c + 1, acc, state

    # n a function: the count computed in the loop's condition
    bound = n if callable(n) else lambda: n
    _, acc, state = inline.while_loop(lambda s: s[0] < bound(), body,
                                      (jnp.ones((), jnp.int32), acc, state))
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


def find_chunks(rows, fn, acc, extra=(), args=(), jac=False, state=(), finish=None):
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
    :attr:`Rows.blocks`, by their block: never a (worlds, ...) array to fill on every
    call), and where a world visits them its ``out`` becomes ``g(acc, local, out)``
    (every world without blocks: ``g`` must keep ``out`` for a ``local`` of zeros);
    the returned acc is then (acc, out)."""
    spec, nchunk = rows.spec, rows.nchunk
    g, local_like, fin = finish if finish is not None else (None, (), ())
    # zeros made where used: the loops close over no traced value
    local0 = lambda *size: jax.tree_util.tree_map(
        lambda l: jnp.zeros(size + tuple(l.shape), l.dtype), local_like)
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
        x, J = _take_rest(spec.nisl, src, idx, pos, J)
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
        if nb and tb:
            out = _needy_loop(inner, size, n, tab, xs, a, acc, state, (xb, ab),
                              (g, local0, fin))
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


_CHUNK_BLOCK = 32    # worlds per block of :func:`_needy_loop`
_PACK = 8            # leaves per table of :func:`_needy_loop`


def needy_table(nact):
    """Under ``vmap``, the worlds whose active rows pass chunk 0 (``nact`` > 1), found
    once per solve for all its loops over the later chunks (:func:`_needy_loop`): their
    indices in order, then the batch size (worlds,) (int32). Without vmap (or for an
    unbatched ``nact``) zero, unused."""
    @jax.custom_batching.custom_vmap
    def run(n):
        return jnp.zeros((), jnp.int32)

    @run.def_vmap
    @inline.inlined
    def _rule(size, flags, n):
        if not flags[0]:
            return jnp.zeros((), jnp.int32), False
        return _first_worlds(n > 1, size), True

    return run(nact)


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
        one = lambda f, r: jax.lax.dynamic_update_index_in_dim(
            f, jax.lax.dynamic_index_in_dim(r, j, 0, keepdims=True), ids()[j], 0)
        return j + 1, jax.tree_util.tree_map(one, full, rows)

    more = lambda c: (c[0] < n) & (ids()[jnp.minimum(c[0], n - 1)] < size)
    return inline.while_loop(more, put, (jnp.zeros((), jnp.int32), full))[1]


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
    per world: one stacked operand, :func:`_tables`), every entry's bits kept (:func:`_unpack`), each leaf's columns
    transposed and concatenated on the major axis: a gather of the table's columns is
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


def _needy_loop(inner, size, n, tab, xs, a, acc, state, batch, finish):
    """:func:`_loop` under vmap on the worlds with chunks after chunk 0 only, from
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
    ``finish``: (g, local, out) of :func:`find_chunks` (g None: none), ``local`` a
    function making the zero local accumulators of n worlds (the block's only);
    returns (acc, state, out)."""
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
    block = lambda b: jax.lax.dynamic_slice_in_dim(tab, b * blk, blk)

    def body(c):
        b, acc_all, state_all, fin_all = c
        # the table depends on the block: XLA would otherwise build it for the whole
        # batch before the loop (loop-invariant), on every call
        src, ids = jax.lax.optimization_barrier((on, block(b)))
        # at most _PACK operands a table: XLA CPU fuses no concatenation of more
        rows = [jnp.take(_pack([[src[i] for i in op] for op in t], size), ids, axis=1,
                         mode="clip")
                for t in tables]
        take = lambda v: jnp.take(v, ids, axis=0, mode="clip")
        # the block's largest count
        most = lambda: jnp.max(where(block(b) < size,
                                         jnp.take(n, block(b), mode="clip"), 1))
        acc, state, fin = jax.tree_util.tree_map(take, (acc_all, state_all, fin_all))
        if g is not None:
            acc = (acc, local0(blk))
        acc, state = _loop(fn, most, (), (rows, off), acc, state,
                           batch=((), (True, [False] * len(off))), args_axis=(1, None))
        if g is not None:
            (acc, local) = acc
            fin = jax.vmap(g)(acc, local, fin)
        return (b + 1,) + _put_rows((acc_all, state_all, fin_all), lambda: block(b),
                                    (acc, state, fin))

    # blocks while one holds a world in need
    more = lambda c: (c[0] < nblk) & (tab[jnp.minimum(c[0], nblk - 1) * blk] < size)
    return inline.while_loop(more, body,
                             (jnp.zeros((), jnp.int32), acc, state, fin))[1:]


def rest_zeros(rows, like):
    """Per-chunk arrays for the chunks after chunk 0 (zero), shaped as ``like``'s
    (chunk 0's) entries."""
    return jax.tree_util.tree_map(
        lambda o: jnp.zeros((rows.nchunk - 1,) + o.shape, o.dtype), like)


# --------------------------------------------------------------------------- worlds
_WORLD_BLOCK = 128   # worlds per block of :func:`where_needed`


def _first_worlds(need, k):
    """Indices of the true entries of ``need`` (n,) in order, then n, k of them: one
    sort of keys that put the true entries first, each keeping its index. For the
    worlds of a batch (one vector, not under vmap) the sort is 3 kernels where
    :func:`first_true`'s count and binary search were 18 (the humanoid's step 653 ->
    638 kernels), in the same time at 1024 worlds (27 us); over each world's rows
    (under vmap) it ran 2x slower than first_true (232 rows: 3.8 against 1.8 us per
    world)."""
    n = need.shape[0]
    ids = jnp.arange(n, dtype=jnp.int32)
    key = jnp.sort(where(need, ids, n + ids))
    pos = where(key < n, key, n)
    return jnp.concatenate([pos, jnp.full((k - n,), n, jnp.int32)]) if k > n else pos[:k]


#: :func:`where_needed` writes a block's results back by :func:`_put_rows`, a loop to
#: the block's last world, read at trace time (False: a scatter per leaf, a loop over
#: every entry of the block, kept to compare): humanoid's bench rollout 660 -> 658
#: kernels, ant 592 -> 590; outputs bit-identical; run time within noise (scatter /
#: put rows: humanoid 1.063 [0.93, 1.34], ant 1.016 [0.85, 1.29], 8 paired rounds)
_PUT_ROWS = True


def where_needed(fn, need, args, old):
    """``fn(*args)`` where ``need``, else ``old`` (a tree shaped as fn's output).

    One world computes fn only where needed (a conditional). Under ``vmap`` (a
    ``custom_vmap`` rule) the worlds that need it are found, gathered in blocks of
    _WORLD_BLOCK and computed block by block, their results scattered into ``old``:
    the work follows the number of worlds in need, not the batch size, and every world's
    result is computed as the vmapped fn computes it (the same bits on a CPU; on a GPU
    a block's kernels may round the last bit differently). Where most worlds
    need it, fn runs on the whole batch instead (gathering and scattering them cost
    about a third of fn's work for a Newton Hessian factorisation). fn is compiled in
    both branches (~10 kernels for a Newton Hessian factorisation); computing every
    world in consecutive blocks instead compiled it once, but ran the humanoid's solves
    with several row chunks in use (every world in need on every pass) 5-10% slower."""
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
                ids = jax.lax.dynamic_slice_in_dim(pos, b * blk, blk)
                # padding entries (index size) read the last world and are not written
                sub = jax.tree_util.tree_map(
                    lambda a, f: jnp.take(a, ids, axis=0, mode="clip") if f else a,
                    args, ab)
                new = vfn(*sub)
                if _PUT_ROWS:
                    out = _put_rows(out, lambda: jax.lax.dynamic_slice_in_dim(
                        pos, b * blk, blk), new)
                else:
                    out = jax.tree_util.tree_map(
                        lambda o, n: o.at[ids].set(n, mode="drop"), out, new)
                return b + 1, out

            return inline.while_loop(lambda c: c[0] * blk < count, body,
                                     (jnp.zeros((), jnp.int32), old))[1]

        out = jax.lax.cond(5 * count > 3 * size, whole, blocks)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(need, args, old)


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
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(tree, like)
