"""The primal solvers' start (:mod:`simjax.engine.solver`; mj_fwdConstraint's warmstart):
the lower total cost of qacc_warmstart and qacc_smooth, both evaluated in one pass over
the row chunks (:mod:`simjax.engine.solver_rows`), and the chosen point's products the
iterations start from (M qacc0, J qacc0 - aref per chunk and, for a Newton solve of one
iteration, the later chunks' sums of its first pass)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from simjax.engine.math import where
from simjax.engine.solver_cost import _hessian, _quad_weights, update
from simjax.engine.solver_dense import _times_cols
from simjax.engine.solver_gather import Chunked
from simjax.engine.solver_rows import find_chunks, head_chunk, rest_zeros


#: M and chunk 0's J times a vector as one product, of the two stacked once per solve
#: (:func:`stack_mj`): the warm start's two points (4 matrix-vector products -> 2, each a
#: kernel of 25-35 ms of LLVM time); read at trace time (False: two products each, kept to
#: compare). With :data:`~simjax.engine.solver_cost._ONE_JT`, against both off (bench
#: rollouts, batch 1024, float32, paired in one process): kernels ant 634 -> 629, humanoid
#: 725 -> 720, barkour 566 -> 563; XLA compile ant 0.966 [0.935, 1.007] (10 rounds) and
#: 0.962 [0.909, 1.103] (8), humanoid 1.001 [0.860, 1.154] (10) and 0.997 [0.916, 1.018]
#: (8), barkour 1.008 [0.934, 1.031] (8); run, process CPU, ant 0.956 [0.867, 1.103] and
#: 1.011 [0.921, 1.080], humanoid 1.016 [0.964, 1.107] and 1.008 [0.883, 1.200] (12 rounds
#: each), barkour 1.003 [0.822, 1.494] (16): noise. Float64 bench outputs bit-identical (the
#: four bench models). Measured and not done: the passes' M search and J_0 search stacked
#: the same way, a product fewer per copy of the loop body, but XLA compile (ant) 0.999
#: [0.897, 1.057] (8 rounds) and the humanoid's run 1.036 [0.912, 1.122] (14) and 1.053
#: [0.912, 1.382] (12) slower (the stacked (78, 27) product costs 0.21 against 0.20 us per
#: world for the two, batch 1024, float32)
_STACK_MJ = True


def stack_mj(M, rows):
    """M (nv, nv) and chunk 0's Jacobian rows stacked, (nv + rows, nv)."""
    return jnp.concatenate([M, rows.J0], 0)


def stacked_times(MJ0, v):
    """(M v, J_0 v) by one product with ``MJ0`` (:func:`stack_mj`), ``v`` (nv,) or (nv,
    columns) (a column at a time, :func:`~simjax.engine.solver_dense._times_cols`)."""
    nv = v.shape[0]
    prod = MJ0 @ v if v.ndim == 1 else _times_cols(MJ0, v)
    return prod[:nv], prod[nv:]


def _jaref_rest(spec, x, e, sc, J, q, acc):
    return acc, J @ q - x["aref"]


def _jaref(rows, q, Jq0=None):
    """J q - aref of the rows in use, per chunk (``Jq0``: chunk 0's J q, where made)."""
    head = (rows.J0 @ q if Jq0 is None else Jq0) - rows.x0["aref"]
    _, rest, rows = find_chunks(rows, _jaref_rest, (), args=q, jac=True,
                                state=rest_zeros(rows, head), fresh=True)
    return Chunked(head, rest), rows


def _warm_cost(spec, x, J, both, acc, Jb=None):
    """Constraint costs at the two columns of ``both`` added to acc (2,), and the
    rows' J q - aref (rows, 2) (``Jb``: J both, where made)."""
    jb = (_times_cols(J, both) if Jb is None else Jb) - x["aref"][:, None]
    return acc + jax.vmap(lambda jar: update(spec, x, jar, "c")[2], 1)(jb), jb


def _warm_head(spec, x, e, J, args, acc):
    both, Jb = args
    return _warm_cost(spec, x, J, both, acc, Jb)


