"""One geom against the triangular prisms of a height field: the per-prism part of
MuJoCo's mjc_ConvexHField (engine_collision_convex.c), which runs its convex collider
(mjc_ccd: GJK / EPA, engine_collision_gjk.c) on each prism. hfield.py plans the sub-grid
window and builds the prisms; the functions here return (dist, pos, normal) per prism
(see hfield.py's module docstring for the method per geom type and the differences
from MuJoCo):

- prism geometry: face planes, edges, closest points on the boundary and of segments;
- spheres: ``_sphere_canon``, component-major over all prisms at once, each in its
  triangle's canonical frame (closest point of the prism without its top face, or of
  the top triangle);
- capsules: ``_capsule_prism`` (closest points outside, separating axes crossing);
- boxes, meshes, ellipsoids, cylinders: ``_convex_prism`` (separating axes, refined
  over unit directions for curved geoms: the ellipsoid's own ascent and Newton polish,
  the cylinder's by convex.py's ridge-stepping ascent and per-vertex optimum).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.collision import convex as CV
from simjax.engine.collision.common import (MINVAL, argmax, argmin, cross, dot, normalize,
                                            rot, rot_t, safe_norm, sel, top_k)
from simjax.engine.collision.primitive import Geom
from simjax.engine.math import clip, where
from simjax.types import GeomType as GT

#: refinement iterations for ellipsoids against a prism, and Newton steps of each of
#: :func:`_ellipsoid_polish`'s problems (6 vertices and 9 edges; then from 2 starts). The
#: polish is the ellipsoid's cost: with 60 and 12, touch_grid's ellipsoid resting on
#: its height field (390 prisms refined a world) stepped in 12.7-13.0 ms CPU per world
#: (settled states, batch 64, float32), with 15 and 4 in 6.2-6.3 ms (20 and 6:
#: 7.6-8.0). Against 60 and 12, at 40 touch_grid states in float64: same contacts,
#: distances within 7e-17, positions 7.4e-9, normals 1.6e-8 (the separation is flat
#: at its optimum); 10 and 3, even 0 refine iterations, agreed as well. The random
#: field's distance errors against MuJoCo unchanged (median 1.9e-7 and 7.3e-8, 99%
#: 5.3e-6 and 6.3e-6, max 9e-4 at margins 0 and 0.01)
REFINE_ITERS = 15
POLISH_ITERS = 4
#: iterations of convex.refine for cylinders against a prism: on the tests' random
#: field, 20 gave the contacts of 40 (distance errors, counts) at 131 against 294 ms
#: per collision call (256 worlds, float64; the former plain ascent: 60 ms)
CYLINDER_ITERS = 20

_FIXED_DIRS = np.array([(x, y, z) for x in (-1, 0, 1) for y in (-1, 0, 1) for z in (-1, 0, 1)
                        if (x, y, z) != (0, 0, 0)], np.float64)
_FIXED_DIRS /= np.linalg.norm(_FIXED_DIRS, axis=1, keepdims=True)


# --------------------------------------------------------------------------- supports
def _top(n, v):
    """max_k n . v_k over the prism's vertices v (6, 3) for directions n (..., 3),
    written out: vmapped over prisms and worlds, ``n @ v.T`` was a batched matrix
    kernel of its own (contraction 3; YNNPACK on CPU), the largest of touch_grid's
    settled step."""
    x, y, z = n[..., 0:1], n[..., 1:2], n[..., 2:3]
    return jnp.max(x * v[:, 0] + y * v[:, 1] + z * v[:, 2], -1)


def _support(t, size, vert, mat, pos, d):
    """World (height-field frame) support point of a geom for directions d (..., 3)
    (the rotations written out, as :func:`_top`)."""
    ld = rot_t(mat, d)
    if t == GT.SPHERE:
        u, _ = normalize(ld)
        loc = u * size[0]
    elif t == GT.CAPSULE:
        u, _ = normalize(ld)
        loc = u * size[0] + jnp.asarray([0, 0, 1.0], d.dtype) * sel(
            ld[..., 2:3] >= 0, size[1], -size[1])
    elif t == GT.ELLIPSOID:
        u, _ = normalize(ld * size)
        loc = u * size
    elif t == GT.CYLINDER:
        xy = ld * jnp.asarray([1.0, 1.0, 0.0], d.dtype)
        u, n = normalize(xy)
        u = sel((n > MINVAL)[..., None], u, 0.0)
        loc = u * size[0] + jnp.asarray([0, 0, 1.0], d.dtype) * sel(
            ld[..., 2:3] >= 0, size[1], -size[1])
    elif t == GT.BOX:
        loc = sel(ld >= 0, size, -size)
    elif t == GT.MESH:
        pr = ld @ vert.T
        loc = vert[argmax(pr)]
    else:
        raise ValueError(t)
    return rot(mat, loc) + pos


# --------------------------------------------------------------------------- prisms
def _prism_planes(v, base):
    """Outward unit normals (5, 3) and offsets (5,) of a prism's faces: top, bottom,
    three sides (side i through top vertices i and i+1)."""
    t = v[3:]
    dt = v.dtype
    ntop = cross(t[1] - t[0], t[2] - t[0])
    ntop = sel(ntop[2] < 0, -ntop, ntop)
    ntop, _ = normalize(ntop)
    nbot = jnp.asarray([0.0, 0.0, -1.0], dt)
    e = jnp.roll(t, -1, axis=0) - t                         # edges i -> i+1
    side = jnp.stack([e[:, 1], -e[:, 0], jnp.zeros(3, dt)], -1)
    side, _ = normalize(side)
    cen = (t[0] + t[1] + t[2]) / 3
    out = dot(side, cen - t) > 0
    side = sel(out[:, None], -side, side)
    nrm = jnp.concatenate([ntop[None], nbot[None], side])
    off = jnp.concatenate([dot(ntop, t[0])[None], jnp.asarray(base, dt)[None],
                           dot(side, t)])
    return nrm, off


def _prism_edges(v):
    """The prism's 9 edges as (9, 2, 3) end points: the top edges i -> i+1, the bottom
    edges i -> i+1, the vertical edges bottom i -> top i (two concatenations: a stack
    per edge costs a kernel each)."""
    b, t = v[:3], v[3:]

    def roll(x):
        return jnp.concatenate([x[1:], x[:1]])
    return jnp.stack([jnp.concatenate([t, b, b]), jnp.concatenate([roll(t), roll(b), t])], 1)


def _point_prism(p, v, nrm, off):
    """Closest point on the prism boundary to point p (outside): the projection of p
    on a face plane where it falls in that face (a convex polytope's face is its part
    of the plane: the projection satisfies the other four planes), else the closest
    point of the 9 edges (vertices included). Exact as the closest point over the
    boundary triangles, with 5 projections and 9 segments instead of 8 triangles'
    projections and 24 segments. ``nrm``, ``off``: the prism's planes
    (:func:`_prism_planes`)."""
    s = dot(nrm, p) - off                                        # (5,) heights
    q = p - s[:, None] * nrm                                     # projections
    # viol[f, j]: projection on face f against plane j (0 on f itself)
    viol = (q[:, None, 0] * nrm[None, :, 0] + q[:, None, 1] * nrm[None, :, 1] +
            q[:, None, 2] * nrm[None, :, 2]) - off[None, :]
    viol = sel(jnp.eye(5, dtype=bool), -1.0, viol)
    inface = (s > 0) & jnp.all(viol <= 0, axis=1)
    edges = _prism_edges(v)
    qe = CV.seg_closest(p, edges[:, 0], edges[:, 1])            # (9, 3)
    cand = jnp.concatenate([q, qe])
    dc = cand - p
    d2 = sel(jnp.concatenate([inface, jnp.ones(9, bool)]), dot(dc, dc), jnp.inf)
    pick = jnp.arange(14) == argmin(d2)
    return jnp.sum(sel(pick[:, None], cand, 0.0), 0)


def _seg_seg(a0, a1, b0, b1):
    """Closest points (x on a, y on b) of two segments (Ericson 5.1.9, guarded)."""
    d1, d2, r = a1 - a0, b1 - b0, a0 - b0
    aa, ee, f = dot(d1, d1), dot(d2, d2), dot(d2, r)
    c, bb = dot(d1, r), dot(d1, d2)
    den = aa * ee - bb * bb

    def safe(x):
        return sel(jnp.abs(x) > MINVAL, x, 1.0)
    s = sel(den > MINVAL * jnp.maximum(aa * ee, MINVAL),
            clip((bb * f - c * ee) / safe(den), 0.0, 1.0), 0.0)
    t = (bb * s + f) / safe(ee)
    s = sel(t < 0, clip(-c / safe(aa), 0.0, 1.0),
            sel(t > 1, clip((bb - c) / safe(aa), 0.0, 1.0), s))
    t = clip(t, 0.0, 1.0)
    return a0 + s * d1, b0 + t * d2


# --------------------------------------------------------------------------- per prism
# component-major sphere maths: 3-vectors as tuples of (P,) arrays (one entry per prism),
# where an entry may be the Python float 0.0 (a static zero: its terms are skipped)
def _z(x):
    return isinstance(x, float) and x == 0.0


def _vsub(a, b):
    return tuple(0.0 if x is y else x if _z(y) else -y if _z(x) else x - y
                 for x, y in zip(a, b))


def _vdot(a, b):
    terms = [x * y for x, y in zip(a, b) if not (_z(x) or _z(y))]
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def _same(a, b):
    return isinstance(a, float) and isinstance(b, float) and a == b


class _Like:
    """Constant (P,) arrays of one shape and dtype, made once per value (vmapped, each
    new constant is a broadcast equation)."""

    def __init__(self, a):
        self.shape, self.dtype, self._c = a.shape, a.dtype, {}

    def full(self, v):
        if v not in self._c:
            self._c[v] = jnp.full(self.shape, v, self.dtype)
        return self._c[v]


def _vsel(c, a, b, like):
    return tuple(x if _z(x) and _z(y) else
                 sel(c, like.full(0.0) if _z(x) else x, like.full(0.0) if _z(y) else y)
                 for x, y in zip(a, b))


def _vnormalize(a, like):
    """(a / |a|, |a|) as :func:`normalize` ((1, 0, 0) below mjMINVAL); ``like``: the
    components' :class:`_Like`."""
    sq = _vdot(a, a)
    ok = sq > MINVAL * MINVAL
    n = sel(ok, jnp.sqrt(sel(ok, sq, like.full(1.0))), like.full(0.0))
    ok = n >= MINVAL
    den = sel(ok, n, like.full(1.0))
    unit = (1.0, 0.0, 0.0)
    out = tuple(x if _z(x) and u == 0 else
                sel(ok, like.full(0.0) if _z(x) else x / den, like.full(u))
                for x, u in zip(a, unit))
    return out, n


