"""Quaternion and spatial-algebra helpers (MuJoCo's engine_util_spatial), vectorised.

Every function works on arrays with arbitrary leading (batch) dimensions: the last axis
holds the 3-vector, 4-quaternion (w, x, y, z), 6-vector (rotation:translation, MuJoCo's
"com-based" spatial order) or 10-vector inertia (MuJoCo's cinert layout: xx, yy, zz, xy,
xz, yz, mass*com(3), mass). Functions are written to be safe under ``jax.grad``: norms
and square roots never produce NaN gradients at zero.
"""
from __future__ import annotations

import functools
import operator
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

#: MuJoCo's mjMINVAL: smallest value treated as non-zero.
MINVAL = 1e-15


# --------------------------------------------------------------------------- vectors
def dot(a, b):
    """Inner product over the last axis."""
    return jnp.sum(a * b, axis=-1)


#: the array helpers below (:func:`cross`, :func:`quat_mul`, :func:`quat_to_mat`,
#: :func:`motion_cross`; :func:`force_cross` and :func:`inert_mul` with
#: :data:`_COMPONENTS_RNE`) split their operands
#: once (:func:`unstack`) and compute on the components, with the same operations in
#: the same order (fewer traced equations: no slice and squeeze per component use, one
#: stack); read at trace time (False: as they were, kept to compare). The bench's
#: batched rollout: ant 3746 -> 3733 equations, humanoid 5048 -> 5035, barkour 5365
#: -> 5222 (5133 with :data:`_COMPONENTS_RNE`: rne_post's spatial algebra); float outputs
#: bit-identical (ant, humanoid; barkour without :data:`_COMPONENTS_RNE`). Off: 2
#: kernels more; XLA CPU ant 0.960x [0.940, 0.993], humanoid 1.049x [0.960, 1.288]
#: (fresh processes alternated, 3 pairs each, load 5-11): noise, so on
_COMPONENTS = True

#: :data:`_COMPONENTS` for :func:`force_cross` and :func:`inert_mul` too (rne_post's
#: body forces); read at trace time. Off: with it, barkour's cfrc_int came out rounded
#: otherwise (float64 1.6e-14 of 445, float32 1.5e-5; XLA fused the products
#: differently), its other outputs bit-identical
_COMPONENTS_RNE = False


def cross(a, b):
    """3D cross product over the last axis."""
    if _COMPONENTS:
        return stack(c_cross(unstack(a), unstack(b)))
    a0, a1, a2 = unstack(a)
    b0, b1, b2 = unstack(b)
    return jnp.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


def clip(x, lo, hi):
    """``jnp.clip(x, lo, hi)`` of a float ``x`` (the same values: ``lax.clamp`` computes
    the same maximum and minimum), differentiated by ``lax.clamp``'s rule: the tangent
    passes where ``lo < x < hi``, tested against the bounds. jnp.clip's maximum and
    minimum pass it where the result *equals* the operand, and XLA recomputes the
    operand in the kernels of the derivatives. XLA:CPU lets LLVM contract multiply-adds
    into FMAs kernel by kernel, so one expression can round differently in two kernels
    (at --xla_backend_optimization_level=0 only where the fast instruction selector
    hands a block to the full one): the equality then fails by an ulp far from any
    bound and the tangent is lost (box-sphere contact normals' derivatives were off by
    up to 6.6, test_collision.test_grad_vs_finite_differences). Bounds: scalars or
    arrays that broadcast with ``x``; other operands (ints, a bound None): jnp.clip."""
    if (lo is None or hi is None or not isinstance(x, (jax.Array, np.ndarray))
            or not jnp.issubdtype(x.dtype, jnp.floating)
            or any(hasattr(v, "dtype") and v.dtype != x.dtype for v in (lo, hi))):
        return jnp.clip(x, lo, hi)      # (a bound of another dtype: jnp's promotion)
    shape = np.broadcast_shapes(np.shape(x), np.shape(lo), np.shape(hi))

    def arg(v, scalar_ok):
        v = jnp.asarray(v, x.dtype)
        if scalar_ok and v.ndim == 0:
            return v
        return v if v.shape == shape else jnp.broadcast_to(v, shape)
    return lax.clamp(arg(lo, True), arg(x, False), arg(hi, True))


def maximum(x, y):
    """``jnp.maximum(x, y)``, its very operations (the compiled program is unchanged),
    differentiated by comparing the operands: the tangent of the greater one, at a
    tie (``x == y``) the mean of both (as jnp). jnp.maximum passes a tangent where
    the result *equals* the operand, which fails far from any tie when XLA recomputes
    the operand in a derivative kernel and rounds it otherwise (see :func:`clip`).
    Operands that are not traced (constants) have no tangent; not floating: jnp's."""
    return _as_jnp(jnp.maximum, _extremum_jvp(True), x, y)


def minimum(x, y):
    """``jnp.minimum(x, y)`` differentiated by comparing the operands: the tangent of
    the smaller one (ties and the rest as :func:`maximum`)."""
    return _as_jnp(jnp.minimum, _extremum_jvp(False), x, y)


def clip_as_jnp(x, lo, hi):
    """``jnp.clip(x, lo, hi)``, its very operations (a maximum and a minimum, where
    :func:`clip` compiles to a clamp: the same values, but a changed program can fuse
    and round its neighbours otherwise), differentiated as :func:`clip` (``lax.clamp``'s
    rule: the operand's tangent where ``lo < x < hi``, a bound's beyond it). For sites
    whose outputs must stay bit-identical to the jnp.clip they had."""
    def rule(args, tans):
        shape = np.broadcast_shapes(*(np.shape(a) for a in args))
        dtype = jnp.result_type(*args)
        a, t = ([jnp.broadcast_to(jnp.asarray(v, dtype), shape) for v in vs]
                for vs in (args, tans))
        return jax.jvp(lambda u, lo_, hi_: lax.clamp(lo_, u, hi_), a, t)[1]
    return _as_jnp(jnp.clip, rule, x, lo, hi)


