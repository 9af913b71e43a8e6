"""The small index and selection helpers of the primitive colliders (written with
selects and compares so that XLA on CPU fuses them) against their plain numpy
meaning, and common.once (a value computed once) as the identity, gradient included."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine.collision import common as C
from simjax.engine.collision import primitive as P
from simjax.engine.collision.common import MINVAL, argmax, argmin, once


def test_once_is_identity():
    x = jnp.asarray([[1.5, -2.25, 0.0], [3e-300, -1e300, 7.0]])
    k = jnp.asarray([0, 5, -4, 8], jnp.int32)
    b = jnp.asarray([True, False, True])
    s = jnp.asarray(-0.125)
    z = jnp.asarray([-0.0, 0.0, jnp.inf, -jnp.inf])
    ox, ok, ob, os_, oz = jax.jit(once)(x, k, b, s, z)
    assert ox.dtype == x.dtype and ok.dtype == k.dtype and ob.dtype == b.dtype
    np.testing.assert_array_equal(ox, x)
    np.testing.assert_array_equal(ok, k)
    np.testing.assert_array_equal(ob, b)
    assert float(os_) == -0.125
    np.testing.assert_array_equal(oz, z)
    np.testing.assert_array_equal(np.signbit(oz), np.signbit(z))
    assert np.asarray(jax.jit(once)(x)).tolist() == np.asarray(x).tolist()
    # more values than one concatenate takes (8): packed in groups
    many = [jnp.asarray(float(i)) for i in range(19)]
    assert [float(v) for v in jax.jit(lambda *a: once(*a))(*many)] == list(range(19))
    g = jax.grad(lambda y: jnp.sum(once(y * y, y)[0] * 3.0 + once(y)))(x)
    np.testing.assert_allclose(g, 6.0 * x + 1.0)
    # values of one shape and several dtypes: one reduction (reduce_shared), each
    # exactly itself (the dtype's lowest value and NaN included)
    f = jnp.asarray([-jnp.inf, -0.0, jnp.nan, 2.5])
    i = jnp.asarray([np.iinfo(np.int32).min, -1, 0, 9], jnp.int32)
    t = jnp.asarray([False, True, False, True])
    for v, o in zip((f, i, t), jax.jit(once)(f, i, t)):
        assert o.dtype == v.dtype
        np.testing.assert_array_equal(o, v)
        np.testing.assert_array_equal(np.signbit(o), np.signbit(v))


def test_argmin_argmax_as_jnp():
    """common.argmin / argmax (short axes: jnp's; long: the values stored once, a
    reduction, then the first index reaching it) give jnp.argmin / argmax's index:
    first of ties, NaN first, -0.0 equal to 0.0, under jit and vmap, also of an
    expression fused into the search."""
    rng = np.random.default_rng(3)
    vals = np.asarray([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.0])
    for w in (9, 40):
        assert (w > C.SHORT_ARG) == (w == 40)
        x = np.concatenate([rng.choice(vals, size=(300, w)), rng.standard_normal((50, w))])
        x[0, :9] = [np.nan, 1.0, np.nan, -np.inf, 0, 0, 0, 0, 0]
        x[1, :9] = [-0.0, 0.0, -0.0, 0.0, 1, 1, 1, -1, -1]
        x[1, 9:] = 1.0
        for dt in (jnp.float32, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32):
            xj = jnp.asarray(x, dt)
            np.testing.assert_array_equal(jax.jit(jax.vmap(argmin))(xj), jnp.argmin(xj, -1))
            np.testing.assert_array_equal(jax.jit(jax.vmap(argmax))(xj), jnp.argmax(xj, -1))
            np.testing.assert_array_equal(argmin(xj), jnp.argmin(xj, -1))
            ex = lambda a: jnp.abs(a) * 2.0 - a[::-1]         # exact: fused or not
            np.testing.assert_array_equal(jax.jit(jax.vmap(lambda a: argmin(ex(a))))(xj),
                                          jnp.argmin(jax.jit(jax.vmap(ex))(xj), -1))
        assert int(argmin(jnp.asarray(x[0]))) == 0 and int(argmax(jnp.asarray(x[0]))) == 0
        assert int(argmax(jnp.asarray(x[1]))) == 4 and int(argmin(jnp.asarray(x[1]))) == 7


def test_argmax_argmin_read_one_stored_copy():
    """On a long axis, the extreme and the first index reaching it read the same stored
    values: the expression's input is read by one kernel of the compiled program. XLA
    folds a max-reduction of :func:`once`'s max-reduction into one, which read the
    expression recomputed in a kernel of its own; its rounding could differ (float32
    at XLA's optimisation level 0), no entry then equalled the maximum, and the index
    fell on the axis' last entry."""
    def d2(p):                      # squared distances of 8 points: 64 > SHORT_ARG
        dp = p[:, None] - p[None]
        return C.dot(dp, dp).reshape(-1)

    pts = jnp.asarray(np.random.default_rng(0).standard_normal((4, 8, 3)), jnp.float32)
    for fn, ref in ((argmax, jnp.argmax), (argmin, jnp.argmin)):
        run = jax.jit(jax.vmap(lambda p: fn(d2(p))))
        text = run.lower(pts).compile().as_text()
        entry = text[text.index("\nENTRY"):]
        param = entry.split("(", 1)[1].split(":", 1)[0]           # the input's name
        reads = [ln for ln in entry.splitlines()[1:]
                 if f"%{param})" in ln or f"%{param}," in ln]
        assert len(reads) == 1, (fn.__name__, reads)
        np.testing.assert_array_equal(run(pts), ref(jax.vmap(d2)(pts), -1))


def test_top_k_as_lax_top_k():
    """common.top_k (picks by reductions for k <= SMALL_TOPK_MAX) gives lax.top_k's
    indices: ties to the lower index, -inf padding, NaN as the largest, under two vmaps
    (a collider's pairs inside the worlds, where lax.top_k is a sort on XLA CPU)."""
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=(4, 5, 67)).astype(np.float32)     # many ties
    x[:, :, 60:] = -np.inf                                             # padding
    x[1, 2, 7] = np.nan
    x[2, 0, :] = -np.inf                                               # all padding
    for k in (1, 3, 4, 6):
        ours = jax.jit(jax.vmap(jax.vmap(partial(C.top_k, k=k))))(x)
        ref = jax.vmap(jax.vmap(lambda r: jax.lax.top_k(r, k)[1]))(x)
        np.testing.assert_array_equal(ours, ref)
    with np.testing.assert_raises(ValueError):
        C.top_k(jnp.zeros(2), 3)


