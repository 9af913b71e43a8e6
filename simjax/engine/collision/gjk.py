"""Distance between two convex geoms by GJK (MuJoCo 4.0's mjc_ccd in distance mode,
engine_collision_gjk.c; Gilbert, Johnson and Keerthi 1988, with the signed-volume
distance subalgorithm of Montanari, Petrinic and Barbieri, ACM ToG 2017).

What mj_geomDistance runs for the pairs MuJoCo collides with mjc_Convex or mjc_BoxBox
(with native CCD): the closest point of the Minkowski difference to the origin, found
by iterating on a simplex of at most 4 support points, from the difference of the geom
centres. Spheres and capsules enter as a point and a segment, their radii added back
at the end (mjc_ccd's "inflate"). The loop runs ``opt.ccd_iterations`` times with a
mask in place of MuJoCo's early exits (same stops: distance stagnates, Frank-Wolfe
gap below tolerance, lower bound past the cutoff, origin enclosed), so it traces once
and vmaps; every branch of the subalgorithm is evaluated and the taken one selected,
in MuJoCo's arithmetic order.

Penetration (distance at most the tolerance) is not resolved here: MuJoCo then runs
EPA; :mod:`simjax.engine.sensor_geom` takes the penetration from the convex collider.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.solver_worlds import batched_like
from simjax.types import GeomType as GT

MINVAL = 1e-15
#: GJK's loop state batched from the start under vmap (read at trace time; False: as
#: made, kept to compare). vmap batches a loop body again for every round in which an
#: unbatched initial value is found batched in it (here the simplex, its weights and
#: the flags: a second round). The pusher's step traced at batch 64, under cProfile:
#: the apart pairs' GJK (convex._gjk_apart) 1.09-1.40 -> 0.82-1.55 s (medians 1.24 ->
#: 0.92, 5 fresh processes each); its forward's trace
#: (fresh processes, 3 pairs) 1.77-1.97 -> 1.70-1.84 s CPU; the geom distance sensor
#: scene (tests/engine/sensor_models/geomdist.xml, 23 pair kinds) forward at batch 64
#: 18.2 and 17.6 -> 15.9 and 16.5 s CPU; outputs bit-identical
_BATCHED_START = True
_DISCRETE = (GT.BOX, GT.MESH)


# ------------------------------------------------------------------ component helpers
def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _cross(a, b):
    return jnp.stack([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2],
                      a[0] * b[1] - a[1] * b[0]])


def _det3(a, b, c):
    return (a[0] * (b[1] * c[2] - b[2] * c[1]) + a[1] * (b[2] * c[0] - b[0] * c[2])
            + a[2] * (b[0] * c[1] - b[1] * c[0]))


def _div(a, b):
    """a / b where b is non-zero; where it is zero the quotient is never used (its
    selecting comparison fails): a finite stand-in keeps gradients finite."""
    return a / jnp.where(b == 0, 1.0, b)


def _same_sign(a, b):
    return ((a > 0) & (b > 0)) | ((a < 0) & (b < 0))


def _pick(onehot, v):
    """v[i] for the one True of ``onehot`` (4,), by selects (no gather)."""
    out = v[0]
    for i in range(1, 4):
        out = jnp.where(onehot[i], v[i], out)
    return out


def _lincomb(lam, v):
    """sum_i lam[i] v[i] over the simplex's 4 slots (unused slots have lam 0)."""
    out = lam[0] * v[0]
    for i in range(1, v.shape[0]):
        out = out + lam[i] * v[i]
    return out