def _warm_first(spec, x, e, sc, J, both, acc):
    """:func:`_warm_rest` with, at both columns, the sums of a Newton first pass
    (:func:`_update_chunk` with no step): acc (costs (2,), (J' force (nv, 2), Hessian
    terms (nv, 2, nv), :data:`_HAX`), as one (nv, 2 + 2 nv) array where
    :func:`_one_sums`))."""
    cost, sums = acc
    jb = _times_cols(J, both) - x["aref"][:, None]
    if _one_sums(spec):
        c, sums = _quad_sums(spec, x, J, jb, sums)
    else:
        def one(jar, f, H):
            force, state, c = update(spec, x, jar)
            return c, f + J.T @ force, _hessian(spec, x, J, jar, state, H)

        hax = 1 if _HAX else 0
        c, f, H = jax.vmap(one, (1, 1, hax), (0, 1, hax))(jb, *sums)
        sums = (f, H)
    return (cost + c, sums), (sc if isinstance(sc, tuple) else jb)


def _one_sums(spec):
    """Whether :func:`_warm_first`'s sums are one (nv, 2 + 2 nv) array, J' force at
    both points then their Hessian terms (nv, 2, nv), as :func:`_quad_sums` makes them
    (one add per chunk, not two, and one array carried: bench rollouts, batch 1024,
    shadow hand 703 -> 701 kernels, barkour 522 -> 520; float64 outputs
    bit-identical), not (J' force, Hessian terms)."""
    return _ONE_DOT and _HAX and not spec.ell


def _quad_sums(spec, x, J, jb, sums):
    """Costs (2,) at the rows' ``jb`` (rows, 2) and the sums of :func:`_warm_first`
    without cone rows, J' force and J' D_q J at both points added to ``sums`` (nv, 2 +
    2 nv) (:func:`_one_sums`): one product of J' with the forces and weighted rows of
    both points (:data:`_ONE_DOT`)."""
    force, state, c = jax.vmap(lambda jar: update(spec, x, jar), 1, (1, 1, 0))(jb)
    dq = jax.vmap(lambda s: _quad_weights(x, s), 1, 1)(state)          # (rows, 2)
    rows, nv = J.shape
    w = jnp.concatenate([force, (dq[:, :, None] * J[:, None, :]).reshape(rows, 2 * nv)],
                        1)
    return c, sums + J.T @ w                                         # (nv, 2 + 2 nv)


def _warm_pick(cost, sums, start):
    """A world's first-pass start (J' force, M + Hessian terms) of the later chunks
    at the point of lower total cost ``cost`` (2,) (:func:`_warm_first`'s sums
    ``sums``), from ``start`` (zero, M). (Both as one (nv + 1, nv) array, zero where
    no chunk is visited and M added where the factor reads it, written back once:
    shadow hand bench rollout 823 -> 820 kernels, two of them copies, optimised IR
    -0.2%, its run 1.02x slower, 1/0.977 [0.955, 1.028] paired over 6 rounds; float32
    bench rollouts of barkour moved by rounding.)"""
    if not isinstance(sums, tuple):
        nv = sums.shape[0]
        sums = sums[:, :2], sums[:, 2:].reshape(nv, 2, nv)
    f, H = sums
    H0, H1 = (H[:, 0], H[:, 1]) if _HAX else (H[0], H[1])
    pick = cost[0] > cost[1]
    return where(pick, f[:, 1], f[:, 0]), start[1] + where(pick, H1, H0)


def _warm_rest(spec, x, e, sc, J, both, acc):
    """:func:`_warm_cost` on a later chunk; its rows kept unless ``sc`` is () (no
    state: the rows are remade at the chosen point)."""
    acc, jb = _warm_cost(spec, x, J, both, acc)
    return acc, (sc if isinstance(sc, tuple) else jb)