def amax(x, axis):
    """``jnp.max(x, axis)``, its very operations, differentiated through the first
    position of the maximum (``jnp.argmax``: comparisons); jnp's rule tests every
    entry for equality with the result (averaging the tangents of the equal ones), which
    a recomputed ``x`` rounded otherwise fails (see :func:`maximum`)."""
    def rule(args, tans):
        at = jnp.expand_dims(jnp.argmax(args[0], axis), axis)
        return jnp.squeeze(jnp.take_along_axis(tans[0], at, axis), axis)
    return _as_jnp(lambda v: jnp.max(v, axis), rule, x)


def _extremum_jvp(upper):
    def rule(args, tans):
        x, y = args
        tx, ty = tans
        win = jnp.greater if upper else jnp.less
        return jnp.where(win(x, y), tx, jnp.where(win(y, x), ty, 0.5 * (tx + ty)))
    return rule


def _as_jnp(fn, rule, *args):
    """``fn(*args)`` (float) as one ``jax.custom_jvp`` of its traced arguments (the
    others: constants, closed over), its tangent ``rule(args, tangents)`` (zeros for
    the constants). In the compiled program the call is inlined: fn's operations."""
    traced = [i for i, a in enumerate(args) if isinstance(a, jax.core.Tracer)]
    if not traced or not jnp.issubdtype(jnp.result_type(*args), jnp.floating):
        return fn(*args)

    def full(vals):
        out = list(args)
        for i, v in zip(traced, vals):
            out[i] = v
        return out

    @jax.custom_jvp
    def call(*vals):
        return fn(*full(vals))

    @call.defjvp
    def _jvp(primals, tangents):
        args_ = full(primals)
        tans = [jnp.zeros((), jnp.result_type(a)) for a in args_]
        for i, t in zip(traced, tangents):
            tans[i] = t
        out = fn(*args_)
        return out, jnp.broadcast_to(rule(args_, tans), out.shape).astype(out.dtype)
    return call(*[args[i] for i in traced])


def safe_sqrt(x):
    """sqrt(x) for x >= 0 whose gradient at 0 is 0 instead of inf/NaN."""
    pos = x > 0
    return where(pos, jnp.sqrt(where(pos, x, 1.0)), 0.0)


def norm(x, axis=-1):
    """Euclidean norm with a finite gradient at zero."""
    return safe_sqrt(jnp.sum(x * x, axis=axis))


def normalize(v, fallback=None):
    """(v / |v|, |v|) over the last axis (mju_normalize3 semantics).

    Below MINVAL the result is ``fallback`` (default: the unit x axis), as MuJoCo does.
    """
    n = norm(v)
    small = n < MINVAL
    if fallback is None:
        fallback = jnp.zeros(v.shape[-1], v.dtype).at[0].set(1)
    safe_n = where(small, 1.0, n)
    return where(small[..., None], fallback, v / safe_n[..., None]), n


#: :func:`matvec` and :func:`matTvec` as products summed over the contracted axis (read
#: at trace time; False: einsums, kept to compare). Vmapped, an einsum the batch does not
#: fold into a larger product stays a batched dot of (3, 3) by (3,), which XLA CPU runs
#: as a call of its own on one thread, a small matrix product per matrix; the sums fuse
#: with their neighbours (float64 bits the same as the dots'). The same holds for the
#: constraint Jacobian's and the inertia's products with one vector (J qvel, J
#: qacc_smooth, the line search's M and J times its direction): each a dot of its own
#: per world (barkour's M search 89 ms of LLVM alone); summed, float64 moves by the
#: order of the sums (a few ulp)
_SUM_MATVEC = True


def matvec(mat, v):
    """mat @ v for mat (..., n, m) and v (..., m): (..., n)."""
    if _SUM_MATVEC:
        return jnp.sum(mat * v[..., None, :], -1)
    return jnp.einsum("...ij,...j->...i", mat, v)


def matTvec(mat, v):
    """mat.T @ v for (..., 3, 3) and (..., 3)."""
    if _SUM_MATVEC:
        return jnp.sum(mat * v[..., :, None], -2)
    return jnp.einsum("...ji,...j->...i", mat, v)


# --------------------------------------------------------------------------- quaternions
def quat_identity(shape=(), dtype=jnp.float32):
    return jnp.zeros(tuple(shape) + (4,), dtype).at[..., 0].set(1)


def quat_normalize(q):
    """Unit quaternion (mju_normalize4): the identity if |q| < MINVAL."""
    n = norm(q)
    small = n < MINVAL
    ident = jnp.zeros(4, q.dtype).at[0].set(1)
    return where(small[..., None], ident, q / where(small, 1.0, n)[..., None])


def quat_neg(q):
    """Conjugate quaternion (mju_negQuat)."""
    return q * jnp.array([1.0, -1.0, -1.0, -1.0], q.dtype)


def quat_mul(a, b):
    """Hamilton product a * b (mju_mulQuat)."""
    if _COMPONENTS:
        return stack(c_qmul(unstack(a), unstack(b)))
    a0, a1, a2, a3 = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    b0, b1, b2, b3 = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return jnp.stack([
        a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3,
        a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
        a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1,
        a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0], axis=-1)


def rot_vec_quat(v, q):
    """Rotate 3-vector v by unit quaternion q (mju_rotVecQuat)."""
    w = q[..., 0:1]
    u = q[..., 1:4]
    t = w * v + cross(u, v)
    return v + 2.0 * cross(u, t)


def quat_to_mat(q):
    """Rotation matrix (..., 3, 3) of unit quaternion q (mju_quat2Mat)."""
    w, x, y, z = unstack(q) if _COMPONENTS else (q[..., 0], q[..., 1], q[..., 2], q[..., 3])
    ww, wx, wy, wz = w * w, w * x, w * y, w * z
    xx, xy, xz = x * x, x * y, x * z
    yy, yz, zz = y * y, y * z, z * z
    rows = [
        jnp.stack([ww + xx - yy - zz, 2 * (xy - wz), 2 * (xz + wy)], -1),
        jnp.stack([2 * (xy + wz), ww - xx + yy - zz, 2 * (yz - wx)], -1),
        jnp.stack([2 * (xz - wy), 2 * (yz + wx), ww - xx - yy + zz], -1),
    ]
    return jnp.stack(rows, axis=-2)