def test_first_where():
    """common.first_where: (index, any) of the True entry with the least score, else of
    the first True entry in row-major order; (0, 0) and False when none."""
    rng = np.random.default_rng(4)
    for shape in ((3, 4), (6, 7)):
        mask = rng.random((40,) + shape) < 0.1
        score = jnp.asarray(rng.choice([0.5, -1.0, 2.0, np.inf], size=(40,) + shape))
        for sc in (None, score):
            (i, j), hit = jax.jit(jax.vmap(lambda m, s: C.first_where(
                m, None if sc is None else s)))(jnp.asarray(mask), score)
            for b in range(40):
                flat = np.where(mask[b].reshape(-1),
                                np.zeros(mask[b].size) if sc is None
                                else np.asarray(score[b]).reshape(-1), np.inf)
                k = int(np.argmin(flat)) if (sc is not None or mask[b].any()) else 0
                assert (int(i[b]), int(j[b])) == np.unravel_index(k, shape)
                assert bool(hit[b]) == bool(mask[b].reshape(-1)[k])


def test_divmod_small():
    for d, nq in ((3, 3), (4, 3), (2, 5)):
        k = jnp.arange(d * nq, dtype=jnp.int32)
        q, r = jax.jit(jax.vmap(lambda kk: P._divmod_small(kk, d, nq)))(k)
        np.testing.assert_array_equal(q, np.arange(d * nq) // d)
        np.testing.assert_array_equal(r, np.arange(d * nq) % d)


def test_next_prev_pick3():
    i = jnp.arange(3, dtype=jnp.int32)
    np.testing.assert_array_equal(P._next3(i), (np.arange(3) + 1) % 3)
    np.testing.assert_array_equal(P._prev3(i), (np.arange(3) + 2) % 3)
    v = [jnp.asarray(10.0), jnp.asarray(-20.0), jnp.asarray(30.0)]
    assert [float(P.pick3(v, k)) for k in range(3)] == [10.0, -20.0, 30.0]
    np.testing.assert_array_equal(P._vec3(v), [10.0, -20.0, 30.0])


def test_first_best_keeps_first_of_ties():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 10))
        vals = rng.integers(0, 4, n).astype(float)      # many ties
        items = [(jnp.asarray(k, jnp.int32), jnp.asarray(-2.0 * k)) for k in range(n)]
        for better, want in ((jnp.greater, np.argmax(vals)), (jnp.less, np.argmin(vals))):
            best, (k, neg) = P._first_best([jnp.asarray(v) for v in vals], items, better)
            assert int(k) == want and float(neg) == -2.0 * want
            assert float(best) == vals[want]


