"""Batch-minor evaluation of a function under ``vmap``.

``jax.vmap`` puts the batch (the worlds) on the major axis of every array, and its
batching rules move it to the front where they need to (``dot_general``, ``gather``).
XLA CPU then compiles every kernel as a loop over the worlds whose body works on the
small trailing dimensions (3, 4, 6, 3x3 of one body). With the worlds on the minor
(last) axis instead, every elementwise operation, slice and gather of the program is
an operation on contiguous rows of worlds.

:func:`batch_minor` wraps a function so that, when it is batched (under ``vmap``), its
jaxpr is evaluated here with the batch kept on the last axis of every batched value:
each primitive is applied with its parameters extended by one trailing dimension (a
slice gets a full trailing range, a gather a trailing window dimension, a broadcast a
trailing mapped dimension, ...). ``dot_general`` with one batched operand stays one
matrix product (the batch is a free dimension of it); with both batched it becomes a
broadcast product and a sum. Primitives without a rule here (``custom_vmap`` calls
included) go through ``jax.vmap`` one equation at a time (the batch moved as JAX's
own rule needs it, and back).

The batch is moved to the last axis on entry and back to the front on exit: a layout
change of every input the function reads and every output it computes, per call
(when the call is the body of a loop, XLA keeps the loop state batch-minor and the
changes happen once around the loop).
Batches of a multiple of 64 worlds are padded on the minor axis (see ``_PAD``).

Unbatched calls run the function itself; derivatives (``jax.jvp``/``jax.grad``) use the
function itself too (a ``custom_jvp`` whose rule is the plain function's JVP), so
only undifferentiated batched evaluation takes the batch-minor path.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from simjax.engine import inline

# --------------------------------------------------------------------------- rules
# A rule takes (equation, operand values, their batched flags, batch size) with batched
# values carrying the batch as their last axis, and returns (output(s), batched
# flag(s)), or None to leave the equation to JAX's batching (:func:`_fallback`).
#: primitives applied elementwise to operands of one shape (scalars broadcast)
_ELEMENTWISE = frozenset("""
    add sub mul div rem pow max min neg sign floor ceil round is_finite exp exp2 log
    log1p expm1 tanh logistic sin cos tan asin acos atan atan2 sinh cosh asinh acosh
    atanh sqrt rsqrt cbrt abs integer_pow square convert_element_type select_n clamp
    eq ne lt le gt ge and or not xor nextafter erf erfc erf_inv lgamma digamma copy
    copy_p reduce_precision imag real conj shift_left shift_right_logical
    shift_right_arithmetic population_count clz
""".split())

#: primitives whose parameters name axes of the operand (unchanged by a trailing axis)
_SAME_AXES = frozenset("""
    reduce_sum reduce_max reduce_min reduce_prod reduce_or reduce_and reduce_xor
    argmax argmin cumsum cumprod cummax cummin cumlogsumexp rev squeeze