def _sphere_canon(z, p, dx, dy, base, r):
    """(dist, normal) of a sphere of radius r against P prisms in the canonical
    frame of their triangle: top vertices A = (0, dy, z[0]), B = (0, 0, z[1]),
    C = (dx, dy, z[2]) (the first triangle of a cell in the cell's frame; the second,
    turned half a turn about the cell's centre, is the same), bottom at -base; ``z``
    and the centre ``p`` three (P,) arrays each. Outputs (P,) and a three-tuple of (P,)
    arrays, in the canonical frame: one expression (its caller stores it once; the
    contact position is the centre less the normal times r + dist / 2).

    The prism is the triangle T = ABC's (x, y) extent from z = -base up to the top
    plane. Its closest point to a centre outside: B' = (the closest point of T to the
    centre's (x, y), the centre's z raised to -base) when B' lies below the top plane
    (the closest point without the top face's constraint, so the closest point);
    otherwise the top face's constraint holds at the closest point, which is the
    closest point of the top triangle (the plane projection if it falls in ABC, else
    the closest of the three top edges). Four candidates where every face and edge
    of the prism were fourteen. Centre inside: the nearest face, as before."""
    za, zb, zc = z
    px, py, pz = p
    L = float(np.hypot(dx, dy))
    a3, b3 = dy / L, dx / L                       # diagonal side's normal (a3, -b3, 0)
    like = _Like(za)
    one = like.full(1.0)
    # the top plane (normal (tx, ty, tz), offset to) and the centre's height over it
    ex, ey = -dy * (zc - za), dx * (zb - za)
    ez = dx * dy
    # one quotient, not three: XLA keeps a costly operation read more than once in its
    # consumer out of it (a kernel of its own)
    inv = 1 / jnp.sqrt(ex * ex + ey * ey + ez * ez)
    tx, ty, tz = ex * inv, ey * inv, ez * inv
    to = ty * dy + tz * za
    s0 = tx * px + ty * py + tz * pz - to
    # heights over the bottom and the three sides (x = 0, the diagonal, y = dy)
    s1, s2, s3, s4 = -(pz + base), -px, a3 * px - b3 * py, py - dy

    def nearest(cands):        # first of the (distance, point) candidates nearest
        best, q = cands[0]
        for dj, qj in cands[1:]:
            closer = dj < best
            best = where(closer, dj, best)
            q = tuple(a if _same(a, b) else where(closer, a, b) for a, b in zip(qj, q))
        return q
    # closest point of T to (px, py): the closest point of the quadrant x >= 0, y <= dy
    # (clamped coordinates) where it lies in T, else (the diagonal's constraint then
    # holds at the closest point) the closest point of the diagonal from B to C
    qx, qy = jnp.maximum(px, 0.0), jnp.minimum(py, dy)
    w = clip((px * dx + py * dy) / (dx * dx + dy * dy), 0.0, 1.0)
    in_t = a3 * qx - b3 * qy <= 0
    bx, by = where(in_t, qx, w * dx), where(in_t, qy, w * dy)
    bz = jnp.maximum(pz, -base)
    below = tx * bx + ty * by + tz * bz - to <= 0
    # closest point of the top triangle: the plane projection inside ABC, else the
    # nearest point of its edges A -> B, B -> C, C -> A
    q0 = (px - s0 * tx, py - s0 * ty, pz - s0 * tz)
    in0 = (q0[0] >= 0) & (a3 * q0[0] - b3 * q0[1] <= 0) & (q0[1] <= dy)
    tedge = [((0.0, dy, za), (0.0, -dy, zb - za)), ((0.0, 0.0, zb), (dx, dy, zc - zb)),
             ((dx, dy, zc), (-dx, 0.0, za - zc))]
    ecand = []
    for (ax, ay, az), (vx, vy, vz) in tedge:
        den = vx * vx + vy * vy + vz * vz
        num = (px - ax) * vx + (py - ay) * vy + (pz - az) * vz
        u = clip(num / where(den > MINVAL, den, one), 0.0, 1.0)
        q = tuple(a if _z(v) else a + u * v for a, v in ((ax, vx), (ay, vy), (az, vz)))
        ecand.append((_vdot(_vsub(p, q), _vsub(p, q)), q))
    qe = nearest(ecand)
    q = tuple(where(below, b, where(in0, a, e)) for a, b, e in zip(q0, (bx, by, bz), qe))
    # centre inside: the nearest face (first maximum of the heights)
    fn = [(tx, ty, tz), (0.0, 0.0, -1.0), (-1.0, 0.0, 0.0), (a3, -b3, 0.0), (0.0, 1.0, 0.0)]
    sk, nk = s0, fn[0]
    for f, sf in enumerate((s1, s2, s3, s4), 1):
        better = sf > sk
        sk = where(better, sf, sk)
        nk = tuple(where(better, like.full(a) if isinstance(a, float) else a, b)
                   for a, b in zip(fn[f], nk))
    inside = sk <= 0
    n_out, dd = _vnormalize(_vsub((px, py, pz), q), like)
    n = _vsel(inside, nk, n_out, like)
    return where(inside, sk, dd) - r, n