def axis_angle_to_quat(axis, angle):
    """Quaternion rotating by ``angle`` (rad) about unit ``axis`` (mju_axisAngle2Quat)."""
    half = 0.5 * angle
    return jnp.concatenate([jnp.cos(half)[..., None], axis * jnp.sin(half)[..., None]], -1)


def _sin_half_over(n, scale):
    """sin(scale*n/2)/n, finite (-> scale/2) as n -> 0, with a finite gradient."""
    small = n < 1e-8
    n_safe = where(small, 1.0, n)
    return where(small, 0.5 * scale, jnp.sin(0.5 * scale * n_safe) / n_safe)


def quat_integrate(q, vel, scale):
    """Rotate q by local angular velocity ``vel`` for time ``scale`` (mju_quatIntegrate).

    The input quaternion is normalised first, as MuJoCo does; the result is not.
    """
    n = norm(vel)
    angle = scale * n
    qrot = jnp.concatenate([jnp.cos(0.5 * angle)[..., None],
                            vel * _sin_half_over(n, scale)[..., None]], -1)
    return quat_mul(quat_normalize(q), qrot)


def quat_to_vel(q, dt=1.0):
    """3D angular velocity whose rotation over ``dt`` is q (mju_quat2Vel).

    Angles beyond pi are wrapped to rotate the short way round.
    """
    v = q[..., 1:4]
    s = norm(v)
    angle = 2.0 * jnp.arctan2(s, q[..., 0])
    angle = where(angle > jnp.pi, angle - 2 * jnp.pi, angle)
    # angle / s with the s -> 0 limit 2 / w (and a finite gradient)
    small = s < MINVAL
    ratio = where(small, 2.0 / where(q[..., 0] == 0, 1.0, q[..., 0]),
                  angle / where(small, 1.0, s))
    return v * (ratio / dt)[..., None]


def sub_quat(qa, qb):
    """3D velocity taking qb to qa: qb * quat(res) = qa (mju_subQuat)."""
    return quat_to_vel(quat_mul(quat_neg(qb), qa))


# --------------------------------------------------------------------------- spatial algebra
def motion_cross(vel, v):
    """Spatial motion cross product vel x v (mju_crossMotion), rot:lin layout."""
    if _COMPONENTS:
        vc, v = unstack(vel), unstack(v)
        w, u = vc[:3], vc[3:]
        return stack(c_cross(w, v[:3]) + c_add(c_cross(w, v[3:]), c_cross(u, v[:3])))
    w, u = vel[..., :3], vel[..., 3:]
    return jnp.concatenate([cross(w, v[..., :3]),
                            cross(w, v[..., 3:]) + cross(u, v[..., :3])], -1)


def force_cross(vel, f):
    """Spatial force cross product vel x* f (mju_crossForce), rot:lin layout."""
    if _COMPONENTS and _COMPONENTS_RNE:
        vc, f = unstack(vel), unstack(f)
        w, u = vc[:3], vc[3:]
        return stack(c_add(c_cross(w, f[:3]), c_cross(u, f[3:])) + c_cross(w, f[3:]))
    w, u = vel[..., :3], vel[..., 3:]
    return jnp.concatenate([cross(w, f[..., :3]) + cross(u, f[..., 3:]),
                            cross(w, f[..., 3:])], -1)


def inert_com(inertia, mat, dif, mass):
    """Body inertia expressed about a point offset by -dif (mju_inertCom).

    inertia: (..., 3) principal moments; mat: (..., 3, 3) inertia frame -> world;
    dif: (..., 3) com minus reference point; mass: (...,). Returns (..., 10) cinert.
    The rotated inertia mat diag(inertia) mat' is written as products and adds on
    component arrays (an einsum of 3x3 matrices is a batched dot plus transposes,
    separate and slow kernels on XLA CPU).
    """
    r = unstack(mat.reshape(mat.shape[:-2] + (9,)))
    ine = unstack(inertia)
    d0, d1, d2 = unstack(dif)
    # each product traced once (the same operations: XLA merged the repeated ones
    # anyway): 23 equations fewer in the bench's batched rollout
    ri = [[r[3 * i + j] * ine[j] for j in range(3)] for i in range(3)]
    sq = (d0 * d0, d1 * d1, d2 * d2)
    m0 = mass * d0

    def rot(i, k):
        return ri[i][0] * r[3 * k] + ri[i][1] * r[3 * k + 1] + ri[i][2] * r[3 * k + 2]

    # (at most 8 operands per stack: XLA CPU would not fuse a wider concatenation)
    return jnp.concatenate([
        stack((rot(0, 0) + mass * (sq[1] + sq[2]),
               rot(1, 1) + mass * (sq[0] + sq[2]),
               rot(2, 2) + mass * (sq[0] + sq[1]),
               rot(0, 1) - m0 * d1,
               rot(0, 2) - m0 * d2,
               rot(1, 2) - mass * d1 * d2)),
        mass[..., None] * dif, mass[..., None]], -1)


def inert_mul(i, v):
    """6D inertia (10-vector) times 6D motion vector (mju_mulInertVec)."""
    if _COMPONENTS and _COMPONENTS_RNE:
        return stack(c_inert_mul(unstack(i), unstack(v)))
    i0, i1, i2, i3, i4, i5 = (i[..., k] for k in range(6))
    c = i[..., 6:9]
    mass = i[..., 9:10]
    w, u = v[..., :3], v[..., 3:]
    rot = jnp.stack([i0 * w[..., 0] + i3 * w[..., 1] + i4 * w[..., 2],
                     i3 * w[..., 0] + i1 * w[..., 1] + i5 * w[..., 2],
                     i4 * w[..., 0] + i5 * w[..., 1] + i2 * w[..., 2]], -1)
    rot = rot + cross(c, u)
    lin = mass * u - cross(c, w)
    return jnp.concatenate([rot, lin], -1)