""".split())


def _full(x, batched, shape, nbatch):
    """``x`` broadcast to ``shape`` + (nbatch,) (batched: its trailing axis is kept;
    size-1 dimensions and scalars are expanded, as lax's elementwise operations do)."""
    target = tuple(shape) + (nbatch,)
    if tuple(np.shape(x)) == target and batched:
        return x
    nd = np.ndim(x) - (1 if batched else 0)
    if nd not in (0, len(shape)):
        raise ValueError(f"operand shapes differ: {np.shape(x)} against {target}")
    dims = tuple(range(nd)) if nd else ()
    return lax.broadcast_in_dim(x, target, dims + ((len(shape),) if batched else ()))


def _elementwise(eqn, vals, flags, nb):
    shape = eqn.outvars[0].aval.shape
    args = [_full(x, b, shape, nb) for x, b in zip(vals, flags)]
    return _bind(eqn, args), True


def _same_axes(eqn, vals, flags, nb):
    return _bind(eqn, vals), True


def _broadcast_in_dim(eqn, vals, flags, nb):
    p = dict(eqn.params)
    shape = tuple(p["shape"])
    out = lax.broadcast_in_dim(vals[0], shape + (nb,),
                               tuple(p["broadcast_dimensions"]) + (len(shape),))
    return out, True


def _reshape(eqn, vals, flags, nb):
    p = eqn.params
    if p.get("dimensions") is not None:
        return None
    return lax.reshape(vals[0], tuple(p["new_sizes"]) + (nb,)), True


def _transpose(eqn, vals, flags, nb):
    perm = tuple(eqn.params["permutation"])
    return lax.transpose(vals[0], perm + (len(perm),)), True


def _slice(eqn, vals, flags, nb):
    p = eqn.params
    strides = p["strides"]
    return lax.slice(vals[0], tuple(p["start_indices"]) + (0,),
                     tuple(p["limit_indices"]) + (nb,),
                     None if strides is None else tuple(strides) + (1,)), True


def _concat_like(eqn, vals, flags, nb):
    args = [_full(x, b, eqn.invars[i].aval.shape, nb)
            for i, (x, b) in enumerate(zip(vals, flags))]
    return _bind(eqn, args), True


def _pad(eqn, vals, flags, nb):
    if flags[1]:
        return None
    cfg = tuple(eqn.params["padding_config"]) + ((0, 0, 0),)
    return lax.pad(vals[0], vals[1], cfg), True


def _dot_general(eqn, vals, flags, nb):
    """One operand batched: the batch is one more free dimension of the same product
    (a matrix product over all worlds at once, which also ends XLA's fusion of the
    operand's expression). Both batched: a broadcast product and a sum over the
    contracted axes, the batch last (vector code over the worlds; XLA's batched
    product of many tiny matrices is a loop of library calls)."""
    (lc, rc), (lbd, rbd) = eqn.params["dimension_numbers"]
    lhs, rhs = vals
    la, ra = eqn.invars[0].aval, eqn.invars[1].aval
    if (_DOT_FREE_AS_BATCH and flags[1] and not flags[0] and not lbd
            and rhs.ndim - 1 - len(rc) > 0):
        return _dot_free_as_batch(eqn, lhs, rhs, nb), True
    if not (flags[0] and flags[1]):
        # the batch comes out last when it is the right operand's, else it is moved
        # there (a multiply-and-sum here would fuse the operand's whole expression
        # into the sum and evaluate it once per term: 27x slower for the humanoid)
        out = _bind(eqn, [lhs, rhs])
        if flags[0]:
            nfree = len([i for i in range(ra.ndim) if i not in rc and i not in rbd])
            if nfree:
                nd = out.ndim
                b = nd - 1 - nfree
                out = lax.transpose(out, tuple(i for i in range(nd) if i != b) + (b,))
        return out, True
    lf = [i for i in range(la.ndim) if i not in lc and i not in lbd]
    rf = [i for i in range(ra.ndim) if i not in rc and i not in rbd]
    nbd, nlf, nrf, nc = len(lbd), len(lf), len(rf), len(lc)
    shape = ([la.shape[i] for i in lbd] + [la.shape[i] for i in lf] +
             [ra.shape[i] for i in rf] + [la.shape[i] for i in lc])
    full = tuple(shape) + (nb,)
    dtype = eqn.outvars[0].aval.dtype

    def place(x, batched, order, positions):
        perm = tuple(order) + ((len(order),) if batched else ())
        x = lax.transpose(x, perm) if perm != tuple(range(len(perm))) else x
        dims = tuple(positions) + ((len(shape),) if batched else ())
        return lax.broadcast_in_dim(x.astype(dtype), full, dims)

    pos_b = list(range(nbd))
    pos_lf = list(range(nbd, nbd + nlf))
    pos_rf = list(range(nbd + nlf, nbd + nlf + nrf))
    pos_c = list(range(nbd + nlf + nrf, nbd + nlf + nrf + nc))
    x = place(lhs, flags[0], list(lbd) + lf + list(lc), pos_b + pos_lf + pos_c)
    y = place(rhs, flags[1], list(rbd) + rf + list(rc), pos_b + pos_rf + pos_c)
    prod = x * y
    out = jnp.sum(prod, axis=tuple(pos_c)) if nc else prod
    return out, True


def _dot_free_as_batch(eqn, lhs, rhs, nb):
    """An unbatched ``lhs`` times a batched ``rhs`` with free dimensions of its own
    (e.g. a constant tree matrix times (nbody, 6) vectors): those free dimensions
    become a batch dimension of the product, so that the kernel making ``rhs`` writes
    it in its own shape. As one free dimension with the worlds, XLA flattens them
    together for the matrix product and emits rhs's kernel over the flattened shape,
    an operand choice per entry of a concatenation (scalar code)."""
    (lc, rc), _ = eqn.params["dimension_numbers"]
    la = eqn.invars[0].aval
    rf = [i for i in range(rhs.ndim - 1) if i not in rc]
    lf = [i for i in range(la.ndim) if i not in lc]
    fshape = [rhs.shape[i] for i in rf]
    nf = int(np.prod(fshape))
    # rhs as (free, contracted..., worlds); lhs repeated over the free entries
    x = lax.transpose(rhs, tuple(rf) + tuple(rc) + (rhs.ndim - 1,))
    x = lax.reshape(x, (nf,) + tuple(rhs.shape[i] for i in rc) + (nb,))
    y = lax.broadcast_in_dim(lhs, (nf,) + tuple(la.shape), tuple(range(1, la.ndim + 1)))
    nc = len(rc)
    dims = (((tuple(i + 1 for i in lc)), tuple(range(1, nc + 1))), ((0,), (0,)))
    dtype = eqn.outvars[0].aval.dtype
    out = lax.dot_general(y, x, dims, preferred_element_type=dtype)   # (nf, lf..., nb)
    out = lax.reshape(out, tuple(fshape) + tuple(la.shape[i] for i in lf) + (nb,))
    nrf, nlf = len(fshape), len(lf)
    perm = tuple(range(nrf, nrf + nlf)) + tuple(range(nrf)) + (nrf + nlf,)
    return lax.transpose(out, perm).astype(dtype)


def _gather(eqn, vals, flags, nb):
    if flags[1]:
        return None
    p = dict(eqn.params)
    dn = p["dimension_numbers"]
    out_nd = eqn.outvars[0].aval.ndim
    p["dimension_numbers"] = dn._replace(offset_dims=tuple(dn.offset_dims) + (out_nd,))
    p["slice_sizes"] = tuple(p["slice_sizes"]) + (nb,)
    return eqn.primitive.bind(vals[0], vals[1], **p), True


def _scatter(eqn, vals, flags, nb):
    if flags[1]:
        return None
    p = dict(eqn.params)
    dn = p["dimension_numbers"]
    upd_nd = eqn.invars[2].aval.ndim
    p["dimension_numbers"] = dn._replace(
        update_window_dims=tuple(dn.update_window_dims) + (upd_nd,))
    operand = _full(vals[0], flags[0], eqn.invars[0].aval.shape, nb)
    updates = _full(vals[2], flags[2], eqn.invars[2].aval.shape, nb)
    return eqn.primitive.bind(operand, vals[1], updates, **p), True


def _dynamic_slice(eqn, vals, flags, nb):
    if any(flags[1:]):
        return None
    idx = vals[1:]
    zero = jnp.zeros((), idx[0].dtype if idx else np.int32)
    sizes = tuple(eqn.params["slice_sizes"]) + (nb,)
    return lax.dynamic_slice(vals[0], list(idx) + [zero], sizes), True


def _dynamic_update_slice(eqn, vals, flags, nb):
    if any(flags[2:]):
        return None
    operand = _full(vals[0], flags[0], eqn.invars[0].aval.shape, nb)
    update = _full(vals[1], flags[1], eqn.invars[1].aval.shape, nb)
    idx = vals[2:]
    zero = jnp.zeros((), idx[0].dtype if idx else np.int32)
    return lax.dynamic_update_slice(operand, update, list(idx) + [zero]), True


def _split(eqn, vals, flags, nb):
    return list(_bind(eqn, vals)), [True] * len(eqn.outvars)


def _inline(key):
    def rule(eqn, vals, flags, nb):
        closed = eqn.params[key]
        if isinstance(closed, jcore.ClosedJaxpr):
            jaxpr, consts = closed.jaxpr, closed.consts
        else:
            jaxpr, consts = closed, ()
        return _eval(jaxpr, consts, vals, flags, nb)
    return rule


def _scan(eqn, vals, flags, nb):
    """``lax.scan`` with the body evaluated here: scanned and stacked arrays keep the
    batch last (the scan axis is their first). Outputs stacked per iteration are all
    made batched; which carries are batched is found by evaluating the body's flags
    to a fixed point (skipped when every carry is batched, as a batched Data is)."""
    p = eqn.params
    closed = p["jaxpr"]
    nconst, ncarry = _scan_counts(p)
    flags = list(flags)
    consts, init, xs = vals[:nconst], vals[nconst:nconst + ncarry], vals[nconst + ncarry:]
    cf, xf = flags[:nconst], flags[nconst + ncarry:]
    carry_f = flags[nconst:nconst + ncarry]
    carry_avals = [v.aval for v in eqn.invars[nconst:nconst + ncarry]]
    x_avals = [jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for v in xs]
    while not all(carry_f):
        probe = []

        def body_flags(c, x, carry_f=carry_f):
            probe[:] = _eval(closed.jaxpr, closed.consts, list(consts) + list(c) + list(x),
                             cf + carry_f + xf, nb)[1]
            return 0
        jax.eval_shape(body_flags, [_batched_aval(a, b, nb)
                                    for a, b in zip(carry_avals, carry_f)], x_avals)
        new = [a or b for a, b in zip(carry_f, probe[:ncarry])]
        if new == carry_f:
            break
        carry_f = new
    init = [_full(v, b, a.shape, nb) if f and not b else v
            for v, b, f, a in zip(init, flags[nconst:nconst + ncarry], carry_f, carry_avals)]
    out_avals = [v.aval for v in closed.jaxpr.outvars]

    def body(c, x):
        outs, of = _eval(closed.jaxpr, closed.consts, list(consts) + list(c) + list(x),
                         cf + carry_f + xf, nb)
        want = carry_f + [True] * (len(outs) - ncarry)
        return _split_carry([_full(o, b, a.shape, nb) if w and not b else o
                             for o, b, w, a in zip(outs, of, want, out_avals)], ncarry)

    carry, ys = lax.scan(body, init, xs, length=p["length"], reverse=p["reverse"],
                         unroll=p["unroll"])
    return list(carry) + list(ys), carry_f + [True] * len(ys)


def _scan_counts(p):
    """(constants, carries) of a scan equation's operands: jax up to 0.10 names them in
    ``num_consts`` / ``num_carry``; from 0.11 the operands' grouping is a flat tree
    ``ft_in`` of (constants, carries, scanned)."""
    if "num_consts" in p:
        return p["num_consts"], p["num_carry"]
    consts, carries, _ = p["ft_in"].unpack()
    return len(consts), len(carries)


def _split_carry(outs, ncarry):
    return outs[:ncarry], outs[ncarry:]


def _batched_aval(a, b, nb):
    return jax.ShapeDtypeStruct(tuple(a.shape) + ((nb,) if b else ()), a.dtype)


_RULES = {
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "transpose": _transpose,
    "slice": _slice,
    "concatenate": _concat_like,
    "stack": _concat_like,
    "pad": _pad,
    "dot_general": _dot_general,
    "gather": _gather,
    "scatter": _scatter,
    "scatter-add": _scatter,
    "scatter_add": _scatter,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "split": _split,
    "pjit": _inline("jaxpr"),
    "jit": _inline("jaxpr"),
    "closed_call": _inline("call_jaxpr"),
    "custom_jvp_call": _inline("call_jaxpr"),
    "custom_vjp_call": _inline("call_jaxpr"),
    "checkpoint": _inline("jaxpr"),
    "remat": _inline("jaxpr"),
    "scan": _scan,
}
for _name in _ELEMENTWISE:
    _RULES[_name] = _elementwise
for _name in _SAME_AXES:
    _RULES[_name] = _same_axes


# --------------------------------------------------------------------------- evaluation
def _bind(eqn, args):
    return eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(eqn.params))