def _sep_axes(axes, v, lo):
    """Separation along unit axes (A, 3) of a prism (vertices v) and a shape whose
    minimum projection along each axis is lo (A,): min(shape) - max(prism)."""
    return lo - _top(axes, v)


def _capsule_prism(v, base, a0, a1, r):
    """(dist, pos, normal) of a capsule (segment a0 a1, radius r) against prism v."""
    nrm, off = _prism_planes(v, base)
    edges = _prism_edges(v)
    seg = a1 - a0
    ed = edges[:, 1] - edges[:, 0]
    cr, ln = normalize(cross(ed, seg))
    cr = sel((ln > 1e-9)[:, None], cr, nrm[:1])
    axes = jnp.concatenate([nrm, cr, -cr])
    lo = jnp.minimum(axes @ a0, axes @ a1)
    s = _sep_axes(axes, v, lo)
    k = argmax(s)
    n_sat, s_sat = axes[k], s[k]
    crossing = s_sat <= 0
    # separated: closest points of the segment and the prism boundary
    qa0, qa1 = _point_prism(a0, v, nrm, off), _point_prism(a1, v, nrm, off)
    xe, ye = jax.vmap(_seg_seg, (None, None, 0, 0))(a0, a1, edges[:, 0], edges[:, 1])
    xs = jnp.concatenate([a0[None], a1[None], xe])
    ys = jnp.concatenate([qa0[None], qa1[None], ye])
    dxy = xs - ys
    j = argmin(dot(dxy, dxy))
    n_out, dd = normalize(xs[j] - ys[j])
    # crossing: witness on the segment along the best axis
    is_face = k < 5
    e_lo = sel(dot(n_sat, a0) <= dot(n_sat, a1), 0, 1)
    xf = sel(e_lo == 0, a0, a1)
    ke = sel(k >= 5 + 9, k - 14, k - 5)
    kc = jnp.clip(ke, 0, 8)
    xc, _ = _seg_seg(a0, a1, edges[kc, 0], edges[kc, 1])
    xin = sel(is_face, xf, xc)
    n = sel(crossing, n_sat, n_out)
    dist = sel(crossing, s_sat, dd) - r
    x = sel(crossing, xin, xs[j])
    pos = x - n * (r + 0.5 * dist)
    return dist, pos, n