def _primal_start(rows, p, qs, qw, nisl, first=False):
    """((qacc0, M qacc0, J qacc0 - aref per chunk[, first]), rows with the later chunks
    found, J qacc_smooth - aref per chunk or None where it was not kept) the primal
    solvers start from. With
    ``qw`` (warmstart): one choice for all islands (MuJoCo's warmstart precedes the
    island solves), the lower total cost of qacc_warmstart and qacc_smooth, both
    evaluated in one pass; the chosen point's products start the solver (the later
    chunks' rows at both points are kept from that pass: a second loop over the chunks
    to remake them at the chosen point compiled its own gathers). With islands, the
    dofs in no island start at qacc_smooth: no active row's Jacobian touches them
    (:class:`~simjax.engine.solver_islands.Islands`), so the later chunks' J qacc0 -
    aref are those of the chosen point, up to rounding (a loop over the chunks to
    remake them compiled about 25 kernels on the shadow hand). ``first``: the solver's
    first pass is a Newton one known statically (one iteration at most,
    :func:`_primal`): the later chunks' sums of that pass (J' force, Hessian terms)
    are made by this pass over them, at both points, and the chosen point's are
    returned as ``first``: (J' force, M + Hessian terms) of the later chunks, (0, M)
    where there are none (the first pass's own loop over the later chunks compiled
    about 25 kernels on the shadow hand and barkour; the worlds that visit them keep
    the sums at both points only while :func:`~simjax.engine.solver_rows.find_chunks`
    visits them, one world at a time (``_world_loop``), as (worlds, 2, nv, nv) sums
    filled on every call ran barkour's step 3% slower)."""
    M = p["M"]
    MJ0 = stack_mj(M, rows) if _STACK_MJ else None
    if qw is None:
        Mq, Jq0 = stacked_times(MJ0, qs) if _STACK_MJ else (M @ qs, None)
        jaref, rows = _jaref(rows, qs, Jq0)
        return (qs, Mq, jaref), rows, jaref
    both = jnp.stack([qw, qs], 1)                                    # (nv, 2)
    Mb, Jb0 = stacked_times(MJ0, both) if _STACK_MJ else (_times_cols(M, both), None)
    cost, jb = head_chunk(rows, _warm_head, jnp.zeros(2, qs.dtype), args=(both, Jb0),
                          jac=True)
    rest = rest_zeros(rows, jb)
    first = first and rows.nchunk > 1 and _FIRST
    smooth_cost = 0.5 * jnp.sum((Mb - p["qfrc_smooth"][:, None]) * (both - qs[:, None]), 0)
    if first:
        # the total cost known in the loop (the smooth part added first): each world
        # in it keeps the first pass's sums at its chosen point only
        nv = qs.shape[0]
        local = (jax.ShapeDtypeStruct((nv, 2 + 2 * nv), qs.dtype) if _one_sums(rows.spec)
                 else (jax.ShapeDtypeStruct((nv, 2), qs.dtype),
                       jax.ShapeDtypeStruct((nv, 2, nv) if _HAX else (2, nv, nv),
                                            qs.dtype)))
        (cost, extra), rest, rows = find_chunks(
            rows, _warm_first, cost + smooth_cost, args=both, jac=True, state=rest,
            finish=(_warm_pick, local, (jnp.zeros_like(qs), M)), fresh=True)
    else:
        cost, rest, rows = find_chunks(rows, _warm_rest, cost, args=both, jac=True,
                                       state=rest, fresh=True)
        cost = cost + smooth_cost
    pick = cost[0] > cost[1]
    smooth = Chunked(jb[..., 1], jax.tree_util.tree_map(lambda x: x[..., 1], rest))
    qacc0, Ma0, jaref0, rest = jax.tree_util.tree_map(
        lambda x: where(pick, x[..., 1], x[..., 0]), (both, Mb, jb, rest))
    if nisl > 1:
        # dofs in no island start (and stay) at qacc_smooth
        qacc0 = where(p["dofisl"] == nisl, qs, qacc0)
        # chunk 0's rows remade at qacc0 (a product over the chunk, as before: the
        # same bits); the later chunks' (usually none) kept from the warm start's pass
        Mq, Jq0 = (stacked_times(MJ0, qacc0) if _STACK_MJ else
                   (M @ qacc0, rows.J0 @ qacc0))
        head = Jq0 - rows.x0["aref"]
        return ((qacc0, Mq, Chunked(head, rest)) + ((extra,) if first else ()), rows,
                smooth if rows.nchunk == 1 else None)
    return (qacc0, Ma0, Chunked(jaref0, rest)) + ((extra,) if first else ()), rows, smooth


#: the later chunks' first-pass sums made by the warm start's pass (False: by a loop
#: of the first pass, the former way, kept to compare)
_FIRST = True


#: the Hessian terms at both points (:func:`_warm_first`) are kept (nv, 2, nv), as the
#: product of both points' rows makes them, read at trace time (False: (2, nv, nv), a
#: transposing copy fused into every chunk's sum, kept to compare): the shadow hand's
#: costliest kernel of the warm start's loop (a 4-d transpose and an add, 72 ms of LLVM
#: time on an idle machine) becomes a plain add; the same kernels and optimised IR
#: lines; float32 bench rollouts bit-identical
_HAX = True


#: without cone rows, :func:`_warm_first`'s J' force and Hessian terms at both points are
#: one product (:func:`_quad_sums`), read at trace time (False: two, kept to compare):
#: a dot kernel and an add fewer (shadow hand 860 -> 858 kernels, barkour 640 -> 638,
#: with :data:`~simjax.engine.solver_rows._MAJOR`); float32 bench rollouts
#: bit-identical. (The costs summed by that product as well, by a row of ones under
#: J': barkour 3 kernels more, a pad of J among them)
_ONE_DOT = True