# ------------------------------------------------------------------ subalgorithm
def _s1d(s1, s2):
    """Barycentric coordinates (2,) of the point of segment s1 s2 closest to the origin
    (S1D)."""
    diff = s2 - s1
    scl = -_div(_dot(s2, diff), _dot(diff, diff))
    p_o = s2 + scl * diff
    mu = s1 - s2
    # the axis of the largest |mu| (later axes win ties), selected without indexing
    one_ = jnp.abs(mu[1]) >= jnp.abs(mu[0])
    two = jnp.abs(mu[2]) >= jnp.abs(jnp.where(one_, mu[1], mu[0]))
    pick = lambda v: jnp.where(two, v[2], jnp.where(one_, v[1], v[0]))
    mu_max = pick(mu)
    c1 = pick(p_o) - pick(s2)
    c2 = pick(s1) - pick(p_o)
    same = _same_sign(mu_max, c1) & _same_sign(mu_max, c2)
    one = jnp.ones((), s1.dtype)
    return jnp.stack([jnp.where(same, _div(c1, mu_max), 0.0 * one),
                      jnp.where(same, _div(c2, mu_max), one)])


def _project_plane(v1, v2, v3):
    """(degenerate, p): the origin projected onto the plane of v1 v2 v3
    (projectOriginPlane; degenerate: a zero normal)."""
    d21, d31, d32 = v2 - v1, v3 - v1, v3 - v2
    cands = [(_cross(d32, d21), v2), (_cross(d21, d31), v1), (_cross(d31, d32), v3)]
    res, bad, done = jnp.zeros(3, v1.dtype), jnp.zeros((), bool), jnp.zeros((), bool)
    for k, (n, v) in enumerate(cands):
        nv, nn = _dot(n, v), _dot(n, n)
        p = n * _div(nv, nn)
        if k < 2:
            bad = bad | (~done & (nn == 0))
            ok = ~done & ~bad & (nv != 0) & (nn > MINVAL)
        else:
            ok = ~done & ~bad
        res = jnp.where(ok, p, res)
        done = done | ok
    return bad, res


def _minor(a, b, c, i, j):
    return (b[i] * c[j] - b[j] * c[i] - a[i] * c[j] + a[j] * c[i] + a[i] * b[j]
            - a[j] * b[i])


def _area(p, a, b):
    return p[0] * a[1] + p[1] * b[0] + a[0] * b[1] - p[0] * b[1] - p[1] * a[0] - b[0] * a[1]


def _sub_best(cands, comps, n):
    """MuJoCo's "smallest distance among the faces the origin is outside of": cands
    [(lambda (n,), squared distance)], comps whether each was skipped (inside)."""
    lam = jnp.zeros(n, cands[0][0].dtype)
    dmin = jnp.asarray(jnp.finfo(lam.dtype).max, lam.dtype)
    first = jnp.ones((), bool)
    for (lk, dk), ck in zip(cands, comps):
        take = ~ck & (first | (dk < dmin))
        lam = jnp.where(take, lk, lam)
        dmin = jnp.where(take, dk, dmin)
        first = first & ck
    return lam


def _s2d(s1, s2, s3):
    """Barycentric coordinates (3,) of the point of triangle s1 s2 s3 closest to the
    origin (S2D). The three edges' S1D run as one vmapped call (one trace)."""
    bad, p_o = _project_plane(s1, s2, s3)
    m14, m24, m34 = _minor(s1, s2, s3, 1, 2), _minor(s1, s2, s3, 0, 2), \
        _minor(s1, s2, s3, 0, 1)
    mu1, mu2, mu3 = jnp.abs(m14), jnp.abs(m24), jnp.abs(m34)
    first = (mu1 >= mu2) & (mu1 >= mu3)
    second = ~first & (mu2 >= mu3)
    m_max = jnp.where(first, m14, jnp.where(second, m24, m34))

    def drop(v):         # the two coordinates kept (the largest projection's plane)
        return jnp.stack([jnp.where(first, v[1], v[0]),
                          jnp.where(first | second, v[2], v[1])])
    a, b, c, p = drop(s1), drop(s2), drop(s3), drop(p_o)
    c31, c32, c33 = _area(p, b, c), _area(p, c, a), _area(p, a, b)
    comps = [_same_sign(m_max, x) for x in (c31, c32, c33)]
    inside = comps[0] & comps[1] & comps[2]
    z = jnp.zeros((), s1.dtype)
    # edges (s2 s3), (s1 s3), (s1 s2): the triangle without vertex 1, 2, 3
    us, vs = jnp.stack([s2, s1, s1]), jnp.stack([s3, s3, s2])
    l1 = jax.vmap(_s1d)(us, vs)
    xs = l1[:, :1] * us + l1[:, 1:] * vs
    slots = ((None, 0, 1), (0, None, 1), (0, 1, None))
    cands = [(jnp.stack([z if k is None else l1[e, k] for k in sl]), _dot(xs[e], xs[e]))
             for e, sl in enumerate(slots)]
    lam = _sub_best(cands, comps, 3)
    lam = jnp.where(inside, jnp.stack([_div(c31, m_max), _div(c32, m_max),
                                       _div(c33, m_max)]), lam)
    deg = jnp.concatenate([l1[2], z[None]])          # S1D(s1, s2)
    return jnp.where(bad, deg, lam)