def _geom_axes(t, mat, mesh):
    """Face normals and edge directions of a geom (height-field frame)."""
    dt = mat.dtype
    if t == GT.BOX:
        return mat.T, mat.T
    if t == GT.MESH:
        return jnp.asarray(mesh[1], dt) @ mat.T, jnp.asarray(mesh[2], dt) @ mat.T
    if t == GT.CYLINDER:
        return mat[:, 2][None], mat[:, 2][None]
    if t == GT.CAPSULE:
        return jnp.zeros((0, 3), dt), mat[:, 2][None]
    return jnp.zeros((0, 3), dt), jnp.zeros((0, 3), dt)


def _mesh_sep(vert, mat, pos, mesh, v, dirs, nfirst):
    """sep of a mesh against prism v along _convex_prism's directions (prism normals
    (nfirst), then the mesh face normals gf and -gf, then the rest), for the best
    direction's index only (no gradient). Along its own face normals the mesh's
    support values come from its static hull table; the others are reduced in
    bounded chunks (convex.mesh_support)."""
    from simjax.engine.collision import convex
    vert, mat, pos, v, dirs = jax.lax.stop_gradient((vert, mat, pos, v, dirs))
    nf = mesh[1].shape[0]
    hface = jnp.asarray(mesh[3], dirs.dtype)
    off = dirs[nfirst:nfirst + nf] @ pos
    # mesh support along -n: -gf for n = gf, gf for n = -gf
    rest = jnp.concatenate([dirs[:nfirst], dirs[nfirst + 2 * nf:]])
    hr = dot(convex.mesh_support(vert, mat, pos, -rest), rest)
    hm = jnp.concatenate([hr[:nfirst], off - hface[:, 1], -off - hface[:, 0], hr[nfirst:]])
    return hm - _top(dirs, v)