def transform_motion(vec, newpos, oldpos, rot=None):
    """Re-express a 6D motion vector at a new point, optionally rotated into a frame.

    mju_transformSpatial with flg_force=0; ``rot`` maps new-frame to old-frame
    coordinates (its columns are the new axes), e.g. a body's ximat.
    """
    lin = vec[..., 3:] - cross(newpos - oldpos, vec[..., :3])
    ang = vec[..., :3]
    if rot is not None:
        ang, lin = matTvec(rot, ang), matTvec(rot, lin)
    return jnp.concatenate([ang, lin], -1)


# --------------------------------------------------------------------------- components
# Hot tree recursions keep vectors as tuples of per-component arrays: a cross product
# is then 9 elementwise ops instead of ~25 (no slicing, reshaping or stacking), which
# keeps the compiled program small and fast.
#: :func:`unstack` is one ``lax.unstack`` equation (lowered to a slice and a reshape
#: per component, as before); read at trace time (False: a split and a squeeze per
#: component, kept to compare). The bench's batched rollout (with the rest of this
#: module's switches on): ant 3971 -> 3733 equations, humanoid 5272 -> 5035. Its
#: compile effect is inside this host's noise: off (3 transposing kernels fewer, from
#: the "each" reshapes) XLA CPU ant 0.978 [0.701, 1.025], humanoid 0.903 [0.870,
#: 0.930], barkour 1.041 [0.897, 1.129], shadow hand 1.002 [0.913, 1.026] (fresh
#: processes alternated, 4 pairs each, load 6-11); trace 1.047x, lowering 1.010x
#: (humanoid, one process, 10 alternations); run 0.94-1.07x (12 rounds each): kept on
_UNSTACK = True


#: where :func:`unstack` moves a batch axis first under vmap (for inputs batched along
#: another axis, as the tree recursions' body arrays): "each" component, as the
#: squeezes did; the "whole" input first (one transposing copy, not one per
#: component); None: nowhere (the components batched as the input); read at trace time.
#: Neither compiles the program of the squeezes (there the slices were transposed,
#: here the reshaped components, or the input). "each": float64 and float32 bench
#: outputs bit-identical (ant, humanoid); "whole": 17 equations fewer (ant 3733 ->
#: 3716), 24 transposes and 24 copies fewer in ant's optimised HLO, but outputs that
#: differ by rounding (float64 ant efc_KBIP 4.4e-11 of 2770, humanoid 2e-13 relative);
#: None: ant's optimised HLO 66 instructions more
_UNSTACK_MAJOR = "each"


def _major(x):
    """``x`` itself; under vmap, batched along its first axis (an identity reshape,
    bound as such: lax.reshape drops it; vmap's rule for it moves the batch axis first,
    and drops it where it is first; unbatched, XLA drops it)."""
    return lax.reshape_p.bind(x, **dict(_reshape_params(), new_sizes=x.shape))


@functools.lru_cache(maxsize=None)
def _reshape_params():
    """The parameters other than ``new_sizes`` of jax's reshape primitive, read from
    one traced ``lax.reshape`` (they differ between jax versions; ``dimensions`` and
    ``sharding`` in 0.10)."""
    eqn = jax.make_jaxpr(lambda x: lax.reshape(x, (2,)))(np.zeros((1, 2), np.float32)).eqns[0]
    return {k: v for k, v in eqn.params.items() if k != "new_sizes"}


def unstack(x, axis=-1, count=None):
    """Tuple of the components of x along ``axis`` (the last by default), ``axis``
    removed: ``x[..., i]`` for every i (the first ``count`` of them when given). One
    ``lax.unstack`` (after a split off of the first ``count``) instead of a slice and
    a squeeze each: the same slices and reshapes lowered, fewer traced equations
    (cheaper to trace, batch and lower)."""
    axis = axis % x.ndim
    size = x.shape[axis]
    count = size if count is None else count
    if not isinstance(x, jax.Array):
        # NumPy constants stay NumPy
        return tuple(x[(slice(None),) * axis + (i, Ellipsis)] for i in range(count))
    if size == 1:
        return (lax.squeeze(x, (axis,)),)[:count]
    if _UNSTACK:
        if count < size:
            x = lax.split(x, (count, size - count), axis)[0]
        if _UNSTACK_MAJOR == "whole":
            x = _major(x)
        out = tuple(lax.unstack(x, axis))
        return tuple(_major(c) for c in out) if _UNSTACK_MAJOR == "each" else out
    parts = lax.split(x, (1,) * count + ((size - count,) if count < size else ()), axis)
    return tuple(lax.squeeze(p, (axis,)) for p in parts[:count])


def take_rows(x, idx):
    """``x[idx]`` for a static (NumPy) 1-D integer index array ``idx`` (rows of ``x``):
    the gather jnp indexing emits, its indices a NumPy constant made here (jnp
    normalises negative indices with traced operations on the constant indices, which
    XLA folds): one traced equation instead of four. NumPy ``x`` stays NumPy."""
    if (not isinstance(x, jax.Array) or not isinstance(idx, np.ndarray) or x.ndim == 0
            or idx.ndim != 1 or idx.dtype.kind not in "iu"):
        return x[idx]
    # int32 indices, as jnp's (also with 64-bit types enabled)
    idx = np.where(idx < 0, idx + x.shape[0], idx).astype(np.int32)
    dnums = lax.GatherDimensionNumbers(offset_dims=tuple(range(1, x.ndim)),
                                       collapsed_slice_dims=(0,), start_index_map=(0,))
    return lax.gather(x, idx[:, None], dnums, (1,) + x.shape[1:],
                      mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)