def _s3d(s1, s2, s3, s4):
    """Barycentric coordinates (4,) of the point of tetrahedron s1..s4 closest to the
    origin (S3D), and the S2D coordinates (4, 3) of its faces without vertex 1..4 (the
    last is S2D(s1, s2, s3)). The faces' S2D run as one vmapped call."""
    c41, c42 = -_det3(s2, s3, s4), _det3(s1, s3, s4)
    c43, c44 = -_det3(s1, s2, s4), _det3(s1, s2, s3)
    m_det = c41 + c42 + c43 + c44
    comps = [_same_sign(m_det, x) for x in (c41, c42, c43, c44)]
    inside = comps[0] & comps[1] & comps[2] & comps[3]
    z = jnp.zeros((), s1.dtype)
    pts = jnp.stack([s1, s2, s3, s4])
    keeps = [[i for i in range(4) if i != drop] for drop in range(4)]
    faces = pts[np.array(keeps)]                          # (4, 3, 3)
    l2 = jax.vmap(_s2d)(faces[:, 0], faces[:, 1], faces[:, 2])
    xs = l2[:, :1] * faces[:, 0] + l2[:, 1:2] * faces[:, 1] + l2[:, 2:] * faces[:, 2]
    cands = []
    for drop, keep in enumerate(keeps):
        full = [z] * 4
        for k, i in enumerate(keep):
            full[i] = l2[drop, k]
        cands.append((jnp.stack(full), _dot(xs[drop], xs[drop])))
    lam = _sub_best(cands, comps, 4)
    return jnp.where(inside, jnp.stack([_div(c, m_det) for c in (c41, c42, c43, c44)]),
                     lam), l2


def _subdistance(simplex, n):
    """Barycentric coordinates (4,) of the closest point of the first ``n`` simplex
    vertices (subdistance)."""
    s = simplex
    z = jnp.zeros((), s.dtype)
    l4, faces = _s3d(s[0], s[1], s[2], s[3])
    l3 = jnp.concatenate([faces[3], z[None]])
    l2 = jnp.concatenate([_s1d(s[0], s[1]), jnp.zeros(2, s.dtype)])
    l1 = jnp.zeros(4, s.dtype).at[0].set(1.0)
    return jnp.where(n == 4, l4, jnp.where(n == 3, l3, jnp.where(n == 2, l2, l1)))


#: the subalgorithm as one ``jax.jit`` (XLA inlines it), traced once per dtype
#: whatever the pair, where each GJK loop body traced it afresh, and batched once per
#: batch size (jax caches a call's batching by its jaxpr and axes)
_SUBDISTANCE_CALL = jax.jit(inline.inlined(_subdistance))
#: read at trace time; False: the subalgorithm's equations in each loop body (kept to
#: compare)
_SUB_AS_CALL = True