def _convex_prism(t, size, vert, mat, pos, mesh, v, base):
    """(dist, pos, normal) of a convex geom against prism v: separating axes (exact for
    boxes and meshes) refined over unit directions for curved geoms."""
    dt = v.dtype
    nrm, _ = _prism_planes(v, base)
    pedge = _prism_edges(v)
    pdir, _ = normalize(pedge[:, 1] - pedge[:, 0])
    gf, ge = _geom_axes(t, mat, mesh)
    dirs = [nrm, gf, -gf]
    if ge.shape[0]:
        c, ln = normalize(cross(pdir[:, None, :], ge[None, :, :]).reshape(-1, 3))
        c = sel((ln > 1e-9)[:, None], c, nrm[:1])
        dirs += [c, -c]
    cdif, _ = normalize(pos - jnp.mean(v, 0))
    dirs += [cdif[None], jnp.asarray(_FIXED_DIRS, dt), mat.T, -mat.T]
    dirs = jnp.concatenate(dirs)

    def sep(n):
        b = _support(t, size, vert, mat, pos, -n)
        return dot(b, n) - _top(n, v)

    s = _mesh_sep(vert, mat, pos, mesh, v, dirs, nrm.shape[0]) if t == GT.MESH else sep(dirs)
    k = argmax(s)
    n, sb = dirs[k], s[k]
    if t in (GT.BOX, GT.MESH):
        # apart within the margin: the closest points' direction when it is not an
        # axis (convex.corner_axis; the axes alone bound the distance from below, up to
        # 2.7e-3 off on the tests' random field)
        geo = Geom(pos, mat, size, vert)
        nc = CV.corner_axis(v, CV.near_vertices(t, geo, -n))
        n = sel(sep(nc[None])[0] > sb, nc, n)
    elif t == GT.CYLINDER:
        # the ascent with steps kept on the ridges of the cylinder (its axis) and of the
        # prism (between its best vertices), as convex-convex pairs
        eye = jnp.eye(3, dtype=dt)
        prism = Geom(jnp.zeros(3, dt), eye, jnp.zeros(3, dt), v,
                     {"nvert": jnp.asarray(6)})
        scale = jnp.maximum(jnp.max(size) + jnp.max(jnp.abs(v)), 1e-9)
        n, sb = CV.refine(GT.MESH, prism, t, Geom(pos, mat, size), n, sb, scale,
                          iters=CYLINDER_ITERS)
        # and the exact optimum of each prism vertex alone
        cands = jnp.concatenate([n[None], jax.vmap(
            lambda p: CV.point_cylinder_dir(p, pos, mat[:, 2], size[0], size[1]))(v)])
        n = cands[argmax(sep(cands))]
    elif t == GT.ELLIPSOID:
        scale = jnp.maximum(jnp.max(size) + jnp.max(jnp.abs(v)), 1e-9)

        def body(carry, _):
            n, sb, eta = carry
            b = _support(t, size, vert, mat, pos, -n)
            a = v[argmax(v @ n)]
            g = b - a
            gt = g - n * dot(g, n)
            trial, _ = normalize(n + eta * gt)
            st = sep(trial)
            better = st > sb
            return (sel(better, trial, n), sel(better, st, sb),
                    sel(better, eta * 1.5, eta * 0.3)), None

        (n, sb, _), _ = inline.scan(body, (n, sb, 1.0 / scale), None, length=REFINE_ITERS)
        # polish from the better of the refined and the top-face normals (the polish
        # from each, the better result kept, before: the same contacts on the tests'
        # fields; touch_grid's settled step 6.0 -> 4.1 ms CPU per world, batch 64)
        starts = jnp.concatenate([n[None], nrm[:1]])
        n = _ellipsoid_polish(size, mat, pos, v, starts[argmax(sep(starts))], sep)
    b = _support(t, size, vert, mat, pos, -n)
    dist = sep(n)
    pos_b = b - n * (0.5 * dist)
    if t not in (GT.BOX, GT.MESH, GT.CYLINDER):
        return dist, pos_b, n
    # witness: the geom's support point when unique, else the prism's when unique; an
    # edge against an edge: the midpoint of their closest points (EPA's witnesses,
    # unique there), not an end of the geom's edge
    tol = 1e-9 * (jnp.max(jnp.abs(v)) + jnp.max(size) + jnp.max(jnp.abs(pos)))
    pr = v @ n
    top = _top3_last(pr)
    pv = pr[top]
    prism_unique = pv[-1] - pv[-2] > tol
    prism_edge = ~prism_unique & (pv[-2] - pv[-3] > tol)
    b0, b1, geom_unique, geom_edge = _support_feature(t, size, vert, mat, pos, -n, tol)
    a = v[top[-1]]
    wit = sel(prism_unique & ~geom_unique, a + n * (0.5 * dist), pos_b)
    ca, cb = _seg_seg(a, v[top[-2]], b0, b1)
    return dist, sel(prism_edge & geom_edge, 0.5 * (ca + cb), wit), n


