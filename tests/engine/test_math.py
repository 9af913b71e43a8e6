"""Spatial helpers of simjax.engine.math against MuJoCo's mju_* functions (float64)."""
import mujoco
import numpy as np
import pytest

from simjax.engine import math

RNG = np.random.default_rng(7)
N = 64


def _quats(n):
    q = RNG.standard_normal((n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def test_cross_matches_mujoco_exactly():
    a, b = RNG.standard_normal((N, 3)), RNG.standard_normal((N, 3))
    ref = np.empty((N, 3))
    for i in range(N):
        mujoco.mju_cross(ref[i], a[i], b[i])
    # same products and differences per component: bit-identical
    np.testing.assert_array_equal(np.asarray(math.cross(a, b)), ref)


def test_quat_mul_matches_mujoco():
    a, b = _quats(N), RNG.standard_normal((N, 4))
    ref = np.empty((N, 4))
    for i in range(N):
        mujoco.mju_mulQuat(ref[i], a[i], b[i])
    np.testing.assert_allclose(np.asarray(math.quat_mul(a, b)), ref, rtol=0, atol=1e-15)


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_quat_to_mat_matches_mujoco(scale):
    q = _quats(N)
    q[:, 1:] *= scale                   # near-identity rotations too
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ref = np.empty((N, 9))
    for i in range(N):
        mujoco.mju_quat2Mat(ref[i], q[i])
    out = np.asarray(math.quat_to_mat(q)).reshape(N, 9)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-15)


def test_quat_to_mat_batched_shapes():
    q = _quats(6).reshape(2, 3, 4)
    assert math.quat_to_mat(q).shape == (2, 3, 3, 3)
    assert math.quat_mul(q, q).shape == (2, 3, 4)
    assert math.cross(q[..., 1:], q[..., :3]).shape == (2, 3, 3)


@pytest.mark.parametrize("n", [20, 33, 54, 100, 232, 1024, 1100])
@pytest.mark.parametrize("kind", ["sum", "any", "max", "min", "count"])
def test_reduce_fused_matches_xla_reduction(n, kind):
    """reduce_fused gives jnp's reduction bit for bit (float sums in XLA:CPU's window
    order) and leaves no reduce-window in the program."""
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(n)
    x = jnp.asarray((rng.standard_normal((64, n)) * np.exp(3 * rng.standard_normal((64, n))))
                    .astype(np.float32))
    plain = {"sum": jnp.sum, "any": jnp.any, "max": jnp.max, "min": jnp.min,
             "count": jnp.sum}[kind]
    prep = (lambda v: v > 0.5) if kind in ("any", "count") else jnp.sin
    red = "sum" if kind == "count" else kind

    def fused(v):
        return math.reduce_fused(prep(v), -1, red)

    want = jax.jit(lambda v: plain(prep(v), axis=-1))(x)
    got = jax.jit(fused)(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    if 32 < n <= 1024 and (kind != "sum" or n <= 128):
        assert "reduce-window" not in jax.jit(fused).lower(x).compile().as_text()


def test_where_as_jnp_where():
    """math.where gives jnp.where's values, dtype, weak type and shape (traced in place
    or handed to jnp.where), also under jit, vmap and grad."""
    import itertools

    import jax
    import jax.numpy as jnp
    conds = [jnp.asarray(True), jnp.asarray(RNG.random(5) > 0.5),
             jnp.asarray(RNG.random((4, 5)) > 0.5), RNG.random((4, 1)) > 0.5,
             jnp.asarray(RNG.random(5)) > 0.5]
    vals = [jnp.arange(5.0), jnp.ones((4, 5), jnp.float32), jnp.full((4, 1), 2.0), 2.0, 3,
            True, jnp.arange(5), np.arange(5.0, dtype=np.float32), jnp.ones(5, jnp.int32),
            jnp.asarray(2.0), jnp.ones(5, bool)]

    def pairs():
        # every combination jnp.where accepts, traced in one jit (the operands closed
        # over as they are: arrays, NumPy arrays, Python scalars): compiled eagerly,
        # each combination was programs of its own (28 s of the test's 29)
        got = []
        for c, x, y in itertools.product(conds, vals, vals):
            try:
                ref = jnp.where(c, x, y)
            except (TypeError, ValueError):
                continue
            got.append((math.where(c, x, y), ref))
        return got

    checked = 0
    for out, ref in jax.jit(pairs)():
        assert (out.dtype, out.shape, out.weak_type) == (ref.dtype, ref.shape, ref.weak_type)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
        checked += 1
    assert checked > 300
    # traced operands (one jit for the lot)
    args = [(c, x, y) for c, x, y in itertools.product(conds[1:3], vals[:3], vals[3:6])]
    outs = jax.jit(lambda a: [math.where(*v) for v in a])(args)
    for (c, x, y), out in zip(args, outs):
        ref = jnp.where(c, x, y)
        assert (out.dtype, out.shape) == (ref.dtype, ref.shape)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
    c, x = jnp.asarray(RNG.random((3, 5)) > 0.5), jnp.asarray(RNG.standard_normal((3, 5)))
    np.testing.assert_array_equal(jax.vmap(lambda c, x: math.where(c, x, 0.0))(c, x),
                                  jnp.where(c, x, 0.0))
    g = jax.grad(lambda x: jnp.sum(math.where(c, x * x, -x)))(x)
    np.testing.assert_array_equal(g, jnp.where(c, 2 * x, -1.0))
    assert math.where(c[0]).__len__() == 1          # one argument: jnp.where's nonzero


def test_fill_traced_once_per_trace():
    """math.fill is lax.full (value, dtype, weak type; lax.full_like with ``like``),
    one traced equation per trace for repeated fills of one shape, dtype and value
    (a nested trace traces its own), and every where's fill goes through it."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    for args in [((3,), 1.0, None), ((3,), 1.0, jnp.float32), ((2, 3), -0.0, None),
                 ((3,), np.float32(2.0), None), ((3,), 1, None), ((3,), True, None)]:
        ref, out = lax.full(*args), jax.jit(lambda: math.fill(*args))()
        assert (out.dtype, out.shape, out.weak_type) == (ref.dtype, ref.shape, ref.weak_type)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))
        np.testing.assert_array_equal(out, ref)
    x = jnp.arange(3.0)
    assert math.fill((3,), 2.0, like=x).weak_type == lax.full_like(x, 2.0).weak_type
    # a strong dtype (given, or a traced ``like``'s): the value converted by NumPy, one
    # traced equation (no convert of the value)
    for args in [((3,), 7, jnp.int32), ((2, 2), 1, jnp.bool_), ((3,), -0.0, jnp.float32),
                 ((3,), np.nan, jnp.float32), ((3,), 1e-50, jnp.float32)]:
        ref, out = lax.full(*args), jax.jit(lambda: math.fill(*args))()
        assert (out.dtype, out.weak_type) == (ref.dtype, ref.weak_type)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))
        np.testing.assert_array_equal(out, ref)
        assert len(jax.make_jaxpr(lambda: math.fill(*args))().eqns) == 1
    for like in [jnp.arange(3, dtype=jnp.int32), jnp.arange(3.0), x > 1.0]:
        ref = lax.full_like(like, 2)
        out = jax.jit(lambda v: math.fill(v.shape, 2, like=v))(like)
        assert (out.dtype, out.weak_type) == (ref.dtype, ref.weak_type)
        np.testing.assert_array_equal(out, ref)
        assert len(jax.make_jaxpr(lambda v: math.fill(v.shape, 2, like=v))(like).eqns) == 1

    def f(c, x):
        a = math.where(c, x, 0.0) + math.where(~c, 0.0, x * x)
        # a loop body is a trace of its own: its fill is its own, not the outer one's
        b = lax.fori_loop(0, 2, lambda i, v: math.where(c, v, 0.0), x)
        return a + b + math.where(c, x, -0.0) + math.where(c, x, 1.0)
    c = jnp.asarray([True, False, True])
    jaxpr = jax.make_jaxpr(f)(c, x)
    fills = [e for e in jaxpr.eqns if e.primitive.name == "broadcast_in_dim"]
    assert sorted(str(e.invars[0].val) for e in fills) == ["-0.0", "0.0", "1.0"]
    loop = next(e for e in jaxpr.eqns if e.primitive.name in ("scan", "while"))
    body = [p.jaxpr for p in loop.params.values() if isinstance(p, jax.extend.core.ClosedJaxpr)]
    assert any(e.primitive.name == "broadcast_in_dim" for b in body for e in b.eqns)
    ref = (jnp.where(c, x, 0.0) + jnp.where(~c, 0.0, x * x) + jnp.where(c, x, 0.0)
           + jnp.where(c, x, -0.0) + jnp.where(c, x, 1.0))
    out = jax.jit(f)(c, x)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(jax.vmap(f)(jnp.stack([c, ~c]), jnp.stack([x, -x])),
                                  jax.vmap(jax.jit(f))(jnp.stack([c, ~c]),
                                                       jnp.stack([x, -x])))


@pytest.mark.parametrize("flag", [True, False])
def test_matvec_matches_mujoco_and_einsum(flag, monkeypatch):
    """matvec and matTvec (sums over the contracted axis, or the einsums they replace)
    against mju_mulMatVec3 / mju_mulMatTVec3, on one matrix, batched, and vmapped and
    jitted; both forms give the same bits as MuJoCo's three-term sums."""
    import jax
    monkeypatch.setattr(math, "_SUM_MATVEC", flag)
    mats, vecs = RNG.standard_normal((N, 3, 3)), RNG.standard_normal((N, 3))
    ref, ref_t = np.empty((N, 3)), np.empty((N, 3))
    for i in range(N):
        mujoco.mju_mulMatVec3(ref[i], mats[i].reshape(-1), vecs[i])
        mujoco.mju_mulMatTVec3(ref_t[i], mats[i].reshape(-1), vecs[i])
    for fn, want in ((math.matvec, ref), (math.matTvec, ref_t)):
        np.testing.assert_array_equal(np.asarray(fn(mats, vecs)), want)
        np.testing.assert_array_equal(np.asarray(fn(mats[0], vecs[0])), want[0])
        got = jax.jit(jax.vmap(jax.vmap(fn)))(mats.reshape(8, 8, 3, 3),
                                              vecs.reshape(8, 8, 3))
        np.testing.assert_array_equal(np.asarray(got).reshape(N, 3), want)


@pytest.mark.parametrize("ncol", [3, 14])
def test_const_dot_is_matmul_under_vmap(ncol):
    """const_dot(c, x) equals c @ x, for a short contraction (kept as c @ x) and a
    long one (contracted in place), on one world and vmapped over a batch."""
    import jax
    import jax.numpy as jnp
    c = RNG.integers(0, 2, (ncol + 2, ncol)).astype(float)
    x = RNG.standard_normal((5, ncol, 6))
    got = jax.vmap(lambda v: math.const_dot(c, v))(jnp.asarray(x))
    np.testing.assert_allclose(got, np.einsum("mn,bnk->bmk", c, x), rtol=1e-12, atol=1e-12)
    one = math.const_dot(c, jnp.asarray(x[0]))
    assert one.shape == (ncol + 2, 6)
    np.testing.assert_allclose(one, c @ x[0], rtol=1e-12, atol=1e-12)
    assert (ncol >= math._CONST_DOT_MIN) == (ncol == 14)


def _prims(jaxpr):
    """Names of the primitives of a (closed) jaxpr, those of its sub-jaxprs included
    (jnp functions such as jnp.clip are jitted: their equations sit inside a call)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    out = set()
    for e in jaxpr.eqns:
        out.add(e.primitive.name)
        for p in e.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else [p]):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    out |= _prims(sub)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_values_as_jnp_clip_tangent_from_bounds(dtype):
    """math.clip: jnp.clip's values bit for bit (NaN, -0.0, infinities, array bounds
    broadcast); its tangent tests the operand against the bounds, never for equality
    with the result (jnp.clip's maximum / minimum do: a recomputation of the operand
    that rounds otherwise drops the tangent)."""
    import jax
    import jax.numpy as jnp
    x = np.concatenate([RNG.standard_normal(40), [np.nan, -0.0, 0.0, np.inf, -np.inf,
                                                  1.0, -1.0]]).astype(dtype)
    n = len(x)
    bounds = [(-1.0, 1.0), (0.0, -0.0), (-0.0, 0.0),
              (RNG.standard_normal(n).astype(dtype) - 1, RNG.standard_normal(n).astype(dtype) + 1)]
    for lo, hi in bounds:
        for fn in (lambda f: f, jax.jit):
            ref = np.asarray(fn(jnp.clip)(jnp.asarray(x), lo, hi))
            out = np.asarray(fn(math.clip)(jnp.asarray(x), lo, hi))
            assert out.dtype == ref.dtype
            np.testing.assert_array_equal(out.view(np.uint8), ref.view(np.uint8))
    xs = RNG.standard_normal((4, 1, 3)).astype(dtype)
    lo = -np.abs(RNG.standard_normal(3)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(math.clip(jnp.asarray(xs), lo, -lo)),
                                  np.asarray(jnp.clip(xs, lo, -lo)))
    jaxpr = jax.make_jaxpr(lambda v: jax.jvp(lambda u: math.clip(u, -1.0, 1.0), (v,), (v,)))(
        jnp.asarray(x))
    prims = _prims(jaxpr)
    assert "eq" not in prims and {"gt", "lt"} <= prims
    g = jax.grad(lambda v: math.clip(v, -0.5, 0.5).sum())(jnp.asarray([-1.0, 0.1, 2.0], dtype))
    np.testing.assert_array_equal(np.asarray(g), [0.0, 1.0, 0.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maximum_minimum_clip_amax_same_program_tangent_by_comparison(dtype):
    """math.maximum / minimum / clip_as_jnp / amax: jnp's values bit for bit (NaN,
    -0.0, infinities; traced or constant operands) from jnp's very program (the lowered
    text is jnp's); their tangents compare the operands, never test the result for
    equality with one (a recomputation that rounds otherwise would drop the tangent):
    the greater (smaller) operand's, the mean at a tie; clip_as_jnp as math.clip; amax
    the first maximal entry's."""
    import re

    import jax
    import jax.numpy as jnp
    special = [np.nan, -0.0, 0.0, np.inf, -np.inf, 1.0, -1.0, 0.5]
    x = np.concatenate([RNG.standard_normal(24), special]).astype(dtype)
    y = np.concatenate([RNG.standard_normal(24), special[::-1]]).astype(dtype)
    y[:4] = x[:4]                                               # ties
    lo = (RNG.standard_normal(len(x)) - 1).astype(dtype)
    cases = [(math.maximum, jnp.maximum, (x, y)), (math.minimum, jnp.minimum, (x, y)),
             (math.maximum, jnp.maximum, (x, 0.0)), (math.minimum, jnp.minimum, (-0.0, x)),
             (math.clip_as_jnp, jnp.clip, (x, -1.0, 1.0)), (math.clip_as_jnp, jnp.clip, (x, lo, y)),
             (math.clip_as_jnp, jnp.clip, (x, lo, 0.0))]

    def text(f, args):
        return re.sub(r"loc\(.*?\)|#loc.*", "", jax.jit(f).lower(*args).as_text())
    for ours, ref, args in cases:
        traced = [i for i, a in enumerate(args) if np.ndim(a)]
        for pick in ([traced[0]], traced):      # one array traced, the rest constants
            def call(fn, *vals):
                full = list(args)
                for i, v in zip(pick, vals):
                    full[i] = v
                return fn(*full)
            vals = [jnp.asarray(args[i]) for i in pick]
            got = np.asarray(jax.jit(lambda *v: call(ours, *v))(*vals))
            want = np.asarray(jax.jit(lambda *v: call(ref, *v))(*vals))
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
            assert (text(lambda *v: call(ours, *v), vals)
                    == text(lambda *v: call(ref, *v), vals))
            jaxpr = jax.make_jaxpr(lambda *v: jax.jvp(lambda *u: call(ours, *u), v, v))(*vals)
            assert "eq" not in _prims(jaxpr)
    a = jnp.asarray([1.0, 2.0, 3.0], dtype)
    b = jnp.asarray([2.0, 2.0, 1.0], dtype)
    ta, tb = jnp.asarray([1.0, 1.0, 1.0], dtype), jnp.asarray([10.0, 10.0, 10.0], dtype)
    np.testing.assert_array_equal(jax.jvp(math.maximum, (a, b), (ta, tb))[1], [10, 5.5, 1])
    np.testing.assert_array_equal(jax.jvp(math.minimum, (a, b), (ta, tb))[1], [1, 5.5, 10])
    g = jax.grad(lambda v: math.maximum(v, 2 * v).sum())(jnp.asarray([-1.0, 0.0, 1.0], dtype))
    np.testing.assert_array_equal(g, [1.0, 1.5, 2.0])
    g = jax.grad(lambda v: math.maximum(0.0, v).sum())(jnp.asarray([-1.0, 0.0, 1.0], dtype))
    np.testing.assert_array_equal(g, [0.0, 0.5, 1.0])
    g = jax.grad(lambda v: math.clip_as_jnp(v, -0.5, 0.5).sum())(
        jnp.asarray([-1.0, 0.1, 2.0], dtype))
    np.testing.assert_array_equal(g, [0.0, 1.0, 0.0])
    g = jax.grad(lambda h: math.clip_as_jnp(jnp.asarray([0.1, 2.0], dtype), -h, h).sum())(
        jnp.asarray(0.5, dtype))
    np.testing.assert_array_equal(g, 1.0)           # the upper bound's tangent at 2.0
    # amax: jnp.max's values and program; the tangent of the first maximal entry
    z = jnp.asarray(np.stack([x, y, x[::-1]]))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: math.amax(v, 0))(z)).view(np.uint8),
                                  np.asarray(jax.jit(lambda v: jnp.max(v, 0))(z)).view(np.uint8))
    assert text(lambda v: math.amax(v, 0), [z]) == text(lambda v: jnp.max(v, 0), [z])
    jaxpr = jax.make_jaxpr(lambda v: jax.jvp(lambda u: math.amax(u, 1), (v,), (v,)))(z)
    assert "eq" not in _prims(jaxpr)
    w = jnp.asarray([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]], dtype)
    np.testing.assert_array_equal(jax.grad(lambda v: math.amax(v, 1).sum())(w),
                                  [[0, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_is_indexing(axis):
    """math.take(x, idx, axis) equals jnp indexing along ``axis`` (1-D and 2-D static
    indices, negative ones included), traced as one gather, also under vmap."""
    import jax
    import jax.numpy as jnp
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 5, 6)))
    for idx in [np.array([3, 0, -1, 2]), np.array([[1, -2], [0, 0]])]:
        want = x[(slice(None),) * axis + (idx,)]
        np.testing.assert_array_equal(math.take(x, idx, axis), want)
        jaxpr = jax.make_jaxpr(lambda v: math.take(v, idx, axis))(x)
        assert [e.primitive.name for e in jaxpr.eqns] == ["gather"]
        got = jax.vmap(lambda v: math.take(v, idx, max(axis - 1, 0)))(x)
        np.testing.assert_array_equal(got, jax.vmap(
            lambda v: v[(slice(None),) * max(axis - 1, 0) + (idx,)])(x))