def test_normalize3():
    rng = np.random.default_rng(1)
    for _ in range(20):
        v = rng.standard_normal(3)
        out = P._normalize3([jnp.asarray(x) for x in v])
        np.testing.assert_allclose([float(x) for x in out], v / np.linalg.norm(v),
                                   rtol=1e-15, atol=1e-15)
    tiny = P._normalize3([jnp.asarray(0.1 * MINVAL), jnp.asarray(0.0), jnp.asarray(0.0)])
    assert [float(x) for x in tiny] == [1.0, 0.0, 0.0]
    g = jax.grad(lambda x: P._normalize3([x, x * 0, x * 0])[0])(jnp.asarray(0.0))
    assert np.isfinite(float(g))


def _box_pairs(n, seed=0):
    """``n`` box pairs near each other, float64: random orientations, some axis-aligned
    or sharing axes (exact zeros in the relative rotation: parallel edge axes,
    ambiguous corners)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    w, x, y, z = q.T
    m = np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
                  2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
                  2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
                 1).reshape(n, 3, 3)
    m[: n // 4] = np.eye(3)
    m[n // 4: n // 3] = np.eye(3)[[1, 2, 0]]
    p1 = 0.1 * rng.standard_normal((n, 3))
    g1 = P.Geom(jnp.asarray(p1), jnp.asarray(np.eye(3)[None].repeat(n, 0)),
                jnp.asarray(rng.uniform(0.1, 1, (n, 3))))
    g2 = P.Geom(jnp.asarray(p1 + 0.8 * rng.standard_normal((n, 3))), jnp.asarray(m),
                jnp.asarray(rng.uniform(0.1, 1, (n, 3))))
    return g1, g2, jnp.full(n, 0.01)


def test_box_box_forms_agree(monkeypatch):
    """box_box with the separating-axis test's values and the edge's set-up stored (the
    default) or recomputed where read (the two switches kept for paired measurements)
    gives the same contacts bit for bit: face and edge contacts both occur among the
    pairs."""
    g1, g2, margin = _box_pairs(600)
    forms = []
    for flags in ((True, True), (True, False), (False, True), (False, False)):
        for flag, on in zip(("_SAT_STORES", "_EDGE_STAGED"), flags):
            monkeypatch.setattr(P, flag, on)
        forms.append(jax.jit(jax.vmap(P.box_box))(g1, g2, margin))
    ref = forms[0]
    valid = np.asarray(ref.valid)
    assert valid[:, 0].sum() > 20 and valid[:, 1:].sum() > 100     # edge and face
    for other in forms[1:]:
        np.testing.assert_array_equal(np.asarray(other.valid), valid)
        for a, b in zip(other[:4], ref[:4]):
            a, b = np.asarray(a)[valid], np.asarray(b)[valid]
            np.testing.assert_array_equal(a.view(np.uint64), b.view(np.uint64))


def _ref_sphere_sphere(p1, z1, r1, p2, z2, r2, margin):
    """The sphere-sphere test on 3-vectors in NumPy (mjraw_SphereSphere; the normal
    times its norm's reciprocal, as mju_normalize3)."""
    def unit(v):
        n = np.sqrt(v @ v)
        return (v * (1 / n), n) if n >= MINVAL else (np.array([1.0, 0, 0]), n)
    dif = p1 - p2
    dist = np.sqrt(dif @ dif) - r1 - r2
    n, ln = unit(p2 - p1)
    if ln < MINVAL:
        n = unit(np.cross(z1, z2))[0]
    return dist, p1 + n * (r1 + dist / 2), n, dif @ dif <= (margin + r1 + r2) ** 2


def _ref_capsule_capsule(p1, m1, r1, h1, p2, m2, r2, h2, margin):
    """MuJoCo 4.0's capsule-capsule in NumPy: the two slots' (dist, pos, normal,
    valid): the general nearest points, or for parallel axes the ends of the
    segments' overlap (segment 2's end projected onto segment 1 where it lies on it,
    else segment 1's end against its clipped projection onto segment 2)."""
    a1, a2, dif = m1[:, 2] * h1, m2[:, 2] * h2, p1 - p2
    ma, mb, mc, u, v = a1 @ a1, -(a1 @ a2), a2 @ a2, -(a1 @ dif), a2 @ dif
    det = ma * mc - mb * mb
    if det >= 1e-8 * ma * mc:
        x1, x2 = (mc * u - mb * v) / det, (ma * v - mb * u) / det
        x2 = (v - mb) / mc if x1 > 1 else (v + mb) / mc if x1 < -1 else x2
        x1 = np.clip(x1, -1, 1)
        x1 = (np.clip((u - mb) / ma, -1, 1) if x2 > 1 else
              np.clip((u + mb) / ma, -1, 1) if x2 < -1 else x1)
        x2 = np.clip(x2, -1, 1)
        ends = [(x1, x2)]
    else:
        ends = []
        for q, e in sorted([((u - mb) / ma, 1.0), ((u + mb) / ma, -1.0)]):
            t1 = np.clip(q, -1, 1)
            ends.append((q, e) if q == t1 else (t1, np.clip((v - mb * t1) / mc, -1, 1)))
    out = [_ref_sphere_sphere(p1 + a1 * t1, m1[:, 2], r1, p2 + a2 * t2, m2[:, 2], r2,
                              margin) for t1, t2 in ends]
    if len(out) == 1:
        out.append(out[0][:3] + (False,))
    return [o[:3] + (bool(o[3]),) for o in out]


def _rot_z_to(z):
    """A rotation matrix whose third column is the unit vector ``z``."""
    a = np.array([1.0, 0, 0]) if abs(z[0]) < 0.9 else np.array([0, 1.0, 0])
    x = np.cross(a, z)
    x /= np.linalg.norm(x)
    return np.stack([x, np.cross(z, x), z], 1)


def test_sphere_tests_componentwise():
    """sphere_capsule and capsule_capsule (their sphere-sphere tests written on
    components, stored by one kernel each) against the 3-vector test in NumPy: random
    pairs, coincident centres (the normal z1 x z2, or x for parallel axes) and, for
    capsule-capsule, parallel axes (the overlap's ends)."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal((40, 3))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    cases = []
    for k in range(40):
        p1, p2 = 0.2 * rng.standard_normal(3), 0.2 * rng.standard_normal(3)
        z1, z2 = z[k], z[(k + 1) % 40]
        if k % 4 == 1:
            p2 = p1.copy()                       # coincident centres
        if k % 4 == 2:
            p2, z2 = p1.copy(), z1               # coincident, parallel axes
        if k % 4 == 3:
            z2 = z1                              # parallel axes
        cases.append((p1, _rot_z_to(z1), p2, _rot_z_to(z2)))
    r1, r2, h1, h2, margin = 0.1, 0.15, 0.3, 0.25, 0.01

    def geom(p, m, r, h):
        return P.Geom(jnp.asarray(p), jnp.asarray(m), jnp.asarray([r, h, 0.0]))
    for p1, m1, p2, m2 in cases:
        # sphere-capsule: the sphere against the segment's nearest point
        pre = jax.jit(P.sphere_capsule)(geom(p1, m1, r1, 0), geom(p2, m2, r2, h2), margin)
        axis = m2[:, 2]
        near = p2 + axis * np.clip(axis @ (p1 - p2), -h2, h2)
        d, pos, n, v = _ref_sphere_sphere(p1, m1[:, 2], r1, near, axis, r2, margin)
        np.testing.assert_allclose(pre.dist[0], d, rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(pre.pos[0], pos, rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(pre.normal[0], n, rtol=1e-14, atol=1e-15)
        assert bool(pre.valid[0]) == v
        # capsule-capsule
        pre = jax.jit(P.capsule_capsule)(geom(p1, m1, r1, h1), geom(p2, m2, r2, h2),
                                         margin)
        want = _ref_capsule_capsule(p1, m1, r1, h1, p2, m2, r2, h2, margin)
        assert [bool(x) for x in pre.valid] == [w[3] for w in want]
        for s, (d, pos, n, v) in enumerate(want):
            if v:
                np.testing.assert_allclose(pre.dist[s], d, rtol=1e-12, atol=1e-14)
                np.testing.assert_allclose(pre.pos[s], pos, rtol=1e-12, atol=1e-14)
                np.testing.assert_allclose(pre.normal[s], n, rtol=1e-12, atol=1e-14)


def test_first_k_forms_match_argsort():
    """first_k by ranks (short keys) and by top_k (long keys) give the k smallest
    entries' indices in ascending key order; slots past the key's length point past it."""
    from simjax.engine.collision import chunked
    rng = np.random.default_rng(3)
    old = chunked._RANK_MAX
    try:
        for n, k in [(17, 17), (26, 25), (32, 24), (8, 11), (64, 3), (90, 35)]:
            keys = np.stack([rng.permutation(4 * n)[:n] for _ in range(40)])
            keys = keys.astype(np.int32)
            want = np.argsort(keys, axis=1)[:, :k]
            if k > n:
                pad = np.broadcast_to(np.arange(n, k), (40, k - n))
                want = np.concatenate([want, pad], 1)
            for rank_max in (0, 128):
                chunked._RANK_MAX = rank_max
                got = jax.jit(jax.vmap(partial(chunked.first_k, k=k)))(keys)
                assert got.dtype == jnp.int32
                np.testing.assert_array_equal(got, want)
    finally:
        chunked._RANK_MAX = old


def _quad_walk(p, n, tie):
    """MuJoCo's polygonQuad (engine_collision_gjk.c) in plain numpy, by index: for each
    corner a, advance d while the quadrilateral's area grows, after each advance c then b
    likewise; then move b, c, d off a."""
    def area(a, b, c, d):
        return 0.5 * np.linalg.norm(np.cross(p[a] - p[c], p[b] - p[d]))

    def nx(i):
        return 0 if i >= n - 1 else i + 1
    b, c, d = 1, 2, 3
    m, res = area(0, 1, 2, 3), [0, 1, 2, 3]
    for a in range(n):
        while area(a, b, c, nx(d)) > m * (1 + tie):
            d = nx(d)
            m, res = area(a, b, c, d), [a, b, c, d]
            while area(a, b, nx(c), d) > m * (1 + tie):
                c = nx(c)
                m, res = area(a, b, c, d), [a, b, c, d]
            while area(a, nx(b), c, d) > m * (1 + tie):
                b = nx(b)
                m, res = area(a, b, c, d), [a, b, c, d]
        if b == a:
            b = nx(b)
            if c == b:
                c = nx(c)
                if d == c:
                    d = nx(d)
    return res


def test_polygon_quad_walks_as_mujoco():
    """convex_polytope._polygon_quad (the walk as one loop, vmapped) picks the corners
    MuJoCo's nested walk picks, on 600 convex polygons of 5-29 vertices in a 40-slot
    buffer: random, regular (ties everywhere) and with rounded coordinates, with and
    without the cylinder patches' relative tie."""
    from simjax.engine.collision.convex_polytope import _polygon_quad
    rng = np.random.default_rng(3)
    polys, ns = [], []
    for k in range(600):
        n = int(rng.integers(5, 30))
        ang = (np.linspace(0, 2 * np.pi, n, endpoint=False) if k % 3 == 0
               else np.sort(rng.uniform(0, 2 * np.pi, n)))
        r = rng.uniform(0.5, 1.5, n) if k % 3 == 1 else np.ones(n)
        pts = np.stack([r * np.cos(ang), r * np.sin(ang), rng.normal(0, 1e-3, n)], 1)
        if k % 4 == 0:
            pts = np.round(pts, 2)
        buf = np.zeros((40, 3))
        buf[:n] = pts
        polys.append(buf)
        ns.append(n)
    polys, ns = np.asarray(polys), np.asarray(ns)
    for tie in (0.0, 1e-6):
        got = np.asarray(jax.jit(jax.vmap(partial(_polygon_quad, tie=tie)))(
            jnp.asarray(polys), jnp.asarray(ns)))
        want = np.asarray([_quad_walk(p, n, tie) for p, n in zip(polys, ns)])
        np.testing.assert_array_equal(got, want)
