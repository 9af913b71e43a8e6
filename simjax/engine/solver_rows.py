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
    where the rows were gathered, else static). Per-chunk values are (head, tail)
    pairs: the head chunk 0 (always in use), the tail the other chunks (leading axis,
    None with one chunk): ``x`` the per-row problem entries (``mu`` / ``fr`` tuples per
    elliptic block, ``idx`` the source rows); ``nact`` the chunks in use (traced);
    ``J0`` the Jacobian rows of chunk 0 and ``J`` the full Jacobian (the rows of later
    chunks are gathered when visited: no copy of the Jacobian for chunks rarely used)."""
    spec: object
    nchunk: int
    x: tuple
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
    x = jax.tree_util.tree_map(lambda a: a[0], xs), jax.tree_util.tree_map(lambda a: a[1:], xs)
    if nchunk == 1:
        x = x[0], None
    return Rows(cspec, nchunk, x, jnp.maximum(nact, 1).astype(jnp.int32), J0, p["J"])


def whole(spec, p):
    """All rows of ``p`` as a single chunk (static masks: no gather)."""
    x = {key: p[key] for key in _FILL}
    x.update(mu=p["mu"], fr=p["fr"])
    if "rowisl" in p:
        x["rowisl"] = p["rowisl"]
    return Rows(spec, 1, (x, None), jnp.ones((), jnp.int32), p["J"])


def _chunk_spec(spec, x):
    if "eq" in x:
        spec = dataclasses.replace(spec, eq=x["eq"], fric=x["fric"], ineq=x["ineq"])
    return spec


# --------------------------------------------------------------------------- loops
def _index(tree, c, axis):
    return jax.tree_util.tree_map(
        lambda a, ax: jax.lax.dynamic_index_in_dim(a, c, ax, keepdims=False), tree, axis)


def _loop(fn, nchunk, n, xs, args, acc, batch=None):
    """acc, outs = fold of fn(c, x_c, args, acc) -> (acc, out_c) over the chunks
    c < n of xs (leading axis nchunk); ``batch``: None, or (size, batched flags of xs,
    args, acc) inside the vmap rule (fn then runs vmapped, with an unbatched counter)."""
    if batch is None:
        g, xaxis = fn, jax.tree_util.tree_map(lambda _: 0, xs)
    else:
        size, xb, ab, accb = batch
        ax = lambda b: jax.tree_util.tree_map(lambda f: 0 if f else None, b)
        g = jax.vmap(fn, in_axes=(None, ax(xb), ax(ab), 0))
        xaxis = jax.tree_util.tree_map(lambda f: 1 if f else 0, xb)
        acc = jax.tree_util.tree_map(
            lambda a, f: a if f else jnp.broadcast_to(a, (size,) + a.shape), acc, accb)
    x0 = _index(xs, jnp.zeros((), jnp.int32), xaxis)
    _, out0 = jax.eval_shape(g, jnp.zeros((), jnp.int32), x0, args, acc)
    cax = 0 if batch is None else 1
    outs = jax.tree_util.tree_map(
        lambda o: jnp.zeros(o.shape[:cax] + (nchunk,) + o.shape[cax:], o.dtype), out0)

    def body(s):
        c, acc, outs = s
        acc, out = g(c, _index(xs, c, xaxis), args, acc)
        outs = jax.tree_util.tree_map(
            lambda b, o: jax.lax.dynamic_update_index_in_dim(b, o, c, cax), outs, out)
        return c + 1, acc, outs

    _, acc, outs = jax.lax.while_loop(lambda s: s[0] < n, body,
                                      (jnp.zeros((), jnp.int32), acc, outs))
    return acc, outs


def over_chunks(rows, fn, acc, extra=((), None), args=(), jac=False):
    """Fold over the chunks in use: ``acc, out_c = fn(spec_c, x_c, e_c, J_c, args,
    acc)`` for chunk 0, then for the other chunks in use (a loop, usually of no
    iteration), with ``x_c`` chunk ``c`` of the problem rows, ``e_c`` of ``extra``
    ((head, tail) as :class:`Rows`), ``spec_c`` its row structure and ``J_c`` its
    Jacobian rows (None unless ``jac``). Returns (acc, (out head, out tail)), the tail
    zero past the chunks in use. ``fn`` must close over no traced value: pass them in
    ``args``."""
    spec = rows.spec
    x0, xt = rows.x
    e0, et = extra
    acc, out0 = fn(_chunk_spec(spec, x0), x0, e0, rows.J0 if jac else None, args, acc)
    if rows.nchunk == 1:
        return acc, (out0, None)

    def inner(c, xe, a, acc):
        (x, e), (user, J) = xe, a
        if J is not None:
            J = jnp.take(J, x["idx"], axis=0, mode="fill", fill_value=0.0)
        return fn(_chunk_spec(spec, x), x, e, J, user, acc)

    nt = rows.nchunk - 1

    @jax.custom_batching.custom_vmap
    def run(n, xs, a, acc):
        return _loop(inner, nt, n, xs, a, acc)

    @run.def_vmap
    def _rule(size, flags, n, xs, a, acc):
        nb, xb, ab, accb = flags
        out = _loop(inner, nt, jnp.max(n) if nb else n, xs, a, acc,
                    batch=(size, xb, ab, accb))
        return out, jax.tree_util.tree_map(lambda _: True, out)

    acc, outt = run(rows.nact - 1, (xt, et), (args, rows.J if jac else None), acc)
    return acc, (out0, outt)