# ------------------------------------------------------------------ supports
def _to_local(mat, d):
    return jnp.stack([mat[0, 0] * d[0] + mat[1, 0] * d[1] + mat[2, 0] * d[2],
                      mat[0, 1] * d[0] + mat[1, 1] * d[1] + mat[2, 1] * d[2],
                      mat[0, 2] * d[0] + mat[1, 2] * d[1] + mat[2, 2] * d[2]])


def _to_global(mat, v, pos):
    return jnp.stack([mat[k, 0] * v[0] + mat[k, 1] * v[1] + mat[k, 2] * v[2] + pos[k]
                      for k in range(3)])


def support(t, geo, d, shrunk):
    """World support point of a geom (MuJoCo's mjc_*Support) for a unit world direction
    ``d`` (3,); ``geo``: (pos (3,), mat (3, 3), size (3,), vert (nvert, 3) mesh
    vertices in the geom frame or None). ``shrunk``: a sphere as its centre, a capsule
    as its segment (mjc_pointSupport, mjc_lineSupport)."""
    pos, mat, size, vert = geo
    if t == GT.SPHERE:
        return pos if shrunk else size[0] * d + pos
    if t == GT.CAPSULE and shrunk:
        dz = mat[0, 2] * d[0] + mat[1, 2] * d[1] + mat[2, 2] * d[2]
        return mat[:, 2] * jnp.where(dz >= 0, size[1], -size[1]) + pos
    loc = _to_local(mat, d)
    if t == GT.CAPSULE:
        sup = loc * size[0]
        sup = sup.at[2].add(jnp.where(loc[2] >= 0, size[1], -size[1]))
    elif t == GT.ELLIPSOID:
        sup = loc * size
        n2 = _dot(sup, sup)
        small = n2 < MINVAL * MINVAL
        inv = 1 / jnp.sqrt(jnp.where(small, 1.0, n2))
        sup = sup * inv * size
        return jnp.where(small, mat[:, 0] * size[0] + pos, _to_global(mat, sup, pos))
    elif t == GT.CYLINDER:
        n2 = loc[0] * loc[0] + loc[1] * loc[1]
        ok = n2 >= MINVAL * MINVAL
        scl = jnp.where(ok, size[0] / jnp.sqrt(jnp.where(ok, n2, 1.0)), 0.0)
        sup = jnp.stack([scl * loc[0], scl * loc[1],
                         jnp.where(loc[2] >= 0, size[1], -size[1])])
    elif t == GT.BOX:
        sup = jnp.where(loc >= 0, size, -size)
    elif t == GT.MESH:
        pr = vert[:, 0] * loc[0] + vert[:, 1] * loc[1] + vert[:, 2] * loc[2]
        sup = vert[jnp.argmax(pr)]
    else:
        raise ValueError(f"no GJK support for geom type {t}")
    return _to_global(mat, sup, pos)