#: False: :func:`take` is jnp's indexing (kept to compare)
_TAKE = True


def take(x, idx, axis=0):
    """``x[idx]`` for a static (NumPy) integer index array ``idx`` of any shape (rows
    of ``x``: the result is idx.shape + x.shape[1:]; with ``axis``, ``x``'s entries
    along that axis: x.shape[:axis] + idx.shape + x.shape[axis + 1:]), as
    :func:`take_rows`: one traced equation where jnp's indexing traces four (the
    negative-index normalisation of constant indices, which XLA folds). Used by the
    engine's gathers of model-indexed rows (bodies, joints, dofs, actuators, sensors)
    and the level factorisations' packing (axis 1): the bench's batched rollout traced
    111 equations fewer on the shadow hand, 171 on the ant, 192 on barkour, 141 on the
    humanoid. XLA gets the indices as literal constants (not jnp's folded selects:
    index computations and gathers of model constants fold away, a kernel or two
    fewer), the gathered values the same."""
    if (not _TAKE or not isinstance(x, jax.Array) or not isinstance(idx, np.ndarray)
            or x.ndim == 0 or idx.ndim == 0 or idx.dtype.kind not in "iu"):
        return x[(slice(None),) * axis + (idx,)]
    idx = np.where(idx < 0, idx + x.shape[axis], idx).astype(np.int32)
    # x's other axes keep their places around idx's
    dnums = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(axis)) + tuple(range(axis + idx.ndim, idx.ndim + x.ndim - 1)),
        collapsed_slice_dims=(axis,), start_index_map=(axis,))
    return lax.gather(x, idx[..., None], dnums, x.shape[:axis] + (1,) + x.shape[axis + 1:],
                      mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)


#: False: :func:`const_dot` is ``C @ x`` (kept to compare)
_CONST_DOT = True
#: :func:`const_dot` contracts in place only from this many columns of ``c``: a short
#: contraction stays ``C @ x``, which XLA CPU turns into multiply-adds. Bench rollouts
#: (batch 1024, float32, one process, alternated, 6 rounds): the inverted pendulum
#: (3 bodies, 2 dofs) ran 2.45x slower in place (4.66 against 1.90 us per world-step);
#: the humanoid without contacts (17 bodies, 27 dofs) 0.94x, barkour and the ant
#: (14 bodies) 0.92-0.94x. Walker2d without contacts (8 bodies, 9 dofs: contractions of
#: 7-9 columns; 12 rounds) ran 0.81x [0.78, 0.84] with every product ``C @ x`` against
#: in place from 8 columns, 0.84x [0.74, 1.09] with 10 as the threshold; the pusher
#: (11-13 columns) 1.06x [0.88, 1.30] with every product ``C @ x`` against in place
#: (noise); the hopper (5-6 columns) 1.73x [1.54, 2.18] in place. The four bench
#: models' shortest contraction has 13 columns
_CONST_DOT_MIN = 10


def const_dot(c, x):
    """``c @ x`` for a constant (NumPy) matrix ``c`` (m, n) and an array ``x`` (n, ...),
    as a dot that contracts x's first axis with c's second, the result (..., m) moved
    back to (m, ...). Vmapped, ``c @ x`` is a dot whose batched operand XLA CPU first
    copies to (n, batch * ...) (a transposing kernel of its own, fused with x's
    producer) and whose result it copies back; contracting x's axis in place, it emits
    one batched dot. The tree sums of the smooth and post-constraint passes
    (ancestor and descendant matrices) are such products. Short contractions
    (:data:`_CONST_DOT_MIN`) stay ``c @ x``."""
    c = np.asarray(c)
    if not _CONST_DOT or x.ndim < 2 or c.ndim != 2 or c.shape[1] < _CONST_DOT_MIN:
        return jnp.asarray(c, x.dtype) @ x
    out = lax.dot_general(x, c.astype(x.dtype), (((0,), (1,)), ((), ())))
    return lax.transpose(out, (out.ndim - 1,) + tuple(range(out.ndim - 1)))


#: whether :func:`fill` traces a fill once per trace (False: every call traces one)
_SHARED_FILLS = True

try:                            # the innermost trace, where jax still offers it
    from jax.extend.core import find_top_trace as _top_trace
except ImportError:             # pragma: no cover
    _top_trace = None

#: per trace (weakly held), its fills by (shape, dtype, weak type, value bits), weakly
#: held too: a trace's fills live as long as its jaxpr under construction keeps them
_FILLS = weakref.WeakKeyDictionary()


def fill(shape, value, dtype=None, like=None):
    """``lax.full(shape, value, dtype)`` (``like``: ``lax.full_like(like, value)``),
    traced once per trace and reused there: a select with a constant operand takes a
    fill of its shape, the same fill many times over in a traced step (and vmap
    broadcasts it again per select), every one a traced and lowered equation that XLA
    merges with the others. Bench rollouts (batch 1024): 63 traced equations fewer on
    the ant (3751 -> 3688), 55 on the shadow hand (9098 -> 9043), the optimised
    programs of the four bench models the same; trace and lowering CPU alternated in
    one process, on / off: ant 0.956 [0.83, 1.29] and 0.926 [0.82, 1.37] (8 rounds),
    shadow hand 0.963 [0.82, 1.20] and 1.029 [0.88, 1.17] (6; load 7-9): noise level."""
    def make():
        # a strong dtype: the value converted by NumPy, a literal of the traced program
        # (lax.full's convert of it is a traced equation that jax folds into one: the
        # bench rollouts trace 30-40 equations fewer, their programs the same)
        if len(shape) and not isinstance(value, jax.core.Tracer):
            if like is None and dtype is not None:
                v = np.asarray(value, jax.dtypes.canonicalize_dtype(dtype))
                return lax.broadcast_in_dim(v, tuple(shape), ())
            if isinstance(like, jax.core.Tracer) and not like.weak_type:
                return lax.broadcast_in_dim(np.asarray(value, like.dtype), tuple(shape), (),
                                            out_sharding=like.aval.sharding)
        return lax.full(shape, value, dtype) if like is None else lax.full_like(like, value)
    if not _SHARED_FILLS or _top_trace is None or isinstance(value, jax.core.Tracer):
        return make()
    trace = _top_trace(())
    try:
        fills = _FILLS.get(trace)
        if fills is None:
            fills = _FILLS[trace] = weakref.WeakValueDictionary()
    except TypeError:           # a trace that cannot be held weakly: no sharing
        return make()
    v = np.asarray(value)
    # everything the fill's value, dtype and weak type follow from (a Python float
    # and a NumPy float64 of one value differ in weak type; 0.0 and -0.0 in bits)
    key = (tuple(shape), str(dtype), type(value), v.dtype.str, v.tobytes(),
           None if like is None else (str(like.dtype), like.weak_type,
                                      getattr(getattr(like, "aval", None), "sharding", None)))
    out = fills.get(key)
    if out is None:
        out = make()
        if isinstance(out, jax.core.Tracer):
            fills[key] = out
    return out


