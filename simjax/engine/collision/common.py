"""Small vector helpers shared by the colliders.

Every collider works on one geom pair (vmapped by the driver) and returns a
:class:`Pre` of ``nslot`` candidate contacts (mjPreContact: dist, pos, normal, tangent)
with a ``valid`` mask. Helpers here are safe to differentiate: square roots and
normalisations never see an exact zero on the branch that is not taken.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simjax.engine.math import fill, ops, unstack, where

#: mjMINVAL
MINVAL = 1e-15


class Pre(NamedTuple):
    """Candidate contacts of one geom pair (leading axis: slot)."""
    dist: jnp.ndarray      # (k,)
    pos: jnp.ndarray       # (k, 3)
    normal: jnp.ndarray    # (k, 3) from geom1 to geom2
    tangent: jnp.ndarray   # (k, 3) first tangent, or zeros (mju_makeFrame picks one)
    valid: jnp.ndarray     # (k,) bool


def stack(pres):
    """Concatenate Pre tuples along the slot axis."""
    return Pre(*(jnp.concatenate([getattr(p, f) for p in pres], axis=0)
                 for f in Pre._fields))


def one(dist, pos, normal, valid, tangent=None):
    """A single-slot Pre."""
    tangent = jnp.zeros_like(pos) if tangent is None else tangent
    return Pre(dist[None], pos[None], normal[None], tangent[None], jnp.asarray(valid)[None])


def dot(a, b):
    """Dot product over the last axis (3-vectors), written out: vmapped, a reduction
    over a minor axis of 3 is a separate slow kernel on CPU, the written-out sum fuses
    with its neighbours."""
    m, add, _ = ops(a, b)
    p = m(a, b)
    if p.shape[-1] != 3:
        return jnp.sum(p, axis=-1)
    x, y, z = jnp.split(p, 3, axis=-1)
    return add(add(x, y), z)[..., 0]


def cross(a, b):
    """Cross product of 3-vectors (last axis), written out (fuses, see :func:`dot`)."""
    ax, ay, az = jnp.split(a, 3, axis=-1)
    bx, by, bz = jnp.split(b, 3, axis=-1)
    m, _, s = ops(a, b)
    return jnp.concatenate([s(m(ay, bz), m(az, by)), s(m(az, bx), m(ax, bz)),
                            s(m(ax, by), m(ay, bx))], axis=-1)


def rot(mat, v):
    """``mat @ v`` for a 3x3 matrix and vectors v (..., 3) (rows: ``v @ mat.T``),
    written out: vmapped, small matrix products are slow batched kernels on CPU."""
    x, y, z = jnp.split(v, 3, axis=-1)
    c0, c1, c2 = unstack(mat, 1)            # one split (see pick3)
    return x * c0 + y * c1 + z * c2


def rot_t(mat, v):
    """``mat.T @ v`` for a 3x3 matrix and vectors v (..., 3) (rows: ``v @ mat``),
    written out (see :func:`rot`)."""
    x, y, z = jnp.split(v, 3, axis=-1)
    r0, r1, r2 = unstack(mat, 0)
    return x * r0 + y * r1 + z * r2


#: :func:`once` of several values of one shape as one reduction with an output per
#: value (:func:`reduce_shared`; off: packed in a concatenation, the former way).
#: Shadow hand, with box_box's scalars stored this way and _CC_ONCE, off / on: XLA
#: compile CPU 1.040 [0.828, 1.151], 6 rounds; 4 kernels fewer; box_box alone (1024 x
#: 40 pairs) run on / off 0.866 [0.842, 0.933], capsule_box 0.825 [0.590, 1.023]; bench
#: step off / on 0.985 [0.812, 1.061] (10 rounds, load 10)
SHARED_ONCE = True


def _max_each(a, b):
    return tuple(lax.max(x, y) for x, y in zip(a, b))


def _lowest(dtype):
    if dtype == jnp.bool_:
        return np.bool_(False)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.iinfo(dtype).min
    return -np.inf


@jax.custom_jvp
def reduce_shared(*parts):
    """``parts`` (arrays of one shape, any dtypes) as the outputs of one reduction: each
    part's maximum with its dtype's lowest value over a new leading axis of two, so
    exactly the part. On CPU, XLA fuses a whole expression DAG into its consumer, and a
    concatenation (or several kernels) of parts evaluates the DAG again per operand (in
    a branch of its own); one reduction evaluates it once per element for all parts."""
    cfg = [(0, 1, 0)] + [(0, 0, 0)] * parts[0].ndim
    # NumPy scalars (literals of the traced program, as jnp.asarray's converts become)
    # and lax's expand_dims: the same equations, without a traced convert per part and
    # jnp's indexing (the bench rollouts trace 17-86 equations fewer, the same program)
    inits = tuple(np.asarray(_lowest(p.dtype), p.dtype) for p in parts)
    xs = tuple(lax.pad(lax.expand_dims(p, (0,)), v, cfg) for p, v in zip(parts, inits))
    return tuple(lax.reduce(xs, inits, _max_each, (0,)))


@reduce_shared.defjvp
def _reduce_shared_jvp(primals, tangents):
    # the identity's (jax's rule for a reduction of several operands cannot take
    # symbolic zero tangents)
    return reduce_shared(*primals), tuple(tangents)


def once(*xs):
    """``xs``, computed once: XLA on CPU fuses cheap elementwise producers into every
    consumer kernel, so a long chain of selects with many consumers is recomputed in
    each (hundreds of duplicated ops, each costing compile time). A reduction is a
    fusion root whose result is stored: the maximum of the values and -inf over a new
    axis of two is one small kernel that ends the chains there, and exactly the values
    (-0.0 and nan included; an optimization_barrier would not do: XLA on CPU strips it).
    Several values of one shape go through one reduction with an output per value
    (:func:`reduce_shared`: what they share is evaluated once, where a concatenation
    evaluated it per value); of several shapes, packed side by side in the dtype of the
    first float among them (ints and bools exactly, as small whole numbers). Returns
    one value for one argument, else a tuple."""
    xs = [jnp.asarray(x) for x in xs]
    if len(xs) > 1 and SHARED_ONCE and len({x.shape for x in xs}) == 1:
        return reduce_shared(*xs)
    fdt = next((x.dtype for x in xs if jnp.issubdtype(x.dtype, jnp.floating)), jnp.float32)
    flat = [x.astype(fdt).reshape(-1) for x in xs]
    while len(flat) > 1:        # a concatenate of more than 8 operands fuses none of them
        flat = [jnp.concatenate(flat[k:k + 8]) for k in range(0, len(flat), 8)]
    flat = flat[0]
    flat = jnp.max(jnp.stack([flat, jnp.full_like(flat, -jnp.inf)]), axis=0)
    out, k = [], 0
    for x in xs:
        v = flat[k:k + x.size].reshape(x.shape)
        k += x.size
        out.append(v > 0.5 if x.dtype == jnp.bool_ else v.astype(x.dtype))
    return out[0] if len(out) == 1 else tuple(out)


def _scalar(x):
    return isinstance(x, (bool, int, float))


def sel(c, a, b):
    """``jnp.where(c, a, b)``, as one ``lax.select`` where ``c`` is a bool array and ``a``,
    ``b`` arrays of its shape and one dtype (or a Python scalar and such an array):
    jnp.where traces as a jit of its own with converts and broadcasts, several traced
    equations where one does (trace and lowering cost per equation); a Python scalar's
    fill by :func:`simjax.engine.math.fill` (one per trace, shape and value). Else
    jnp.where."""
    if isinstance(c, jax.Array) and c.dtype == jnp.bool_:
        if _scalar(a) and type(a) is type(b):
            # two Python scalars: their fills as jnp.where makes them (weakly typed, of
            # the default dtype of their kind), without its jit wrapper equation
            return lax.select(c, fill(c.shape, a), fill(c.shape, b))
        if _scalar(a) and isinstance(b, jax.Array) and jnp.result_type(a, b) == b.dtype:
            a = fill(b.shape, a, like=b)
        elif _scalar(b) and isinstance(a, jax.Array) and jnp.result_type(a, b) == a.dtype:
            b = fill(a.shape, b, like=a)
        if (isinstance(a, jax.Array) and isinstance(b, jax.Array) and a.dtype == b.dtype
                and a.shape == b.shape == c.shape):
            return lax.select(c, a, b)
    return where(c, a, b)


def pick3(v, i):
    """``v[i]`` of a 3-vector (or (3, ...) array), or of a list of three scalars, for a
    traced index ``i`` in 0..2 (outside: v[0] below, v[2] above), by selects (a vmapped
    gather is a separate slow kernel on CPU): one ``lax.select_n`` where the three are
    arrays of one shape and dtype. (Rows of an array by slices: a split into three
    was a kernel of its own in capsule-box.)"""
    i = jnp.asarray(i)
    # an array's rows by one split (math.unstack), not a slice and a squeeze each
    xs = list(unstack(v, 0, 3)) if isinstance(v, jax.Array) else [v[0], v[1], v[2]]
    if (jnp.issubdtype(i.dtype, jnp.integer) and i.shape == ()
            and all(isinstance(x, jax.Array) for x in xs)
            and len({(x.shape, x.dtype) for x in xs}) == 1):
        return lax.select_n(i.astype(jnp.int32), *xs)
    return where(i == 0, xs[0], where(i == 1, xs[1], xs[2]))


#: last-axis length up to which :func:`argmin` / :func:`argmax` use XLA's (value, index)
#: reduction: short, its scalar loop is cheaper than the stored copy and two reductions
SHORT_ARG = 16


def _first(x, best, among=None):
    """Index of the first entry of ``x`` (last axis) equal to ``best`` (its minimum or
    maximum, kept dims) or NaN, among the entries where ``among`` (a mask like ``x``;
    None: all): jnp.argmin / jnp.argmax exactly (a NaN counts as the extreme), as two
    plain reductions, provided both read the same values: ``x`` must be
    stored (:func:`once`, a reduction's output, an argument), not an expression that
    XLA would fuse into both reductions and compute twice (the two kernels may round
    differently, e.g. one contracts a multiply-add and the other not; then no entry
    equals ``best``). XLA on CPU runs the (value, index) pair reduction of argmin over
    a minor axis as a scalar loop, several times slower on long axes."""
    n = x.shape[-1]
    hit = (x == best) | (x != x)
    if among is not None:
        hit = hit & among
    iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    i = jnp.min(lax.select(hit, iota, lax.full_like(iota, n)), axis=-1)
    return jnp.minimum(i, n - 1)


def _stored(x, reduce):
    """``x``, stored by a reduction over a new axis of two whose reducer is not
    ``reduce`` (:func:`once` reduces by max): XLA folds a reduction of a reduction with
    the same reducer into one, which then reads ``x`` recomputed in its own kernel, not
    the stored values (argmax's maximum was so folded: at XLA's backend optimisation
    level 0 the two kernels rounded a float32 product differently, no entry equalled
    the maximum, and the mesh collider's farthest-point pick read a padding slot)."""
    if reduce is jnp.max:
        return jnp.min(jnp.stack([x, jnp.full_like(x, jnp.inf)]), axis=0)
    return once(x)


def _arg(x, reduce, pair):
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.shape[-1] <= SHORT_ARG:
        return pair(x, axis=-1)
    x = _stored(x, reduce)
    return _first(x, reduce(x, axis=-1, keepdims=True))


def argmin(x):
    """``jnp.argmin(x, axis=-1)`` (first minimum; NaN first), exactly whatever XLA
    fuses; on long float axes faster on CPU: ``x`` stored once, then two plain
    reductions (:func:`_first`)."""
    return _arg(x, jnp.min, jnp.argmin)


def argmax(x):
    """``jnp.argmax(x, axis=-1)`` (first maximum; NaN first), as :func:`argmin`."""
    return _arg(x, jnp.max, jnp.argmax)


#: :func:`top_k` by reductions (False: ``lax.top_k``, kept to compare), read at trace
#: time
SMALL_TOPK = True
#: the largest ``k`` that :func:`top_k` picks by reductions (two per pick); larger ones
#: go to ``lax.top_k``. Paired in one process against lax.top_k (float32, 8 rounds,
#: outputs bit-identical): the Trossen fingers' mesh-mesh group (batch 64), best3 alone
#: 0.935 [0.906, 1.140] of the time, best3 and the ridge edges (k 4) 0.959 [0.868,
#: 1.256], with the corner axis's 8 nearest vertices too 0.971 [0.916, 1.095] (compile
#: CPU 6.9 -> 8.1 s); the Trossen arm's collision stage (k <= 4) 0.967 [0.926, 0.984],
#: mjx_convex's (batch 256) 1.009 [0.908, 1.072]
SMALL_TOPK_MAX = 4


def top_k(x, k):
    """``jax.lax.top_k(x, k)[1]`` (indices of the ``k`` largest entries of the last axis,
    largest first, ties to the lower index, NaN largest) for a small ``k``: ``x`` stored
    once (:func:`_stored`), then per pick its maximum over the entries not yet taken and
    the first entry equal to it (:func:`_first`'s two plain reductions). Under vmap
    ``top_k`` of a batch of rows of more than one batch axis (a collider's pairs inside
    the worlds) is a full sort on XLA CPU: the Trossen gripper fingers' mesh-mesh patch
    (best3 of 67 vertices on each side) spent two sorts of (64, 1, 67) there."""
    n = x.shape[-1]
    if k > n:
        raise ValueError(f"top_k: k={k} > {n} entries")
    if not SMALL_TOPK or k > SMALL_TOPK_MAX:
        return lax.top_k(x, k)[1]
    x = _stored(x, jnp.max)
    iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    taken = jnp.zeros(x.shape, bool)
    out = []
    for _ in range(k):
        xm = lax.select(taken, lax.full_like(x, -jnp.inf), x)
        i = _first(xm, jnp.max(xm, axis=-1, keepdims=True), ~taken)
        out.append(i)
        taken = taken | (iota == i[..., None])
    return jnp.stack(out, -1)


def first_where(mask, score=None):
    """(index, any) of the True entry of a 2-d mask with the smallest score (the first
    in row-major order without a score; index (0, 0) when none)."""
    flat = mask.reshape(-1)
    if score is None:
        # one reduction gives both: the mask is computed once
        n = flat.shape[0]
        k = jnp.min(sel(flat, lax.iota(jnp.int32, n), n))
        return jnp.unravel_index(where(k < n, k, 0), mask.shape), k < n
    k = argmin(sel(flat, score.reshape(-1), jnp.inf))
    return jnp.unravel_index(k, mask.shape), flat[k]


def bcast(x, shape):
    """``x`` broadcast to ``shape`` along new trailing axes (one traced equation)."""
    return lax.broadcast_in_dim(x, shape, tuple(range(jnp.ndim(x))))


def _unit(shape, c, dtype):
    """Constant array of ``shape`` (..., 3) holding the unit vector e_c."""
    return jnp.asarray(np.broadcast_to(np.eye(3)[c], shape), dtype)


def safe_norm(v):
    """|v| with a finite gradient at v = 0."""
    sq = dot(v, v)
    ok = sq > MINVAL * MINVAL
    return sel(ok, jnp.sqrt(sel(ok, sq, 1.0)), 0.0)


def normalize(v):
    """(v / |v|, |v|) as mju_normalize3: (1, 0, 0) when |v| < mjMINVAL."""
    n = safe_norm(v)
    ok = n >= MINVAL
    out = sel(bcast(ok, v.shape), v / bcast(sel(ok, n, 1.0), v.shape),
              _unit(v.shape, 0, v.dtype))
    return out, n


def normalize_c(v, reciprocal=False):
    """:func:`normalize` on component arrays: ``v`` a list of 3 arrays of one shape;
    returns (the unit vector's 3 components, |v|). The same operations: a unit vector
    read by broadcasts over a last axis of 3 is stored by XLA on CPU in kernels of its
    own (its norm, products and quotient). ``reciprocal``: the components times the
    norm's reciprocal, as mju_normalize3 and as XLA computes :func:`normalize` (it
    rewrites a division by a broadcast that way): the same values, bit for bit."""
    sq = v[0] * v[0] + v[1] * v[1] + v[2] * v[2]
    ok = sq > MINVAL * MINVAL
    n = sel(ok, jnp.sqrt(sel(ok, sq, 1.0)), 0.0)
    ok = n >= MINVAL
    d = sel(ok, n, 1.0)
    if reciprocal:
        inv = 1 / d
        return [sel(ok, x * inv, 1.0 if k == 0 else 0.0) for k, x in enumerate(v)], n
    return [sel(ok, x / d, 1.0 if k == 0 else 0.0) for k, x in enumerate(v)], n


def frame_rows(normal, tangent):
    """The first two rows of :func:`make_frame` (normal, t1)."""
    n, _ = normalize(normal)
    small = dot(tangent, tangent) < 0.25
    ey, ez = _unit(n.shape, 1, n.dtype), _unit(n.shape, 2, n.dtype)
    alt = sel(bcast(jnp.abs(n[..., 1]) < 0.5, n.shape), ey, ez)
    t = sel(bcast(small, n.shape), alt, tangent)
    t = t - n * bcast(dot(n, t), n.shape)
    t, _ = normalize(t)
    return n, t


def make_frame(normal, tangent):
    """Contact frame rows (normal, t1, t2) as mju_makeFrame: t1 is ``tangent`` made
    orthogonal to the normal, or (0, 1, 0) / (0, 0, 1) when ``tangent`` is ~zero."""
    n, t = frame_rows(normal, tangent)
    return jnp.stack([n, t, cross(n, t)], axis=-2)


def axis_z(mat):
    """z axis (third column) of a rotation matrix."""
    return mat[..., :, 2]


def _normalize_cols(v):
    """:func:`normalize`'s unit vector of three (n,) components ``v``, component-wise."""
    one, zero = fill(v[0].shape, 1, v[0].dtype), fill(v[0].shape, 0, v[0].dtype)
    sq = v[0] * v[0] + v[1] * v[1] + v[2] * v[2]
    ok = sq > MINVAL * MINVAL
    n = lax.select(ok, jnp.sqrt(lax.select(ok, sq, one)), zero)
    ok = n >= MINVAL
    d = lax.select(ok, n, one)
    return [lax.select(ok, x / d, one if i == 0 else zero) for i, x in enumerate(v)]


def frame_cols(normal, tangent):
    """:func:`make_frame`'s nine components (normal, t1, t2; (n,) each) from the three
    components of ``normal`` and of ``tangent``, component-wise: the same operations as
    :func:`frame_rows` without broadcasts of per-contact values over the 3 components
    (XLA on CPU does not fuse an expensive producer (square root, division) into a
    consumer that reads each of its elements more than once: each normalisation and
    dot product was a kernel), so that one consumer holds them all. The fills (ones,
    zeros) are traced once for all selects (XLA merges repeated ones: the same
    program, fewer traced equations)."""
    x0 = normal[0]
    one, zero = fill(x0.shape, 1, x0.dtype), fill(x0.shape, 0, x0.dtype)
    n = _normalize_cols(normal)
    tx, ty, tz = tangent
    small = tx * tx + ty * ty + tz * tz < 0.25
    ay = jnp.abs(n[1]) < 0.5
    alt = (zero, lax.select(ay, one, zero), lax.select(ay, zero, one))
    t = [lax.select(small, a, x) for a, x in zip(alt, tangent)]
    nt = n[0] * t[0] + n[1] * t[1] + n[2] * t[2]
    t = _normalize_cols([x - y * nt for x, y in zip(t, n)])
    b = [n[1] * t[2] - n[2] * t[1], n[2] * t[0] - n[0] * t[2], n[0] * t[1] - n[1] * t[0]]
    return n + t + b
