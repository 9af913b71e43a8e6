"""Height-field collisions (MuJoCo's mjc_ConvexHField, engine_collision_convex.c).

A height field is a grid of ``nrow x ncol`` elevations over ``[-x, x] x [-y, y]`` in its
geom frame (``hfield_size`` = (x, y, elevation z, base z); vertex ``(r, c)`` sits at
``(c dx - x, r dy - y, hfield_data[r ncol + c] z)`` with ``dx = 2x / (ncol - 1)``,
``dy = 2y / (nrow - 1)``). Each cell ``(r, c)`` is cut along its diagonal from vertex
``(r, c)`` to ``(r + 1, c + 1)`` into two triangles; each triangle, extruded down to
``-base z``, is a convex triangular prism. MuJoCo collides the other geom with every
prism of the sub-grid covered by the geom's bounding box (grown by the margin) in the
order rows, columns, first then second triangle, keeping one contact per prism whose
distance is below the margin, at most ``MAXCONPAIR`` (50) per geom pair. Prisms whose
three top vertices all lie below the geom's lowest point (minus the margin) are skipped.

simjax evaluates the same prisms with static shapes: the sub-grid window has a static
number of cells per axis (from the geom's bounding radius, the margin and the cell
size, decided at trace time; cells beyond MuJoCo's sub-grid are masked), all prisms of
the window are collided at once (vmap; spheres elementwise over (P,) component arrays,
each prism in its triangle's canonical frame), and the first 50 valid contacts in
MuJoCo's order are kept. Per prism (contact normal from the height field to the geom,
distance negative in penetration, position midway between the two surfaces):

- spheres: exact. Outside the prism: closest point on the prism (triangles of its five
  faces); centre inside: the nearest face. Same as MuJoCo's GJK result when the centre
  is outside; when the centre is inside, MuJoCo runs EPA, which stops at its tolerance
  (its positions then differ from the exact ones by up to ~1e-4 on the test models).
- capsules: exact. Segment outside the prism: closest points of segment and prism;
  segment crossing it: separating-axis test over the prism's face normals and the
  crosses of the segment with the prism's edges (a segment parallel to the contact
  face has no unique witness: simjax takes an end, MuJoCo's EPA another point).
- boxes and meshes: separating-axis theorem over face normals and edge crosses of both
  (exact penetration depth and normal); inside the margin but separated, the distance
  along the best axis (a lower bound of GJK's distance, up to ~1e-3 below it).
  MuJoCo 4.0.0 with margin 0 returns box / prism penetrations that are not the
  minimum translation (see the tests); with a margin it agrees with simjax.
- ellipsoids: the best of the candidate axes above (plus fixed directions), refined
  by projected gradient ascent of the separation over unit directions, then Newton on
  each prism vertex's and edge's smooth separation (fixed iteration counts): depths
  agree with MuJoCo's EPA to its tolerance (~1e-6).
- cylinders: the refined axis or a prism vertex's exact optimum; where a prism edge
  meets the rim the result can be below the optimum (measured up to ~1e-2 on random
  deep overlaps; median 2e-8).

Contact positions: midway between the two surfaces at the geom's support point along
the normal (boxes, meshes, cylinders: at the prism's vertex when only that is unique).
MuJoCo takes the midpoint of its GJK/EPA witness points: identical when a support point
is unique; on face-face or edge-edge contacts its witness is one point of the touching
patch and simjax's may be another.

Static data: ``hfield_data``, ``hfield_size`` and ``geom_rbound`` are static Model fields;
the pair margin sizes the window when concrete (a traced margin gets one extra cell of
allowance). Not implemented: height field against SDF geoms (the driver raises
UnsupportedFeatureError).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.collision.common import (MINVAL, Pre, argmax, argmin, cross, dot,
                                            normalize, rot, safe_norm, sel)
from simjax.engine.math import where
from simjax.engine.tables import concrete
from simjax.types import EnableBit
from simjax.types import GeomType as GT

#: mjMAXCONPAIR: contacts per geom pair
MAXCONPAIR = 50
#: refinement iterations for curved geoms (ellipsoid, cylinder) against a prism
REFINE_ITERS = 60

_FIXED_DIRS = np.array([(x, y, z) for x in (-1, 0, 1) for y in (-1, 0, 1) for z in (-1, 0, 1)
                        if (x, y, z) != (0, 0, 0)], np.float64)
_FIXED_DIRS /= np.linalg.norm(_FIXED_DIRS, axis=1, keepdims=True)


def hfield_convex(g1, g2, margin):
    """Type-level marker in the driver's collider table: the driver asks
    :func:`collider_for` for the collider of each height-field pair (static hfield data
    and sub-grid window per pair), so this is never called itself."""
    raise RuntimeError("hfield_convex is a dispatch marker; the collision driver calls "
                       "hfield.collider_for(m, g1, g2, ipair) per pair")


MAXCON = {hfield_convex: MAXCONPAIR}


# --------------------------------------------------------------------------- static plan
def _static_margin(m, g1, g2, ipair):
    """Detection margin (margin + gap) of the pair when the parameters are concrete,
    else None."""
    if m.opt.enableflags & EnableBit.OVERRIDE:
        om = concrete(m.opt.o_margin)
        return None if om is None else float(om)
    if ipair >= 0:
        pm, pg = concrete(m.pair_margin), concrete(m.pair_gap)
        return None if pm is None or pg is None else float(pm[ipair] + pg[ipair])
    gm, gg = concrete(m.geom_margin), concrete(m.geom_gap)
    if gm is None or gg is None:
        return None
    return float(gm[g1] + gm[g2] + gg[g1] + gg[g2])


def window(m, g1, g2, ipair=-1, margin=True):
    """Static sub-grid window (cells along x, cells along y) for height-field geom g1
    and geom g2: enough cells for the bounding box of g2 (half extent at most
    geom_rbound) grown by the pair's margin, anywhere on the grid. With a traced margin
    the window allows one extra cell of margin; ``margin=False``: the window of the
    bounding box alone."""
    hid = int(np.asarray(m.geom_dataid)[g1])
    nrow, ncol = int(np.asarray(m.hfield_nrow)[hid]), int(np.asarray(m.hfield_ncol)[hid])
    size = np.asarray(m.hfield_size, np.float64).reshape(-1, 4)[hid]
    dx, dy = 2 * size[0] / (ncol - 1), 2 * size[1] / (nrow - 1)
    rb = float(np.asarray(m.geom_rbound)[g2])
    mg = _static_margin(m, g1, g2, ipair) if margin else 0.0
    ext_x = 2 * rb + (2 * mg if mg is not None else 2 * dx)
    ext_y = 2 * rb + (2 * mg if mg is not None else 2 * dy)
    nc = min(ncol - 1, int(np.ceil(ext_x / dx * (1 + 1e-9))) + 1)
    nr = min(nrow - 1, int(np.ceil(ext_y / dy * (1 + 1e-9))) + 1)
    return nc, nr


_COLLIDERS: dict = {}


def collider_for(m, g1, g2, ipair=-1):
    """Collider ``fn(geo1, geo2, margin) -> Pre`` for height-field geom g1 against geom
    g2 (static hfield data, geom type, mesh hull and sub-grid window closed over;
    cached, so pairs with equal static data share one collider and one vmap).
    ``fn.maxcon``, the pair's share of the default contact capacity, is min(50, prisms
    in the margin-free window, triangles a disc of the geom's bounding radius can meet
    (:func:`disc_cover`; e.g. 6 around one grid vertex for a small sphere)): static
    data only, so capacities and their split by contact dimension do not depend on
    whether the margins are traced. More contacts than the capacity raise
    WARN_CONTACTFULL. ``fn.bound``: most valid contacts the collider can return for
    this pair (its slots; for a sphere with a concrete margin, at most the triangles
    the disc of radius rbound + margin meets, :func:`disc_cover`), so that the
    driver can prove a contact dim never overflows its slots."""
    hid = int(np.asarray(m.geom_dataid)[g1])
    t2 = int(np.asarray(m.geom_type)[g2])
    nrow, ncol = int(np.asarray(m.hfield_nrow)[hid]), int(np.asarray(m.hfield_ncol)[hid])
    adr = int(np.asarray(m.hfield_adr)[hid])
    data = np.asarray(m.hfield_data, np.float64)[adr:adr + nrow * ncol]
    size = np.asarray(m.hfield_size, np.float64).reshape(-1, 4)[hid]
    nc, nr = window(m, g1, g2, ipair)
    nc0, nr0 = window(m, g1, g2, ipair, margin=False)
    mesh = None
    if t2 == GT.MESH:
        from simjax.engine.collision import convex
        mid = int(np.asarray(m.geom_dataid)[g2])
        tab = convex.mesh_table(m, [mid])          # this mesh only: no padding
        mesh = (tab["vert"][0], tab["normal"][0], tab["edge"][0], tab["hface"][0])
    dx, dy = 2 * size[0] / (ncol - 1), 2 * size[1] / (nrow - 1)
    rb = float(np.asarray(m.geom_rbound)[g2])
    maxcon = min(MAXCONPAIR, 2 * nc0 * nr0)
    if maxcon <= _COVER_MAX:
        maxcon = min(maxcon, disc_cover(dx, dy, rb))
    bound = min(MAXCONPAIR, 2 * nc * nr)
    mg = _static_margin(m, g1, g2, ipair)
    if t2 == GT.SPHERE and mg is not None and bound <= _COVER_MAX:
        # the sphere collider is exact: a contact (distance below the margin) is a
        # prism whose triangle meets the disc of radius rbound + margin (grown by
        # float32 rounding of coordinates as large as the field's)
        slack = 8 * float(np.finfo(np.float32).eps) * (float(np.sum(size)) + rb)
        bound = min(bound, disc_cover(dx, dy, rb + max(mg, 0.0) + slack))
    # the capacity is in the key: geoms of one window size can differ in disc cover
    key = (t2, nrow, ncol, tuple(size), nc, nr, nc0, nr0, maxcon, bound,
           hash(data.tobytes()),
           None if mesh is None else tuple(hash(a.tobytes()) for a in mesh))
    fn = _COLLIDERS.get(key)
    if fn is None:
        fn = functools.partial(_collide, t2=t2, data=data, nrow=nrow, ncol=ncol,
                               size=size, nc=nc, nr=nr, mesh=mesh)
        fn.maxcon = maxcon
        fn.bound = bound
        fn.hfield = True
        _COLLIDERS[key] = fn
    return fn


#: windows of at most this many prisms get the disc bound of :func:`disc_cover`
#: (larger ones reach MAXCONPAIR either way)
_COVER_MAX = 64
#: sample points per cell side in :func:`disc_cover`
_COVER_SAMPLES = 32


def disc_cover(dx, dy, rho):
    """Most triangles of a height-field grid of cells dx x dy (each cut along the
    diagonal from vertex (r, c) to (r + 1, c + 1)) that a disc of radius rho meets,
    wherever it lies: an upper bound. A geom of bounding radius rho meets a prism
    (distance below zero) only where its horizontal projection, within the disc,
    meets the prism's triangle. The grid repeats per cell, so disc centres are sampled
    over one cell, ``_COVER_SAMPLES`` per side; a disc centred anywhere in the cell
    lies within the disc of radius rho + h (h: half the sample diagonal) about the
    nearest sample, so the count of triangles within rho + h of a sample, maximised
    over the samples, bounds the count of any disc (with a relative allowance for
    rounding of the contact distance)."""
    n = _COVER_SAMPLES
    h = 0.5 * np.hypot(dx, dy) / n
    r = (rho + h) * (1 + 1e-6) + 1e-12 * max(dx, dy)
    k = int(np.ceil(r / min(dx, dy))) + 1
    # triangles (x, y) vertices, per cell (i, j) at (i dx, j dy): (0, 1), (0, 0), (1, 1)
    # and (0, 0), (1, 1), (1, 0) in cell units (the two triangles of _collide)
    unit = np.array([[[0, 1], [0, 0], [1, 1]], [[0, 0], [1, 1], [1, 0]]], np.float64)
    ij = np.array([(i, j) for i in range(-k, k + 1) for j in range(-k, k + 1)], np.float64)
    tri = (unit[None] + ij[:, None, None, :]).reshape(-1, 3, 2) * np.array([dx, dy])
    u = np.linspace(0.0, 1.0, n + 1)
    pts = np.stack(np.meshgrid(u * dx, u * dy, indexing="ij"), -1).reshape(-1, 1, 2)
    a, b = tri, np.roll(tri, -1, axis=1)                   # edges a -> b, (T, 3, 2)
    ab = b - a
    # signed side of each edge (triangles counter-clockwise or not: compare with the
    # opposite vertex), inside when on the opposite vertex's side of all three edges
    opp = np.roll(tri, 1, axis=1)
    cr = lambda e, v: e[..., 0] * v[..., 1] - e[..., 1] * v[..., 0]
    inside = np.all(cr(ab[None], pts[:, :, None] - a[None]) * cr(ab, opp - a)[None] >= 0,
                    axis=2)
    t = np.clip(np.sum((pts[:, :, None] - a[None]) * ab[None], -1) /
                np.sum(ab * ab, -1)[None], 0.0, 1.0)
    near = a[None] + t[..., None] * ab[None]
    dist = np.min(np.linalg.norm(pts[:, :, None] - near, axis=-1), axis=2)
    meets = inside | (dist <= r)
    return int(np.max(np.sum(meets, axis=1)))


# --------------------------------------------------------------------------- supports
def _support(t, size, vert, mat, pos, d):
    """World (height-field frame) support point of a geom for directions d (..., 3)."""
    ld = d @ mat
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
    return loc @ mat.T + pos


def _aabb(t, size, vert, mat, pos):
    """(lo, hi) of the geom's bounding box in the height-field frame (supports along
    the frame axes, as MuJoCo)."""
    if t == GT.MESH:
        w = vert @ mat.T
        return jnp.min(w, 0) + pos, jnp.max(w, 0) + pos
    if t == GT.SPHERE:
        h = jnp.broadcast_to(size[0], (3,))
    elif t == GT.CAPSULE:
        h = size[0] + jnp.abs(mat[:, 2]) * size[1]
    elif t == GT.ELLIPSOID:
        h = safe_norm(mat * size[None, :])
    elif t == GT.CYLINDER:
        c = mat[:, 2]
        h = size[0] * jnp.sqrt(jnp.maximum(1 - c * c, MINVAL)) + jnp.abs(c) * size[1]
    elif t == GT.BOX:
        h = jnp.abs(mat) @ size
    else:
        raise ValueError(t)
    return pos - h, pos + h


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
    roll = lambda x: jnp.concatenate([x[1:], x[:1]])
    return jnp.stack([jnp.concatenate([t, b, b]), jnp.concatenate([roll(t), roll(b), t])], 1)


def _seg_closest(p, a, b):
    """Closest point of segment ab to points p (..., 3)."""
    ab = b - a
    den = dot(ab, ab)
    s = jnp.clip(dot(p - a, ab) / sel(den > MINVAL, den, 1.0), 0.0, 1.0)
    return a + s[..., None] * ab


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
    qe = _seg_closest(p, edges[:, 0], edges[:, 1])              # (9, 3)
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
    safe = lambda x: sel(jnp.abs(x) > MINVAL, x, 1.0)
    s = sel(den > MINVAL * jnp.maximum(aa * ee, MINVAL),
            jnp.clip((bb * f - c * ee) / safe(den), 0.0, 1.0), 0.0)
    t = (bb * s + f) / safe(ee)
    s = sel(t < 0, jnp.clip(-c / safe(aa), 0.0, 1.0),
            sel(t > 1, jnp.clip((bb - c) / safe(aa), 0.0, 1.0), s))
    t = jnp.clip(t, 0.0, 1.0)
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


#: parts per stack of :func:`_materialise`
_STACK = 8


def _materialise(parts):
    """The (P,) arrays ``parts`` computed once. On CPU, XLA fuses a whole expression DAG
    into its consumer and a concatenation (or several outputs) of it evaluates the DAG
    again per operand; a reduction is a fusion root whose result is stored, so the
    maximum of the stacked parts and -inf over a new axis of two ends the fusion in one
    kernel per stack, with exactly the values (as :func:`common.once`; the former
    product with the identity took a concatenation kernel and a matrix kernel per
    stack). In stacks of at most ``_STACK`` parts: XLA fuses the operands of such a
    concatenation into it (one kernel), of a longer one it makes a kernel each."""
    shape = max((jnp.shape(p) for p in parts), key=len)
    parts = [jnp.broadcast_to(p, shape) for p in parts]
    out = []
    for i in range(0, len(parts), _STACK):
        x = jnp.stack(parts[i:i + _STACK], -1)
        x = jnp.max(jnp.stack([x, jnp.full_like(x, -jnp.inf)]), axis=0)
        out += [y[:, 0] for y in jnp.split(x, x.shape[-1], axis=-1)]
    return out


def _sphere_canon(z, p, dx, dy, base, r):
    """(dist, pos, normal) of a sphere of radius r against P prisms in the canonical
    frame of their triangle: top vertices A = (0, dy, z[0]), B = (0, 0, z[1]),
    C = (dx, dy, z[2]) (the first triangle of a cell in the cell's frame; the second,
    turned half a turn about the cell's centre, is the same), bottom at -base; ``z``
    three (P,) arrays, ``p`` the centre as three (P,) arrays in each prism's frame.
    The method of :func:`_point_prism` (centre outside: the closest of the five face
    projections that fall in their face and the nine edges' closest points; inside:
    the nearest face), with the static parts of the planes and edges (the sides are
    the planes x = 0, y = dy and the diagonal, the bottom z = -base) written out. In
    stages whose results are materialised (:func:`_materialise`). Outputs (P,) and
    three-tuples of (P,) arrays, in the canonical frame."""
    za, zb, zc = z
    px, py, pz = p
    L = float(np.hypot(dx, dy))
    a3, b3 = dy / L, dx / L                       # diagonal side's normal (a3, -b3, 0)
    one = jnp.ones_like(za)
    pb = pz + base                                # centre above the bottom
    # stage 1: the top plane (normal (tx, ty, tz), offset to), the centre's height over
    # it and the vertical edges' parameters
    ex, ey = -dy * (zc - za), dx * (zb - za)
    ez = dx * dy
    nn = jnp.sqrt(ex * ex + ey * ey + ez * ez)
    tx, ty, tz = ex / nn, ey / nn, ez / nn
    to = ty * dy + tz * za
    s0 = tx * px + ty * py + tz * pz - to

    def vert_u(zv):
        den = zv + base
        return jnp.clip(pb / where(den > MINVAL, den, one), 0.0, 1.0)
    tx, ty, tz, to, s0, u6, u7, u8 = _materialise([tx, ty, tz, to, s0, vert_u(za),
                                                   vert_u(zb), vert_u(zc)])
    top = lambda qx, qy, qz: tx * qx + ty * qy + tz * qz - to
    # stage 2: heights over the other faces, the face projections inside their face,
    # the top edges' parameters, squared distances of the 14 candidates
    s1, s2, s3, s4 = -pb, -px, a3 * px - b3 * py, py - dy
    q0 = (px - s0 * tx, py - s0 * ty, pz - s0 * tz)
    q3x, q3y = px - s3 * a3, py + s3 * b3
    in0 = ((s0 > 0) & (-q0[2] - base <= 0) & (-q0[0] <= 0) &
           (a3 * q0[0] - b3 * q0[1] <= 0) & (q0[1] - dy <= 0))
    in1 = (s1 > 0) & (top(px, py, -base) <= 0) & (s2 <= 0) & (s3 <= 0) & (s4 <= 0)
    in2 = (s2 > 0) & (top(0.0, py, pz) <= 0) & (s1 <= 0) & (-b3 * py <= 0) & (s4 <= 0)
    in3 = (s3 > 0) & (top(q3x, q3y, pz) <= 0) & (s1 <= 0) & (-q3x <= 0) & (q3y - dy <= 0)
    in4 = ((s4 > 0) & (top(px, dy, pz) <= 0) & (s1 <= 0) & (s2 <= 0) &
           (a3 * px - b3 * dy <= 0))
    # a projection outside its face: the largest finite value, never nearer than a
    # projection inside its face
    big = jnp.full_like(za, np.finfo(za.dtype).max)
    dface = [where(ok, sf * sf, big) for ok, sf in
             ((in0, s0), (in1, s1), (in2, s2), (in3, s3), (in4, s4))]

    def seg_u(ax, ay, az, bx, by, bz):          # parameter of the closest point
        den = bx * bx + by * by + bz * bz
        num = (px - ax) * bx + (py - ay) * by + (pz - az) * bz
        return jnp.clip(num / where(den > MINVAL, den, one), 0.0, 1.0)
    # top edges A -> B, B -> C, C -> A as (start, direction)
    tedge = [((0.0, dy, za), (0.0, -dy, zb - za)), ((0.0, 0.0, zb), (dx, dy, zc - zb)),
             ((dx, dy, zc), (-dx, 0.0, za - zc))]
    u0, u1, u2 = (seg_u(*a, *b) for a, b in tedge)
    # bottom edges A' -> B', B' -> C', C' -> A' (horizontal, at -base)
    u3 = jnp.clip((dy - py) / dy, 0.0, 1.0)
    u4 = jnp.clip((px * dx + py * dy) / (dx * dx + dy * dy), 0.0, 1.0)
    u5 = jnp.clip((dx - px) / dx, 0.0, 1.0)

    def points(u):        # the nine edges' closest points (x, y, z) for parameters u
        out = [(a[0] + u[i] * b[0], a[1] + u[i] * b[1], a[2] + u[i] * b[2])
               for i, (a, b) in enumerate(tedge)]
        out += [(0.0, dy - u[3] * dy, -base), (u[4] * dx, u[4] * dy, -base),
                (dx - u[5] * dx, dy, -base)]
        out += [(x, y, -base + u[6 + i] * (zv + base))
                for i, (x, y, zv) in enumerate(((0.0, dy, za), (0.0, 0.0, zb),
                                                (dx, dy, zc)))]
        return out

    def d2(q):
        ox, oy, oz = px - q[0], py - q[1], pz - q[2]
        return ox * ox + oy * oy + oz * oz
    dedge = [d2(q) for q in points((u0, u1, u2, u3, u4, u5, u6, u7, u8))]
    vals = _materialise([u0, u1, u2] + dface + dedge)
    u0, u1, u2, dist2 = vals[0], vals[1], vals[2], vals[3:]
    # stage 3: the nearest face (first maximum) and the closest candidate (first
    # minimum), its point recomputed from the heights and edge parameters
    fn = [(tx, ty, tz), (0.0, 0.0, -1.0), (-1.0, 0.0, 0.0), (a3, -b3, 0.0), (0.0, 1.0, 0.0)]
    sf = [s0, s1, s2, s3, s4]
    fq = [q0, (px, py, -base), (0.0, py, pz), (q3x, q3y, pz), (px, dy, pz)]
    cand = fq + points((u0, u1, u2, u3, u4, u5, u6, u7, u8))
    full = lambda v: v if not isinstance(v, float) else jnp.full_like(za, v)
    # the two choices once (their indices materialised), then the picked values:
    # in one stack with them, every output repeated the comparison chains
    sk, fi = sf[0], jnp.zeros_like(za)
    for f in range(1, 5):
        better = sf[f] > sk
        sk = where(better, sf[f], sk)
        fi = where(better, float(f), fi)
    best, ji = dist2[0], jnp.zeros_like(za)
    for j in range(1, 14):
        closer = dist2[j] < best
        best = where(closer, dist2[j], best)
        ji = where(closer, float(j), ji)
    fi, ji, sk = _materialise([fi, ji, sk])
    nk = tuple(full(x) for x in fn[0])
    for f in range(1, 5):
        nk = tuple(where(fi == f, full(a), b) for a, b in zip(fn[f], nk))
    q = tuple(full(x) for x in cand[0])
    for j in range(1, 14):
        q = tuple(where(ji == j, full(a), b) for a, b in zip(cand[j], q))
    vals = _materialise(list(q) + list(nk))
    q, nk = tuple(vals[:3]), tuple(vals[3:6])
    # stage 4: the contact
    like = _Like(za)
    inside = sk <= 0
    n_out, dd = _vnormalize(_vsub((px, py, pz), q), like)
    n = _vsel(inside, nk, n_out, like)
    dist = where(inside, sk, dd) - r
    pos = tuple(c - n[i] * (r + 0.5 * dist) for i, c in enumerate((px, py, pz)))
    return dist, pos, n


def _sep_axes(axes, v, lo):
    """Separation along unit axes (A, 3) of a prism (vertices v) and a shape whose
    minimum projection along each axis is lo (A,): min(shape) - max(prism)."""
    return lo - jnp.max(axes @ v.T, -1)


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
    return hm - jnp.max(dirs @ v.T, -1)


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
        return dot(b, n) - jnp.max(n @ v.T, -1)

    s = _mesh_sep(vert, mat, pos, mesh, v, dirs, nrm.shape[0]) if t == GT.MESH else sep(dirs)
    k = argmax(s)
    n, sb = dirs[k], s[k]
    if t not in (GT.BOX, GT.MESH):
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
        if t == GT.ELLIPSOID:      # polish from the refined and the top-face normals
            starts = jnp.concatenate([n[None], nrm[:1]])
            cands = jax.vmap(lambda n0: _ellipsoid_polish(size, mat, pos, v, n0, sep))(starts)
            n = cands[argmax(sep(cands))]
        else:       # cylinder: exact optimum of each prism vertex alone
            cands = jnp.concatenate([n[None], jax.vmap(
                lambda p: _point_cylinder_dir(p, pos, mat[:, 2], size[0], size[1]))(v)])
            n = cands[argmax(sep(cands))]
    b = _support(t, size, vert, mat, pos, -n)
    dist = sep(n)
    pos_b = b - n * (0.5 * dist)
    if t not in (GT.BOX, GT.MESH, GT.CYLINDER):
        return dist, pos_b, n
    # witness: the geom's support point when unique, else the prism's when unique
    tol = 1e-9 * (jnp.max(jnp.abs(v)) + jnp.max(size) + jnp.max(jnp.abs(pos)))
    pv = jnp.sort(v @ n)
    prism_unique = pv[-1] - pv[-2] > tol
    ld = mat.T @ n
    if t == GT.BOX:
        geom_unique = jnp.all(jnp.abs(ld) * size > tol)
    elif t == GT.MESH:
        gv = jnp.sort(-(jnp.asarray(vert, dt) @ ld))
        geom_unique = gv[-1] - gv[-2] > tol
    else:
        geom_unique = (jnp.abs(ld[2]) * size[1] > tol) & \
            (safe_norm(ld[:2]) * size[0] > tol)
    a = v[argmax(v @ n)]
    use_a = prism_unique & ~geom_unique
    return dist, sel(use_a, a + n * (0.5 * dist), pos_b), n


def _point_cylinder_dir(p, c, a, r, h):
    """Direction n maximising the separation of point p from a cylinder (centre c,
    unit axis a, radius r, half length h): towards the closest point when p is
    outside, away from the nearest side / cap when inside."""
    x = p - c
    z = dot(a, x)
    rv = x - z * a
    rdir, rho = normalize(rv)
    outside = (rho > r) | (jnp.abs(z) > h)
    q = c + jnp.clip(z, -h, h) * a + jnp.minimum(rho, r) * rdir
    n_out, _ = normalize(q - p)
    cap = jnp.abs(z) - h > rho - r
    n_in = sel(cap, -jnp.sign(z) * a, -rdir)
    return sel(outside, n_out, n_in)


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

        n, _ = inline.scan(step, n0, None, length=12)
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
            return th + jnp.clip(dth, -0.5, 0.5), None

        th, _ = inline.scan(step, jnp.zeros((), dt), None, length=12)
        return jnp.cos(th) * p0 + jnp.sin(th) * q0

    ends = _prism_edges(v)
    cands = jnp.concatenate([n0[None], jax.vmap(vertex)(v),
                             jax.vmap(edge)(ends[:, 0], ends[:, 1])])
    s = sep(cands)
    return cands[argmax(s)]


# --------------------------------------------------------------------------- collider
def _collide(g1, g2, margin, *, t2, data, nrow, ncol, size, nc, nr, mesh):
    """One height-field pair (vmapped by the driver): Pre with min(50, 2 nc nr) slots."""
    dt = g1.pos.dtype
    hm = g1.mat
    lpos = hm.T @ (g2.pos - g1.pos)
    lmat = hm.T @ g2.mat
    s0, s1, s2, s3 = (float(x) for x in size)
    vert = None if mesh is None else jnp.asarray(mesh[0], dt)
    lo, hi = _aabb(t2, g2.size, vert, lmat, lpos)
    # early exits (box-sphere test is implied by the bounding-box test)
    ok = ~((lo[0] - margin > s0) | (hi[0] + margin < -s0) | (lo[1] - margin > s1) |
           (hi[1] + margin < -s1) | (lo[2] - margin > s2) | (hi[2] + margin < -s3))
    fx, fy = (ncol - 1) / (2 * s0), (nrow - 1) / (2 * s1)
    cmin = jnp.maximum(0, jnp.floor((lo[0] - margin + s0) * fx).astype(jnp.int32))
    cmax = jnp.minimum(ncol - 1, jnp.ceil((hi[0] + margin + s0) * fx).astype(jnp.int32))
    rmin = jnp.maximum(0, jnp.floor((lo[1] - margin + s1) * fy).astype(jnp.int32))
    rmax = jnp.minimum(nrow - 1, jnp.ceil((hi[1] + margin + s1) * fy).astype(jnp.int32))
    # cells of the static window in MuJoCo's order (rows, then columns)
    rr = rmin + np.repeat(np.arange(nr, dtype=np.int32), nc)
    cc = cmin + np.tile(np.arange(nc, dtype=np.int32), nr)
    cell_ok = ok & (rr < rmax) & (cc < cmax)
    r0 = jnp.clip(rr, 0, nrow - 2)
    c0 = jnp.clip(cc, 0, ncol - 2)
    dx, dy = 2 * s0 / (ncol - 1), 2 * s1 / (nrow - 1)
    hdata = jnp.asarray(data, dt)
    # one gather of the cell's four corner heights (r, c), (r, c+1), (r+1, c), (r+1, c+1)
    h = hdata[(r0 * ncol + c0)[:, None] + jnp.asarray([0, 1, ncol, ncol + 1])] * s2
    x0, x1 = dx * c0.astype(dt) - s0, dx * (c0 + 1).astype(dt) - s0
    y0, y1 = dy * r0.astype(dt) - s1, dy * (r0 + 1).astype(dt) - s1
    # triangles (r+1, c), (r, c), (r+1, c+1) and (r, c), (r+1, c+1), (r, c+1) per cell
    xs = jnp.stack([x0, x0, x1, x0, x1, x1], -1)
    ys = jnp.stack([y1, y0, y1, y0, y1, y0], -1)
    zs = jnp.stack([h[:, 2], h[:, 0], h[:, 3], h[:, 0], h[:, 3], h[:, 1]], -1)
    top = jnp.stack([xs, ys, zs], -1).reshape(-1, 3, 3)            # (P, 3, 3)
    pok = jnp.repeat(cell_ok, 2)
    zmin = lo[2]
    pok = pok & jnp.any(top[:, :, 2] >= zmin - margin, axis=1)
    bot = jnp.concatenate([top[:, :, :2], jnp.full(top.shape[:2] + (1,), -s3, dt)], 2)
    prisms = jnp.concatenate([bot, top], 1)                        # (P, 6, 3)

    if t2 == GT.SPHERE:
        # prism p = 2 cell + triangle, each in its triangle's canonical frame
        # (_sphere_canon): the first triangle of a cell moved by -(x0, y0), the second
        # turned half a turn about the cell's centre, (x1, y1) to the origin; results
        # back in the height-field frame (exact: sign flips)
        fn = None
        pair = lambda a, b: jnp.stack([a, b], -1).reshape(-1)
        sgn = np.tile(np.array([1.0, -1.0], dt), x0.shape[0])
        ox, oy = pair(x0, x1), pair(y0, y1)
        z = (pair(h[:, 2], h[:, 1]), pair(h[:, 0], h[:, 3]), pair(h[:, 3], h[:, 0]))
        pl = (sgn * (lpos[0] - ox), sgn * (lpos[1] - oy),
              jnp.broadcast_to(lpos[2], ox.shape))
        dist, pc, nc_ = _sphere_canon(z, pl, dx, dy, s3, g2.size[0])
        vals = _materialise([dist, ox + sgn * pc[0], oy + sgn * pc[1], pc[2],
                             sgn * nc_[0], sgn * nc_[1], nc_[2]])
        dist, pos, n = vals[0], jnp.stack(vals[1:4], -1), jnp.stack(vals[4:], -1)
    elif t2 == GT.CAPSULE:
        ax = lmat[:, 2] * g2.size[1]
        fn = lambda v: _capsule_prism(v, s3, lpos - ax, lpos + ax, g2.size[0])
    else:
        fn = lambda v: _convex_prism(t2, g2.size, vert, lmat, lpos, mesh, v, s3)
    if fn is not None:
        dist, pos, n = jax.vmap(fn)(prisms)
    valid = pok & (dist < margin)
    if prisms.shape[0] > MAXCONPAIR:     # else the cap cannot bind (one contact a prism)
        valid = valid & (jnp.cumsum(valid) <= MAXCONPAIR)
    k = min(MAXCONPAIR, prisms.shape[0])
    if k < prisms.shape[0]:
        idx = jnp.nonzero(valid, size=k, fill_value=0)[0]
        keep = jnp.arange(k) < jnp.sum(valid)
        dist, pos, n = dist[idx], pos[idx], n[idx]
        valid = keep
    # written out: vmapped, a product of (k, 3) rows with a 3x3 matrix is a slow
    # batched matrix kernel on CPU
    pos = rot(hm, pos) + g1.pos
    n = rot(hm, n)
    return Pre(dist, pos, n, jnp.zeros_like(pos), valid)


def margin_key(m) -> bytes:
    """Bytes identifying the concrete margin parameters (sub-grid windows depend on
    them), or a marker when they are traced."""
    parts = []
    for name in ("geom_margin", "geom_gap", "pair_margin", "pair_gap"):
        x = getattr(m, name, None)
        a = None if x is None else concrete(x)
        parts.append(b"none" if x is None else b"traced" if a is None
                     else np.asarray(a, np.float64).tobytes())
    om = concrete(m.opt.o_margin)
    parts.append(b"traced" if om is None else np.asarray(om, np.float64).tobytes())
    return b"|".join(parts)