def _where_operand(v, like):
    """(v's dtype, v) for :func:`where`: an array of a strong dtype, or a Python scalar
    taking the other operand's (``like``) dtype as jnp's promotion gives it; None for
    anything else."""
    if isinstance(v, np.ndarray) or isinstance(v, jax.Array) and not v.weak_type:
        return v.dtype, v
    kind = getattr(like, "dtype", np.dtype(object)).kind
    if (type(v) is float and kind == "f" or type(v) is int and kind in "fi"
            or type(v) is bool and kind == "b") and not getattr(like, "weak_type", True):
        return like.dtype, v
    return None


def where(*args, **kwargs):
    """``jnp.where(cond, x, y)`` traced in place. jnp.where is a jit of its own: every
    call leaves a call equation in the jaxpr that vmap batches, the lowering emits and
    XLA inlines, each on its own, and its trace costs a jit's cache lookup. Here the
    same operations (broadcasts, ``lax.select``) in line where ``cond`` is a boolean
    array and x, y arrays of one strong dtype or a Python scalar and such an array
    (a scalar's fill by :func:`fill`: one per trace, shape and value); any other call
    is jnp.where's. Used in the engine's modules, the bench's batched
    rollout (jit(vmap(fori_loop(step))), 1024 worlds) traced 7097 -> 6651 equations
    (humanoid), 8259 -> 7638 (barkour), 12689 -> 12058 (shadow hand); its trace and
    lowering took 0.87-0.96x the CPU (medians of pairs in one process; the lowering
    0.82-0.88x), the optimised program the same up to the order of operands.
    A Python-scalar fill that the condition gives (0 where it fails, 1 where it holds:
    the condition converted, batched as it is, where vmap broadcasts a constant fill
    over the batch again) traced 0.9-1.3% fewer equations (shadow hand 11480 -> 11378,
    ant 4959 -> 4895) for no measurable trace + lowering gain (8 pairs: 0.98 [0.93,
    1.17] and 1.01 [0.96, 1.10]): not done. Nor is a constant condition folded in
    Python (NumPy's where of constant operands, the one operand a uniform condition
    takes): 50 equations fewer on those two models (0.4-1%)."""
    if len(args) != 3 or kwargs:
        return jnp.where(*args, **kwargs)
    cond, x, y = args
    if not (isinstance(cond, (jax.Array, np.ndarray)) and cond.dtype == np.bool_):
        return jnp.where(cond, x, y)
    ox, oy = _where_operand(x, y), _where_operand(y, x)
    if ox is None or oy is None or ox[0] != oy[0]:
        return jnp.where(cond, x, y)
    dtype = ox[0]
    ops = (x, y) if cond.ndim == 0 else (cond, x, y)
    shape = np.shape(ops[0])
    if any(np.shape(v) != shape for v in ops[1:]):
        shape = np.broadcast_shapes(*(np.shape(v) for v in ops))

    def spread(v):
        # numpy broadcasting: a Python scalar filled, an array's axes aligned at the end
        if not hasattr(v, "dtype"):
            return fill(shape, v, dtype)
        if v.shape == shape:
            return v
        return lax.broadcast_in_dim(v, shape, tuple(range(len(shape) - v.ndim, len(shape))))

    return lax.select(spread(cond) if cond.ndim else cond, spread(x), spread(y))


def stack(c):
    """Inverse of :func:`unstack`."""
    return jnp.stack(c, axis=-1)


def ops(*xs):
    """(mul, add, sub): lax's where the xs are traced arrays (or NumPy constants) of one
    shape and dtype, none weakly typed, else Python's operators. jnp's operators trace
    to the same equations there, each through a jit wrapper and a dtype promotion of
    its own (about twice the tracing time); the component helpers below are traced
    hundreds of times."""
    x0 = xs[0]
    shape, dtype = getattr(x0, "shape", None), getattr(x0, "dtype", None)
    if all((isinstance(x, np.ndarray) or isinstance(x, jax.Array) and not x.weak_type)
           and x.shape == shape and x.dtype == dtype for x in xs) and any(
               isinstance(x, jax.core.Tracer) for x in xs):
        return lax.mul, lax.add, lax.sub
    return operator.mul, operator.add, operator.sub


def c_dot(a, b):
    """Dot product of two component 3-vectors (lists of three arrays), summed in
    :func:`dot`'s order."""
    m, p, _ = ops(*a, *b)
    return p(p(m(a[0], b[0]), m(a[1], b[1])), m(a[2], b[2]))


def c_cross(a, b):
    m, _, s = ops(*a, *b)
    return (s(m(a[1], b[2]), m(a[2], b[1])), s(m(a[2], b[0]), m(a[0], b[2])),
            s(m(a[0], b[1]), m(a[1], b[0])))


