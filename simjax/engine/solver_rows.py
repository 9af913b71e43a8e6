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
chunk access would become a gather: :func:`over_chunks` is a ``custom_vmap`` whose rule
runs to the largest count of the batch with an unbatched counter (worlds with fewer
chunks add the zero contributions of their padding rows, which are exact).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np



def row_capacity(spec):
    """Static size of a chunk: (scalar rows, contacts per elliptic block).

    Equality rows are usually all active and are always kept; the remaining rows get a
    quarter of their capacity (at least 16 rows / 4 contacts)."""
    in_ell = ell_mask(spec)
    ns = int(np.sum(~in_ell))
    neq = int(np.sum(spec.eq))
    ks = min(ns, neq + max(16, -(-(ns - neq) // 4)))
    ke = tuple(min(n, max(4, -(-n // 4))) for (_, n, _) in spec.ell)
    return ks, ke


def ell_mask(spec):
    in_ell = np.zeros(spec.nefc, bool)
    for start, n, dim in spec.ell:
        in_ell[start:start + n * dim] = True
    return in_ell


_TRIU_MAX = 1024     # rows up to which first_true counts by a triangular product


def first_true(a, k):
    """Indices of the first ``k`` true entries of the boolean vector ``a`` in order,
    len(a) where there are fewer, and the number of true entries (jnp.nonzero(a,
    size=k) without its scatter). The cumulative count is a product with a constant
    triangular matrix (one kernel under vmap, exact in floating point below 2^24 rows;
    an associative scan emitted ~15 kernels, for no run-time gain) and the indices a
    binary search (a loop, so that they are materialised once: a direct count fuses
    into every gather that uses them)."""
    n = a.shape[0]
    if n <= _TRIU_MAX:
        cs = (a.astype(jnp.float32) @ np.triu(np.ones((n, n), np.float32))).astype(jnp.int32)
    else:       # the (n, n) constant and n^2 work per world would outgrow the scan
        cs = jax.lax.associative_scan(jnp.add, a.astype(jnp.int32))
    pos = jnp.searchsorted(cs, jnp.arange(1, k + 1, dtype=jnp.int32), method="scan")
    return pos, cs[-1]


#: per-row problem entries gathered into the chunks, and the value of padding rows
#: (inactive one-sided rows: zero Jacobian, zero force)
_FILL = {"aref": 0.0, "D": 0.0, "R": 1.0, "floss": 0.0, "active": False}


@dataclasses.dataclass(frozen=True)
class Rows:
    """The rows of a primal problem in ``nchunk`` chunks of the layout ``spec`` (a
    :class:`simjax.engine.solver.Spec` of one chunk; its masks are per-chunk entries
    where the rows were gathered, else static). ``x0``: the per-row problem entries of
    chunk 0 (``mu`` / ``fr`` tuples per elliptic block) and ``J0`` its Jacobian rows,
    gathered once; ``nact`` the chunks in use (traced, at least 1). The later chunks
    are gathered when visited (usually never) from ``src`` (the problem's per-row
    entries, full Jacobian ``J``) at ``idx`` (source rows (nchunk, rows)) and ``pos``
    (source contacts (nchunk, contacts) per elliptic block): XLA CPU gathers are slow,
    and gathering every chunk up front cost the humanoid / shadow hand solves 10-50%."""
    spec: object
    nchunk: int
    x0: dict
    nact: object
    J0: object
    src: dict = None
    idx: object = None
    pos: tuple = ()


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
    pos, cnt = first_true(act[srows], nchunk * ks)
    idx = [jnp.take(jnp.asarray(srows, jnp.int32), pos, mode="fill",
                    fill_value=nefc).reshape(nchunk, ks)]
    nact = -(-cnt // ks) if ks else jnp.zeros((), jnp.int32)
    ell, cpos = [], []
    row = ks
    for (start, n, dim), k in zip(spec.ell, ke):
        pos, cnt = first_true(act[start:start + n * dim:dim], nchunk * k)
        rows = start + pos[:, None] * dim + np.arange(dim)
        idx.append(jnp.where(pos[:, None] < n, rows, nefc).reshape(nchunk, k * dim))
        cpos.append(pos.reshape(nchunk, k))
        nact = jnp.maximum(nact, -(-cnt // k))
        ell.append((row, k, dim))
        row += k * dim
    # materialised once: fused into the gathers, the index search would be recomputed
    # for every gathered element
    idx, cpos = jax.lax.optimization_barrier((jnp.concatenate(idx, 1), tuple(cpos)))
    src = {key: p[key] for key in tuple(_FILL) + ("mu", "fr", "rowisl") if key in p}
    src.update(eq=jnp.asarray(spec.eq), fric=jnp.asarray(spec.fric),
               ineq=jnp.asarray(spec.ineq))
    x0 = _take_chunk(spec.nisl, src, idx[0], tuple(c[0] for c in cpos))
    cspec = dataclasses.replace(spec, eq=None, fric=None, ineq=None, ell=tuple(ell),
                                nefc=row)
    J0 = jnp.take(p["J"], idx[0], axis=0, mode="fill", fill_value=0.0)
    src["J"] = p["J"]
    return Rows(cspec, nchunk, x0, jnp.maximum(nact, 1).astype(jnp.int32), J0, src, idx,
                cpos)


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


def _loop(fn, n, xs, args, acc, outs, batch=None):
    """acc, outs = fold of fn(c, x_c, args, acc) -> (acc, out_c) over the chunks
    1 <= c < n of xs, out_c written to chunk c of outs (leading axis the chunk);
    ``batch``: None, or the batched flags of (xs, args) inside the vmap rule (fn then
    runs vmapped over worlds, with an unbatched chunk counter; acc, outs batched)."""
    if batch is None:
        g, xaxis, cax = fn, jax.tree_util.tree_map(lambda _: 0, xs), 0
    else:
        xb, ab = batch
        ax = lambda b: jax.tree_util.tree_map(lambda f: 0 if f else None, b)
        g = jax.vmap(fn, in_axes=(None, ax(xb), ax(ab), 0))
        xaxis = jax.tree_util.tree_map(lambda f: 1 if f else 0, xb)
        cax = 1

    def body(s):
        c, acc, outs = s
        acc, out = g(c, _index(xs, c, xaxis), args, acc)
        outs = jax.tree_util.tree_map(
            lambda b, o: jax.lax.dynamic_update_index_in_dim(b, o, c, cax), outs, out)
        return c + 1, acc, outs

    _, acc, outs = jax.lax.while_loop(lambda s: s[0] < n, body,
                                      (jnp.ones((), jnp.int32), acc, outs))
    return acc, outs


def over_chunks(rows, fn, acc, extra=(), args=(), jac=False):
    """Fold over the chunks in use, c < rows.nact: ``acc, out_c = fn(spec_c, x_c, e_c,
    J_c, args, acc)`` with ``x_c`` the problem rows of chunk ``c``, ``e_c`` chunk ``c``
    of ``extra`` (leading axis the chunk), ``spec_c`` its row structure and ``J_c`` its
    Jacobian rows (None unless ``jac``). Returns (acc, outs), outs with leading axis
    the chunk (zero past the chunks in use). ``fn`` must close over no traced value:
    pass them in ``args``.

    Chunk 0 runs inline on the rows gathered once, the others in a loop that usually
    runs no iteration, their rows gathered when visited. (Every chunk in the loop
    compiles about 1 s faster on the humanoid but runs the solve 2x slower: XLA CPU
    gathers are slow, and the loop's chunk 0 needs its rows either gathered on every
    visit or copied out of a conditional.)"""
    spec, nchunk = rows.spec, rows.nchunk
    x0 = rows.x0
    acc, out0 = fn(_chunk_spec(spec, x0), x0, jax.tree_util.tree_map(lambda v: v[0], extra),
                   rows.J0 if jac else None, args, acc)
    if nchunk == 1:
        return acc, jax.tree_util.tree_map(lambda o: o[None], out0)
    outs = jax.tree_util.tree_map(
        lambda o: jnp.zeros((nchunk,) + o.shape, o.dtype).at[0].set(o), out0)
    src = dict(rows.src)
    J = src.pop("J")

    def inner(c, xe, a, acc):
        (idx, pos, e), (user, src, J) = xe, a
        x = _take_chunk(spec.nisl, src, idx, pos)
        if J is not None:
            J = jnp.take(J, idx, axis=0, mode="fill", fill_value=0.0)
        return fn(_chunk_spec(spec, x), x, e, J, user, acc)

    xs = (rows.idx, rows.pos, extra)
    a = (args, src, J if jac else None)

    @jax.custom_batching.custom_vmap
    def run(n, xs, a, acc, outs):
        return _loop(inner, n, xs, a, acc, outs)

    @run.def_vmap
    def _rule(size, flags, n, xs, a, acc, outs):
        nb, xb, ab, accb, ob = flags
        # the accumulators and outputs are updated per world: batched
        acc, outs = jax.tree_util.tree_map(
            lambda v, f: v if f else jnp.broadcast_to(v, (size,) + v.shape),
            (acc, outs), (accb, ob))
        out = _loop(inner, jnp.max(n) if nb else n, xs, a, acc, outs, batch=(xb, ab))
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return run(rows.nact, xs, a, acc, outs)