# ------------------------------------------------------------------ GJK
def _gjk(sup1, sup2, x1, x2, cutoff, tol, kmax, discrete):
    """MuJoCo's gjk() with a distance cutoff: returns (dist, x1, x2, far, separated,
    nsimplex); ``far``: stopped on the cutoff (no witness points)."""
    dtype = x1.dtype
    eps = 0.0 if discrete else 0.5 * tol * tol
    min_norm = MINVAL if discrete else tol
    zero3 = jnp.zeros((4, 3), dtype)

    def sup(x_k, x_norm):
        d_neg = x_k * (1 / x_norm)
        d = d_neg * -1.0
        v1, v2 = sup1(d), sup2(d_neg)
        return v1 - v2, v1, v2

    x_k = x1 - x2
    state = dict(s=zero3, s1=zero3, s2=zero3, n=jnp.zeros((), jnp.int32),
                 lam=jnp.zeros(4, dtype), x=x_k, xn=jnp.sqrt(_dot(x_k, x_k)),
                 xp=jnp.zeros((), dtype), active=jnp.ones((), bool),
                 far=jnp.zeros((), bool))
    if _BATCHED_START:
        # under vmap every value of the loop's state batched from the start: the loop
        # body is batched once, not again for each value found batched in it (the
        # iteration is never differentiated: its inputs carry no tangents)
        state = batched_like(jax.lax.stop_gradient(state), jax.lax.stop_gradient(x_k))

    def body(_, st):
        act = st["active"] & ~((st["xn"] < min_norm) | (jnp.abs(st["xp"] - st["xn"])
                                                        < MINVAL))
        x, xn, n = st["x"], st["xn"], st["n"]
        safe_xn = jnp.where(xn > 0, xn, 1.0)
        s_k, v1, v2 = sup(x, safe_xn)
        act = act & ~(_dot(x, x - s_k) < eps)
        lower = _dot(x, s_k)
        far = act & (lower > 0) & (lower >= cutoff * xn)
        act = act & ~far
        slot = jnp.arange(4) == n
        s = jnp.where(slot[:, None], s_k, st["s"])
        s1 = jnp.where(slot[:, None], v1, st["s1"])
        s2 = jnp.where(slot[:, None], v2, st["s2"])
        lam = (inline.outside(_SUBDISTANCE_CALL) if _SUB_AS_CALL else _subdistance)(
            s, n + 1)
        # drop the vertices with zero weight, keeping the order of the others
        keep = lam != 0
        # slot j takes the j-th kept vertex (one-hot rows, taken by selects)
        rank = jnp.cumsum(keep) - 1
        order = jnp.argmax(keep[None, :] & (rank[None, :] == jnp.arange(4)[:, None]),
                           axis=1)
        n_new = jnp.sum(keep).astype(jnp.int32)
        sel = order[:, None] == jnp.arange(4)[None, :]      # (dest, source) one-hot

        def take(v):
            return jnp.stack([_pick(sel[j], v) for j in range(4)])
        lam_c = jnp.where(jnp.arange(4) < n_new, take(lam[:, None])[:, 0], 0.0)
        s_c, s1_c, s2_c = take(s), take(s1), take(s2)
        far = far | (act & (n_new < 1))
        act = act & (n_new >= 1)
        x_new = _lincomb(lam_c, s_c)
        new = dict(s=s_c, s1=s1_c, s2=s2_c, n=n_new, lam=lam_c, x=x_new,
                   xn=jnp.sqrt(_dot(x_new, x_new)), xp=xn,
                   active=act & (n_new < 4), far=st["far"] | far)
        out = {k: jnp.where(act, new[k], st[k]) for k in ("s", "s1", "s2", "n", "lam",
                                                          "x", "xn", "xp")}
        out["active"] = new["active"]
        out["far"] = new["far"]
        return out

    st = inline.fori_loop(0, kmax, body, state)
    has = st["n"] > 0
    w1 = jnp.where(has, _lincomb(st["lam"], st["s1"]), x1)
    w2 = jnp.where(has, _lincomb(st["lam"], st["s2"]), x2)
    xn = st["xn"]
    tmp, _, _ = sup(st["x"], jnp.where(xn > 0, xn, 1.0))
    separated = _dot(st["x"], tmp) > 0
    dist = jnp.where((st["n"] == 4) & ~separated, 0.0, xn)
    return dist, w1, w2, st["far"], separated, st["n"]