def _fallback(eqn, vals, flags, nb):
    """JAX's own batching of one equation, the batch moved to the last axis after."""
    def one(*args):
        out = _bind(eqn, args)
        return list(out) if eqn.primitive.multiple_results else out
    axes = [-1 if b else None for b in flags]
    out = jax.vmap(one, in_axes=axes, out_axes=-1, axis_size=nb)(*vals)
    if eqn.primitive.multiple_results:
        return out, [True] * len(out)
    return out, True


#: check every rule's output shape (tests)
_CHECK = False


def _check(eqn, out, ofl, nb):
    """Raise if a rule's outputs are not the equation's shapes (+ the batch) and dtypes."""
    outs = out if eqn.primitive.multiple_results else [out]
    fls = ofl if eqn.primitive.multiple_results else [ofl]
    for v, x, b in zip(eqn.outvars, outs, fls):
        want = tuple(v.aval.shape) + ((nb,) if b else ())
        if tuple(x.shape) != want or x.dtype != v.aval.dtype:
            raise AssertionError(f"{eqn.primitive.name}: {x.shape} {x.dtype}, expected "
                                 f"{want} {v.aval.dtype}\n{eqn}")


def _eval(jaxpr, consts, args, flags, nb):
    """Evaluate ``jaxpr`` on ``args`` (batched ones with the batch last, size ``nb``):
    (outputs, their batched flags)."""
    env = {}

    def read(v):
        if isinstance(v, jcore.Literal):
            return v.val, False
        return env[v]

    def write(v, x, b):
        if not isinstance(v, jcore.DropVar):
            env[v] = (x, b)

    for v, c in zip(jaxpr.constvars, consts):
        write(v, c, False)
    for v, x, b in zip(jaxpr.invars, args, flags):
        if _CHECK and tuple(np.shape(x)) != tuple(v.aval.shape) + ((nb,) if b else ()):
            raise AssertionError(f"input {v}: {x.shape} {b}")
        write(v, x, b)
    for eqn in jaxpr.eqns:
        vals, fl = zip(*map(read, eqn.invars)) if eqn.invars else ((), ())
        if not any(fl):
            out, ofl = _bind(eqn, vals), False
            if eqn.primitive.multiple_results:
                ofl = [False] * len(out)
        else:
            rule = _RULES.get(eqn.primitive.name)
            res = rule(eqn, list(vals), list(fl), nb) if rule is not None else None
            out, ofl = res if res is not None else _fallback(eqn, vals, fl, nb)
            if _CHECK:
                _check(eqn, out, ofl, nb)
        if eqn.primitive.multiple_results:
            for v, x, b in zip(eqn.outvars, out, ofl):
                write(v, x, b)
        else:
            write(eqn.outvars[0], out, ofl)
    outs = [read(v) for v in jaxpr.outvars]
    return [o[0] for o in outs], [o[1] for o in outs]


