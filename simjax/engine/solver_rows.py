"""Row chunks of the primal constraint problem (Newton / CG in :mod:`simjax.engine.solver`).

The row capacity (every row that could be active: all contact slots, both sides of every
limit) is many times the number of active rows in a typical state, and the iterations
cost O(rows) per line-search point and O(rows nv^2) per Hessian. The active rows are
therefore gathered, in order, into ``C`` chunks of one static layout (a capacity of
scalar rows, then a capacity of contacts per elliptic block; :func:`row_capacity`),
enough chunks for every row, and every sum over rows runs over the chunks in use only
(``nact``, traced): a loop whose trip count is the number of chunks holding active rows.
A typical state fills one chunk, a crowded one more, and both run the same program, so
the result never depends on the chunk size and the solver body is compiled once.

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
    where the rows were gathered, else static). ``x``: per-row problem entries, leading
    axis the chunk (``mu`` / ``fr`` tuples per elliptic block, ``idx`` the source
    rows); ``nact`` the chunks in use (traced, at least 1); ``J0`` the Jacobian rows of
    chunk 0 and ``J`` the full Jacobian (the rows of later chunks are gathered when
    visited: no copy of the Jacobian for chunks rarely used)."""
    spec: object
    nchunk: int
    x: dict
    nact: object
    J0: object
    J: object = None


def gather(spec, p, caps):
    """The active rows of problem ``p`` (row structure ``spec``) gathered into the
    chunks of :class:`Rows`, chunk sizes ``caps`` (:func:`row_capacity`)."""
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
    ell, mus, frs = [], [], []
    row = ks
    for (start, n, dim), k, mu, fr in zip(spec.ell, ke, p["mu"], p["fr"]):
        pos, cnt = first_true(act[start:start + n * dim:dim], nchunk * k)
        rows = start + pos[:, None] * dim + np.arange(dim)
        idx.append(jnp.where(pos[:, None] < n, rows, nefc).reshape(nchunk, k * dim))
        mus.append(jnp.take(mu, pos, mode="fill", fill_value=1.0).reshape(nchunk, k))
        frs.append(jnp.take(fr, pos, axis=0, mode="fill",
                            fill_value=1.0).reshape(nchunk, k, dim - 1))
        nact = jnp.maximum(nact, -(-cnt // k))
        ell.append((row, k, dim))
        row += k * dim
    # materialised once: fused into the gathers, the index search would be recomputed
    # for every gathered element
    idx = jax.lax.optimization_barrier(jnp.concatenate(idx, 1))
    take = lambda x, fill: jnp.take(x, idx, axis=0, mode="fill", fill_value=fill)
    xs = {key: take(p[key], fill) for key, fill in _FILL.items()}
    xs.update(mu=tuple(mus), fr=tuple(frs), idx=idx,
              eq=take(jnp.asarray(spec.eq), False), fric=take(jnp.asarray(spec.fric), False),
              ineq=take(jnp.asarray(spec.ineq), True))
    if "rowisl" in p:
        xs["rowisl"] = take(p["rowisl"], spec.nisl)
    cspec = dataclasses.replace(spec, eq=None, fric=None, ineq=None, ell=tuple(ell),
                                nefc=row)
    J0 = jnp.take(p["J"], idx[0], axis=0, mode="fill", fill_value=0.0)
    return Rows(cspec, nchunk, xs, jnp.maximum(nact, 1).astype(jnp.int32), J0, p["J"])


def whole(spec, p):
    """All rows of ``p`` as a single chunk (static masks: no gather)."""
    x = {key: p[key][None] for key in _FILL}
    x.update(mu=tuple(a[None] for a in p["mu"]), fr=tuple(a[None] for a in p["fr"]))
    if "rowisl" in p:
        x["rowisl"] = p["rowisl"][None]
    return Rows(spec, 1, x, jnp.ones((), jnp.int32), p["J"])


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
    J_c, args, acc)`` with ``x_c`` chunk ``c`` of the problem rows, ``e_c`` of
    ``extra`` (leading axis the chunk), ``spec_c`` its row structure and ``J_c`` its
    Jacobian rows (None unless ``jac``). Returns (acc, outs), outs with leading axis
    the chunk (zero past the chunks in use). ``fn`` must close over no traced value:
    pass them in ``args``.

    Chunk 0 runs inline on the Jacobian rows gathered once (``rows.J0``), the others in
    a loop that usually runs no iteration, their Jacobian rows gathered when visited.
    (Every chunk in the loop compiles about 1 s faster on the humanoid but runs the
    solve 2x slower: XLA CPU gathers are slow, and the loop's chunk 0 needs its
    Jacobian rows either gathered on every visit or copied out of a conditional.)"""
    spec = rows.spec
    nchunk = rows.nchunk
    xs = (rows.x, extra)

    def inner(c, xe, a, acc):
        (x, e), (user, jac) = xe, a
        J = None
        if jac is not None:
            J0, J = jac
            if J is None or isinstance(c, int):
                J = J0
            else:
                J = jnp.take(J, x["idx"], axis=0, mode="fill", fill_value=0.0)
        return fn(_chunk_spec(spec, x), x, e, J, user, acc)

    a = (args, (rows.J0, rows.J) if jac else None)
    acc, out0 = inner(0, jax.tree_util.tree_map(lambda v: v[0], xs), a, acc)
    if nchunk == 1:
        return acc, jax.tree_util.tree_map(lambda o: o[None], out0)
    outs = jax.tree_util.tree_map(
        lambda o: jnp.zeros((nchunk,) + o.shape, o.dtype).at[0].set(o), out0)

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