def _search(t1, geo1, t2, geo2, cutoff, tol, kmax):
    """Separation distance of two convex geoms up to ``cutoff`` (mjc_ccd with
    max_contacts 1 and dist_cutoff ``cutoff``, before EPA).

    Returns (dist, x1, x2, status): ``status`` 0: separated at ``dist`` (at most the
    cutoff) with witness points x1 on geom 1 and x2 on geom 2 (world, (3,));
    1: farther than the cutoff (dist and witnesses meaningless);
    2: penetrating or touching within ``tol`` (MuJoCo runs EPA for the depth)."""
    round_ = (GT.SPHERE, GT.CAPSULE)
    c1, c2 = geo1[0], geo2[0]
    if t1 in round_ or t2 in round_:
        r1 = geo1[2][0] if t1 in round_ else 0.0
        r2 = geo2[2][0] if t2 in round_ else 0.0
        dist, x1, x2, far, _, _ = _gjk(
            lambda d: support(t1, geo1, d, True), lambda d: support(t2, geo2, d, True),
            c1, c2, cutoff + r1 + r2, tol, kmax, False)
        shallow = (dist > tol) | far       # MuJoCo: a cutoff exit reports DBL_MAX
        n = x2 - x1
        nn = jnp.sqrt(_dot(n, n))
        n = n / jnp.where(nn < MINVAL, 1.0, nn)     # mju_normalize3 (fallback unused)
        x1 = x1 + r1 * n
        x2 = x2 - r2 * n
        dist = dist - (r1 + r2)
        far = far | (shallow & (dist > cutoff))
        return dist, x1, x2, jnp.where(shallow, jnp.where(far, 1, 0), 2)
    discrete = t1 in _DISCRETE and t2 in _DISCRETE
    dist, x1, x2, far, separated, n = _gjk(
        lambda d: support(t1, geo1, d, False), lambda d: support(t2, geo2, d, False),
        c1, c2, cutoff, tol, kmax, discrete)
    touching = (dist <= tol) & (n > 1) & ~separated & ~far
    return dist, x1, x2, jnp.where(far, 1, jnp.where(touching, 2, 0))


def _attached(pos, mat, pos_s, mat_s, x):
    """World point ``x`` (found at the stopped pose pos_s, mat_s) fixed in the geom's
    frame and carried by its differentiable pose."""
    loc = _to_local(mat_s, x - pos_s)
    return _to_global(mat, loc, pos)


def distance(t1, geo1, t2, geo2, cutoff, tol, kmax):
    """Separation distance of two convex geoms up to ``cutoff`` (mjc_ccd with
    max_contacts 1 and dist_cutoff ``cutoff``, before EPA): geo = (pos (3,), mat
    (3, 3), size (3,), mesh vertices (nvert, 3) in the geom frame or None), world frame.

    Returns (dist, x1, x2, status): ``status`` 0: separated at ``dist`` (at most the
    cutoff) with witness points x1 on geom 1 and x2 on geom 2 (world, (3,));
    1: farther than the cutoff (dist and witnesses meaningless);
    2: penetrating or touching within ``tol`` (MuJoCo runs EPA for the depth).

    Derivatives: the iteration itself is not differentiated (its reverse mode, a scan
    over the subalgorithm's selects, crashed XLA's CPU compiler at full optimisation,
    jaxlib 0.10). The witness points are carried by the geom poses (fixed in each geom's
    frame), and ``dist`` differentiates as their separation: exact for the distance's
    derivative with respect to the poses (the closest points are stationary: envelope
    theorem), first order for the witness points (their sliding over curved surfaces is
    left out); derivatives with respect to sizes are zero."""
    stop = jax.lax.stop_gradient
    geo1_s = tuple(None if v is None else stop(v) for v in geo1)
    geo2_s = tuple(None if v is None else stop(v) for v in geo2)
    dist, x1, x2, status = _search(t1, geo1_s, t2, geo2_s, stop(cutoff), tol, kmax)
    y1 = _attached(geo1[0], geo1[1], geo1_s[0], geo1_s[1], x1)
    y2 = _attached(geo2[0], geo2[1], geo2_s[0], geo2_s[1], x2)
    sep = jnp.sqrt(jnp.maximum(_dot(y2 - y1, y2 - y1), MINVAL * MINVAL))
    dist = dist + (sep - stop(sep))
    return dist, y1 + (x1 - stop(y1)), y2 + (x2 - stop(y2)), status