#: extra worlds (zeros) on the minor axis of a batch that is a multiple of 64: rows
#: of a power-of-two length alias in the cache
_PAD = 8


def batch_minor(fn):
    """``fn`` (pytrees of arrays in and out) evaluated batch-minor under ``vmap``.

    Same results as ``fn`` up to floating-point rounding (products are summed in
    another order); unbatched calls evaluate ``fn``'s jaxpr (the one the batching rule
    evaluates batch-minor), differentiated calls run ``fn`` itself.
    """
    traced = {}

    def trace(tree, avals):
        """``fn``'s jaxpr and output shapes at one world's ``avals``, traced once:
        the unbatched call (traced when a loop body is, before vmap batches it) and
        the batching rule share it, where each ran ``fn``'s Python. Bench rollouts
        (batch 1024, float32, fresh processes, 6 pairs, load 10): trace CPU the RK4
        pendulum 0.63x (0.51-0.82; 0.66 -> 0.43 s), ant-smooth 0.68x (0.47-0.85);
        lowering unchanged; the program the same up to the order of the loop's
        constant operands; outputs bit-identical (float32, float64)."""
        key = (tree, tuple((a.shape, a.dtype) for a in avals))
        hit = traced.get(key)
        if hit is None:
            hit = jax.make_jaxpr(
                lambda *leaves: fn(*jax.tree_util.tree_unflatten(tree, leaves)),
                return_shape=True)(*avals)
            # a jaxpr holding tracers (fn closing over a traced model) is not kept
            if not any(isinstance(c, jax.core.Tracer) for c in hit[0].consts):
                traced[key] = hit
        return hit

    @jax.custom_batching.custom_vmap
    def call(*args):
        flat, tree = jax.tree_util.tree_flatten(args)
        closed, out_shape = trace(
            tree, [jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in flat])
        out = inline._replay(closed.jaxpr, closed.consts, flat)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), out)

    @call.def_vmap
    def _rule(axis_size, in_batched, *args):
        flat, tree = jax.tree_util.tree_flatten(args)
        flags = jax.tree_util.tree_leaves(in_batched)
        avals = [jax.ShapeDtypeStruct(x.shape[1:] if b else x.shape, x.dtype)
                 for x, b in zip(flat, flags)]
        closed, out_shape = trace(tree, avals)
        # a batch of a multiple of 64 worlds gets _PAD worlds of zeros appended: rows
        # of a power-of-two length alias in the cache (the transposes back to the
        # major axis: 4x slower for the humanoid's 27x27 qM). Zeros, not copies of
        # worlds: a lax.pad fuses with the transpose, where a concatenation with a
        # slice of the input was a kernel per input of its own, plus a copy (the
        # bench's 4-step rollouts: the RK4 pendulum 0.81x the XLA compile and 0.91x
        # the run time, the ant 0.81x the compile, run time unchanged). What the
        # step makes of a zero state is never read (no operation mixes worlds).
        pad = _PAD if axis_size % 64 == 0 and axis_size >= _PAD else 0

        def into(x):
            x = jnp.moveaxis(x, 0, -1)
            return lax.pad(x, np.zeros((), x.dtype),
                           ((0, 0, 0),) * (x.ndim - 1) + ((0, pad, 0),)) if pad else x
        moved = [into(x) if b else x for x, b in zip(flat, flags)]
        outs, ofl = _eval(closed.jaxpr, closed.consts, moved, flags, axis_size + pad)
        outs = [jnp.moveaxis(x[..., :axis_size] if pad else x, -1, 0) if b else x
                for x, b in zip(outs, ofl)]
        # outputs that are inputs unchanged are handed back as they came
        where = {v: i for i, v in enumerate(closed.jaxpr.invars)}
        for k, v in enumerate(closed.jaxpr.outvars):
            if isinstance(v, jcore.Var) and v in where:
                outs[k], ofl[k] = flat[where[v]], flags[where[v]]
        out_tree = jax.tree_util.tree_structure(out_shape)
        return (jax.tree_util.tree_unflatten(out_tree, outs),
                jax.tree_util.tree_unflatten(out_tree, ofl))

    wrapped = jax.custom_jvp(call)

    @wrapped.defjvp
    def _jvp(primals, tangents):
        return jax.jvp(fn, primals, tangents)

    return functools.wraps(fn)(wrapped)


#: whether a constant times batched vectors makes their free dimensions a batch
#: dimension of the product (read at trace time)
_DOT_FREE_AS_BATCH = True