def _top3_last(pr):
    """The last three entries of ``jnp.argsort(pr)`` (the three largest, ascending;
    among equal values the higher index last, as the stable sort orders them), by
    :func:`~simjax.engine.collision.common.top_k` of the reversed values
    (:data:`_TOP3_BY_REDUCTIONS`; False: the argsort, a sort per prism under vmap)."""
    if not _TOP3_BY_REDUCTIONS:
        return jnp.argsort(pr)[-3:]
    n = pr.shape[-1]
    return (n - 1 - top_k(pr[::-1], 3))[::-1]


#: :func:`_top3_last` by reductions, read at trace time. A box on the tests' random
#: height field (margin 1 cm, 64 random poses, float32, the collision stage, paired in
#: one process): 0.939 [0.864, 1.101] and 0.951 [0.913, 1.033] of the time (8 and 10
#: rounds), a cylinder 0.993 [0.917, 1.191] (8); contacts bit-identical
_TOP3_BY_REDUCTIONS = True


def _support_feature(t, size, vert, mat, pos, d, tol):
    """The geom's support segment along world direction ``d`` (two world points),
    whether the support point is unique and whether the support feature is exactly an
    edge (ties within ``tol`` along d): a box's vertex / edge (no / one local component
    of d near zero), a mesh's best vertex / two best vertices, a cylinder's rim point /
    side line (d across the axis)."""
    dt = mat.dtype
    ld = mat.T @ d
    if t == GT.BOX:
        small = jnp.abs(ld) * size <= tol
        j = argmax(small)
        base = sel(ld >= 0, size, -size)
        pick = jnp.arange(3) == j
        p0, p1 = sel(pick, -size, base), sel(pick, size, base)
        unique, edge = ~jnp.any(small), jnp.sum(small) == 1
    elif t == GT.MESH:
        pr = jnp.asarray(vert, dt) @ ld
        k = top_k(pr, 3)
        p0, p1 = vert[k[0]], vert[k[1]]
        unique = pr[k[0]] - pr[k[1]] > tol
        edge = ~unique & (pr[k[1]] - pr[k[2]] > tol)
    else:                                                   # cylinder
        xy, nxy = normalize(ld * jnp.asarray([1.0, 1.0, 0.0], dt))
        rim = xy * size[0]
        ez = jnp.asarray([0.0, 0.0, 1.0], dt) * size[1]
        p0, p1 = rim - ez, rim + ez
        across = jnp.abs(ld[2]) * size[1] <= tol
        unique = ~across & (nxy * size[0] > tol)
        edge = across & (nxy * size[0] > tol)
    return p0 @ mat.T + pos, p1 @ mat.T + pos, unique, edge