def c_qmul(a, b):
    """Hamilton product of component quaternions."""
    a0, a1, a2, a3 = a
    b0, b1, b2, b3 = b
    m, p, s = ops(*a, *b)
    return (s(s(s(m(a0, b0), m(a1, b1)), m(a2, b2)), m(a3, b3)),
            s(p(p(m(a0, b1), m(a1, b0)), m(a2, b3)), m(a3, b2)),
            p(p(s(m(a0, b2), m(a1, b3)), m(a2, b0)), m(a3, b1)),
            p(s(p(m(a0, b3), m(a1, b2)), m(a2, b1)), m(a3, b0)))


def c_rot(q, v):
    """Rotate component vector v by component unit quaternion q."""
    u = q[1:]
    t = c_cross(u, v)
    m, p, _ = ops(*q, *v)
    t = (p(m(q[0], v[0]), t[0]), p(m(q[0], v[1]), t[1]), p(m(q[0], v[2]), t[2]))
    s = c_cross(u, t)
    return (p(v[0], 2 * s[0]), p(v[1], 2 * s[1]), p(v[2], 2 * s[2]))


def c_add(a, b):
    p = ops(*a, *b)[1]
    return tuple(p(x, y) for x, y in zip(a, b))


def c_where(mask, a, b):
    return tuple(where(mask, x, y) for x, y in zip(a, b))


def c_quat_to_mat(q):
    """Rotation matrix of a component unit quaternion: 9 arrays, row-major."""
    w, x, y, z = q
    ww, wx, wy, wz = w * w, w * x, w * y, w * z
    xx, xy, xz = x * x, x * y, x * z
    yy, yz, zz = y * y, y * z, z * z
    return (ww + xx - yy - zz, 2 * (xy - wz), 2 * (xz + wy),
            2 * (xy + wz), ww - xx + yy - zz, 2 * (yz - wx),
            2 * (xz - wy), 2 * (yz + wx), ww - xx - yy + zz)


def c_quat_normalize(q):
    """:func:`quat_normalize` of a component quaternion (4 arrays)."""
    m, p, _ = ops(*q)
    x = p(p(p(m(q[0], q[0]), m(q[1], q[1])), m(q[2], q[2])), m(q[3], q[3]))
    if m is lax.mul:
        # the fills traced once each (as XLA merges them): 5 equations fewer a call
        one, zero = fill(x.shape, 1, x.dtype), fill(x.shape, 0, x.dtype)
    else:
        one, zero = 1.0, 0.0
    pos = x > 0
    n = where(pos, jnp.sqrt(where(pos, x, one)), zero)          # safe_sqrt
    small = n < MINVAL
    inv = 1.0 / where(small, one, n)
    return tuple(where(small, one if i == 0 else zero, c * inv) for i, c in enumerate(q))


def c_inert_mul(i, v):
    """:func:`inert_mul` on component arrays: 10 inertia, 6 motion -> 6 force."""
    w, u = v[:3], v[3:]
    c, mass = i[6:9], i[9]
    m, p, s = ops(*i, *v)
    rot = (p(p(m(i[0], w[0]), m(i[3], w[1])), m(i[4], w[2])),
           p(p(m(i[3], w[0]), m(i[1], w[1])), m(i[5], w[2])),
           p(p(m(i[4], w[0]), m(i[5], w[1])), m(i[2], w[2])))
    rot = c_add(rot, c_cross(c, u))
    cw = c_cross(c, w)
    return rot + tuple(s(m(mass, a), b) for a, b in zip(u, cw))


# XLA:CPU's TreeReductionRewriter splits every reduction over an axis longer than this
# into a reduce-window (windows of this many entries) and a reduce of the window
# results. The reduce-window is a kernel of its own, not fusible with what produces
# its operand (which is then materialised): 2-3 kernels where one would do, each
# 15-50 ms of compile (19 in the humanoid's contact step, 28 in the shadow hand's).
_XLA_WINDOW = 32

#: False: :func:`reduce_fused` is the plain reduction (kept to compare the two)
_FUSE_REDUCTIONS = True

_REDUCERS = {"sum": (jnp.sum, lax.add), "any": (jnp.any, lax.bitwise_or),
             "max": (jnp.max, lax.max), "min": (jnp.min, lax.min)}


def _xla_windows(n):
    """(start, stop) of the windows XLA:CPU's tree reduction cuts an axis of ``n``
    entries into (windows of _XLA_WINDOW, "same" padding split evenly, the extra
    entry of an odd padding after)."""
    m = -(-n // _XLA_WINDOW)
    lo = (m * _XLA_WINDOW - n) // 2
    return [(max(0, j * _XLA_WINDOW - lo), min(n, (j + 1) * _XLA_WINDOW - lo))
            for j in range(m)]


def _identity(kind, dtype):
    """The value that leaves a ``kind`` reduction of ``dtype`` entries unchanged."""
    if kind in ("sum", "any"):
        return np.zeros((), dtype)
    if dtype == bool:
        return np.asarray(kind == "min")
    big = np.inf if np.issubdtype(dtype, np.inexact) else np.iinfo(dtype).max
    return np.asarray(-big if kind == "max" else big).astype(dtype)


#: the most windows whose float sums are fused as one reduction each (more did not
#: fuse into one kernel: 8 windows made 3 kernels)
_FUSED_SUMS = 4


#: :func:`reduce_fused`'s windows of an order-free reduction are of equal widths (the
#: axis padded where they do not divide it, by less than a window count), not of
#: _XLA_WINDOW entries with the last one padded; read at trace time (False: the
#: former way, kept to compare). A pad fused into a reduction costs LLVM compile time
#: (as in :func:`simjax.engine.solver_gather.count_below`); barkour's 120 rows are 4
#: windows of 30, the hand's 108 of 27. Barkour's bench rollout: two padded
#: reductions fewer (the same kernels); not measured alone (in the paired compile of
#: the solver chunks' changes, :data:`simjax.engine.solver_rows._FRESH`); outputs
#: bit-identical (float64: humanoid, barkour, shadow hand; float32 bench rollouts)
_EVEN_WINDOWS = True


def reduce_fused(x, axis, kind="sum"):
    """``jnp.sum`` / ``any`` / ``max`` / ``min`` (``kind``) of ``x`` over one ``axis``,
    the values XLA:CPU computes for them (float sums: the same additions in the same
    order), in one kernel that fuses with the operand's producers (bool sums count as
    jnp.sum's integers). Producers fused into the reduction may be compiled with other
    roundings than when stored (a multiply-add contracted); the bench models' steps
    came out bit-identical, float32 and float64.

    Over an axis of more than _XLA_WINDOW entries XLA:CPU reduces windows of 32 entries
    in a reduce-window kernel, then the window results (see _XLA_WINDOW). Float sums
    over up to _FUSED_SUMS windows: each window is the sum of a slice and the sums
    are added in window order, which is what that reduce-window and reduce compute;
    the other kinds do not depend on the order: the windows (padded with the
    reduction's identity to equal lengths; cut by one split, :data:`_SPLIT`) are
    combined entry by entry (by halves, :data:`_HALVES`), then reduced
    over _XLA_WINDOW entries. (A reshape into windows or a reduction of partial
    reductions would not do: XLA's simplifier merges them back into one long
    reduction, which it then rewrites.) Other axes: the plain reduction."""
    red, comb = _REDUCERS[kind]
    axis = axis % x.ndim
    n = x.shape[axis]
    if n <= _XLA_WINDOW or n > _XLA_WINDOW ** 2 or not _FUSE_REDUCTIONS:
        return red(x, axis)
    if kind == "any":
        x = x.astype(bool)
    elif kind == "sum" and x.dtype == bool:
        x = x.astype(jax.dtypes.canonicalize_dtype(np.int64))
    wins = _xla_windows(n)
    if kind == "sum" and jnp.issubdtype(x.dtype, jnp.inexact):
        if len(wins) > _FUSED_SUMS:
            return red(x, axis)
        out = None
        for part in _windows(x, [b - a for a, b in wins], axis):
            part = red(part, axis)
            out = part if out is None else comb(out, part)
        return out
    # windows of equal widths, at most _XLA_WINDOW: padded only where they do not
    # divide the axis (:data:`_EVEN_WINDOWS`)
    w = -(-n // len(wins)) if _EVEN_WINDOWS else _XLA_WINDOW
    if len(wins) * w > n:
        pad = [(0, 0, 0)] * x.ndim
        pad[axis] = (0, len(wins) * w - n, 0)
        x = lax.pad(x, jnp.asarray(_identity(kind, x.dtype)), pad)
    m = len(wins)
    while _HALVES and m % 2 == 0:
        # (:data:`_HALVES`) the windows' two halves combined entry by entry
        m //= 2
        x = comb(*lax.split(x, (m * w, m * w), axis))
    parts = _windows(x, [w] * m, axis)
    out = parts[0]
    for part in parts[1:]:
        out = comb(out, part)
    return red(out, axis)


#: :func:`reduce_fused` combines the windows of an order-free reduction by halves (the
#: first half of the windows with the second, and so on), not one after another: the
#: same number of combinations (order-free: the same values), traced in 2 log2(m)
#: equations, not m (32 windows over 1024 worlds: 10, not 32); read at trace time
#: (False: in window order, kept to compare). The bench's batched rollout: ant 3876 ->
#: 3733 equations, humanoid 5178 -> 5035 (a different optimised program: the
#: combinations a tree; values the same). Off measured worse in XLA CPU although it
#: has fewer kernels (on, the first combination of 512 worlds is a kernel of its
#: own: shadow hand 790 -> 796, humanoid and barkour 1 more): off ant 1.064x [1.043,
#: 1.131], shadow hand 1.067x [0.921, 1.094] (fresh processes alternated, 4 pairs
#: each, load 7-11)
_HALVES = True


#: :func:`reduce_fused` cuts its windows by one ``lax.split`` (lowered to the same
#: slices), not by a slice each; read at trace time (False: a slice each, kept to
#: compare). A reduction over 1024 worlds traces 31 equations fewer: the bench's
#: batched rollout ant 4469 -> 4240, humanoid 5808 -> 5541, barkour 5793 -> 5719,
#: shadow hand 9864 -> 9765 (with collision's former integer-only split helper
#: now this for all kinds; combined in window order, before :data:`_HALVES`); the
#: optimised HLO the same up to names (ant, humanoid, barkour, shadow hand: no XLA
#: difference); with :data:`_HALVES` on, off adds few equations (ant 0, humanoid 44,
#: barkour 4, shadow hand 6)
_SPLIT = True


def _windows(x, sizes, axis):
    """The consecutive windows of ``sizes`` entries (summing to the axis) of ``x``
    along ``axis``."""
    if _SPLIT:
        return lax.split(x, sizes, axis)
    starts = np.cumsum([0] + list(sizes))
    return [lax.slice_in_dim(x, int(a), int(b), axis=axis)
            for a, b in zip(starts[:-1], starts[1:])]


#: the longest concatenation along the minor axis (vmapped: the per-world axis) that XLA
#: on CPU fuses into its users (see :func:`concat_major`)
MINOR_CAT_MAX = 128


def concat_major(xs):
    """``jnp.concatenate`` of 1-d arrays, as a concatenation along a major axis (a
    trailing axis of one, then dropped): XLA on CPU fuses no operand into a
    concatenation along the minor axis of more than MINOR_CAT_MAX entries (vmapped: the
    per-world axis), it stores every operand in a kernel of its own and copies them
    (float32 and bool alike); along a major axis up to 8 operands fuse into one
    kernel. That kernel loops over entries one at a time (its minor axis has one
    entry): it paid off for the constraint rows (138 a world); for the collision
    entries (513 a world, the shadow hand) the rollout ran 1.10x slower."""
    if len(xs) == 1:
        return xs[0]
    return jnp.concatenate([x[:, None] for x in xs])[:, 0]