def _ellipsoid_polish(size, mat, pos, v, n0, sep):
    """Newton polish of the ellipsoid-prism separation for every active set of prism
    features: each vertex k (maximise s_k(n) = (c - v_k).n - sqrt(n'Qn) over unit n,
    Q = R S^2 R') and each edge (the same on the great circle orthogonal to the edge),
    started from n0. The true separation (all vertices) picks the best of n0 and the
    polished directions, so the optimum is found to Newton accuracy whenever its active
    set's local maximum is the one reached from n0."""
    dt = v.dtype
    q = (mat * (size * size)[None, :]) @ mat.T

    def parts(w, n):
        qn = q @ n
        sig = jnp.sqrt(jnp.maximum(dot(n, qn), MINVAL))
        grad = w - qn / sig
        hess = -q / sig + jnp.outer(qn, qn) / sig ** 3
        return grad, hess

    def basis(n):
        a = sel(jnp.abs(n[0]) < 0.6, jnp.asarray([1.0, 0, 0], dt),
                jnp.asarray([0, 1.0, 0], dt))
        t1, _ = normalize(cross(n, a))
        return jnp.stack([t1, cross(n, t1)], -1)           # (3, 2)

    def vertex(vk):
        w = pos - vk

        def step(n, _):
            grad, hess = parts(w, n)
            tb = basis(n)
            gt = tb.T @ grad
            ht = tb.T @ hess @ tb - dot(n, grad) * jnp.eye(2, dtype=dt)
            det = ht[0, 0] * ht[1, 1] - ht[0, 1] * ht[1, 0]
            nd = (ht[0, 0] < 0) & (det > MINVAL)
            inv = jnp.stack([jnp.stack([ht[1, 1], -ht[0, 1]]),
                             jnp.stack([-ht[1, 0], ht[0, 0]])]) / sel(nd, det, 1.0)
            dlt = sel(nd, -inv @ gt, gt * 0.1)
            ln = safe_norm(dlt)
            dlt = dlt * jnp.minimum(1.0, 0.5 / jnp.maximum(ln, MINVAL))
            out, _ = normalize(n + tb @ dlt)
            return out, None

        n, _ = inline.scan(step, n0, None, length=POLISH_ITERS)
        return n

    def edge(va, vb):
        w = pos - va
        u, _ = normalize(vb - va)
        p0, ok = normalize(n0 - u * dot(n0, u))
        p0 = sel(ok > 1e-9, p0, basis(u)[:, 0])
        q0 = cross(u, p0)

        def step(th, _):
            n = jnp.cos(th) * p0 + jnp.sin(th) * q0
            dn = -jnp.sin(th) * p0 + jnp.cos(th) * q0
            grad, hess = parts(w, n)
            g1 = dot(grad, dn)
            g2 = dn @ hess @ dn - dot(grad, n)
            dth = sel(g2 < -MINVAL, -g1 / sel(g2 < -MINVAL, g2, -1.0), 0.1 * g1)
            return th + clip(dth, -0.5, 0.5), None

        th, _ = inline.scan(step, jnp.zeros((), dt), None, length=POLISH_ITERS)
        return jnp.cos(th) * p0 + jnp.sin(th) * q0

    ends = _prism_edges(v)
    cands = jnp.concatenate([n0[None], jax.vmap(vertex)(v),
                             jax.vmap(edge)(ends[:, 0], ends[:, 1])])
    s = sep(cands)
    return cands[argmax(s)]
