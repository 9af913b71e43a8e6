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
  (exact penetration depth and normal) and, for shapes apart within the margin, the
  direction of the nearest vertex-edge pair (convex.corner_axis): exact
  distance, as GJK's.
  MuJoCo 4.0.0 with margin 0 returns box / prism penetrations that are not the
  minimum translation (see the tests); with a margin it agrees with simjax.
- ellipsoids: the best of the candidate axes above (plus fixed directions), refined
  by projected gradient ascent of the separation over unit directions, then Newton on
  each prism vertex's and edge's smooth separation (fixed iteration counts): depths
  agree with MuJoCo's EPA to its tolerance (~1e-6).
- cylinders: the best axis refined as convex-convex pairs are (convex.py's ascent,
  with steps kept on the cylinder's and the prism's ridges), or a prism vertex's
  exact optimum (distance errors on the tests' random field: median 1.8e-8, at most
  7.7e-7).

Contact positions: midway between the two surfaces at the geom's support point along
the normal (boxes, meshes, cylinders: at the prism's vertex when only that is unique;
at the closest points of an edge of each, when both support features are edges).
MuJoCo takes the midpoint of its GJK/EPA witness points: identical when a support point
is unique or the features are two edges; on face contacts its witness is one point of
the touching patch and simjax's may be another (up to 1.5e-4 apart on the tests' random
field).

This module plans the sub-grid window and its capacity (static), builds the prisms and
keeps the contacts; the per-prism colliders are in hfield_prism.py.

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

from simjax.engine.collision.common import (MINVAL, Pre, reduce_shared, rot, rot_t,
                                            safe_norm)
# the per-prism colliders (hfield_prism.py)
from simjax.engine.collision.hfield_prism import (_capsule_prism, _convex_prism,
                                                  _sphere_canon)
from simjax.engine.tables import concrete
from simjax.types import EnableBit
from simjax.types import GeomType as GT

#: mjMAXCONPAIR: contacts per geom pair
MAXCONPAIR = 50


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
    """Collider ``fn(geo1, geo2, margin) -> Pre`` for height-field geom g1 against geom g2
    (static hfield data, geom type, mesh hull and sub-grid window closed over; cached,
    so pairs with equal static data share one collider and one vmap).
    ``fn.maxcon``, the pair's share of the default contact capacity, is min(50, prisms
    in the margin-free window, triangles a disc of the geom's bounding radius can meet
    (:func:`disc_cover`; e.g. 6 around one grid vertex for a small sphere)): static data
    only, so capacities and their split by contact dimension do not depend on whether
    the margins are traced. More contacts than the capacity raise WARN_CONTACTFULL.
    ``fn.bound``: most valid contacts the collider can return for this pair (its slots;
    for a sphere with a concrete margin, at most the triangles the disc of radius rbound
    + margin meets, :func:`disc_cover`), so that the driver can prove a contact dim
    never overflows its slots."""
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

    def cr(e, v):
        return e[..., 0] * v[..., 1] - e[..., 1] * v[..., 0]
    inside = np.all(cr(ab[None], pts[:, :, None] - a[None]) * cr(ab, opp - a)[None] >= 0,
                    axis=2)
    t = np.clip(np.sum((pts[:, :, None] - a[None]) * ab[None], -1) /
                np.sum(ab * ab, -1)[None], 0.0, 1.0)
    near = a[None] + t[..., None] * ab[None]
    dist = np.min(np.linalg.norm(pts[:, :, None] - near, axis=-1), axis=2)
    meets = inside | (dist <= r)
    return int(np.max(np.sum(meets, axis=1)))


# --------------------------------------------------------------------------- supports
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


# --------------------------------------------------------------------------- collider
def _collide(g1, g2, margin, *, t2, data, nrow, ncol, size, nc, nr, mesh):
    """One height-field pair (vmapped by the driver): Pre with min(50, 2 nc nr) slots."""
    dt = g1.pos.dtype
    hm = g1.mat
    lpos = rot_t(hm, g2.pos - g1.pos)        # written out (see rot)
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
    if t2 == GT.SPHERE:
        return _sphere_window(g1, g2, margin, ok, lo[2], lpos, rmin, rmax, cmin, cmax,
                              data=data, nrow=nrow, ncol=ncol, size=size, nc=nc, nr=nr)
    r0, c0, cell_ok = _window(ok, rmin, rmax, cmin, cmax, nrow, ncol, nr, nc)
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

    if t2 == GT.CAPSULE:
        ax = lmat[:, 2] * g2.size[1]

        def fn(v):
            return _capsule_prism(v, s3, lpos - ax, lpos + ax, g2.size[0])
    else:
        def fn(v):
            return _convex_prism(t2, g2.size, vert, lmat, lpos, mesh, v, s3)
    dist, pos, n = jax.vmap(fn)(prisms)
    dist, pos, n, valid = _first(dist, pos, n, pok & (dist < margin))
    # written out: vmapped, a product of (k, 3) rows with a 3x3 matrix is a slow
    # batched matrix kernel on CPU
    pos = rot(hm, pos) + g1.pos
    n = rot(hm, n)
    return Pre(dist, pos, n, jnp.zeros_like(pos), valid)


def _window(ok, rmin, rmax, cmin, cmax, nrow, ncol, nr, nc, per=1):
    """The cells of the static nr x nc window at (rmin, cmin) in MuJoCo's order (rows,
    then columns), each ``per`` times (one entry per prism: 2): their rows and columns
    clipped to the grid's cells, and whether each lies inside the window (rmax, cmax)
    and the pair passed the early exits (``ok``)."""
    rr = rmin + np.repeat(np.arange(nr, dtype=np.int32), per * nc)
    cc = cmin + np.tile(np.repeat(np.arange(nc, dtype=np.int32), per), nr)
    cell_ok = ok & (rr < rmax) & (cc < cmax)
    return jnp.clip(rr, 0, nrow - 2), jnp.clip(cc, 0, ncol - 2), cell_ok


def _first(dist, pos, n, valid):
    """The first MAXCONPAIR valid contacts of the prisms in order (compacted to
    MAXCONPAIR slots when there are more prisms; else unchanged: one contact a prism)."""
    P = dist.shape[0]
    if P <= MAXCONPAIR:
        return dist, pos, n, valid
    idx = jnp.nonzero(valid, size=MAXCONPAIR, fill_value=0)[0]     # the first ones
    keep = jnp.arange(MAXCONPAIR) < jnp.sum(valid)
    return dist[idx], pos[idx], n[idx], keep


def _sphere_window(g1, g2, margin, ok, zmin, lpos, rmin, rmax, cmin, cmax, *, data,
                   nrow, ncol, size, nc, nr):
    """Sphere g2 against the prisms of the static window at (rmin, cmin) (:func:`_collide`
    for spheres): each prism's heights gathered and its frame's origin computed from its
    static offsets in the window (prism p = 2 cell + triangle, cells in MuJoCo's order),
    the exact sphere-prism contact in the triangle's canonical frame
    (:func:`hfield_prism._sphere_canon`; the first triangle of a cell moved by -(x0,
    y0), the second turned half a turn about the cell's centre, (x1, y1) to the origin),
    its normal turned back and into the world frame, and stored by one reduction with
    an output per component (:func:`common.reduce_shared`: the expression evaluated
    once)."""
    dt = g1.pos.dtype
    s0, s1, s2, s3 = (float(x) for x in size)
    dx, dy = 2 * s0 / (ncol - 1), 2 * s1 / (nrow - 1)
    tri = np.tile(np.array([0, 1], np.int32), nc * nr)
    r0, c0, cell_ok = _window(ok, rmin, rmax, cmin, cmax, nrow, ncol, nr, nc, per=2)
    # top vertices A, B, C: (r+1, c), (r, c), (r+1, c+1) and (r, c+1), (r+1, c+1), (r, c)
    offs = np.stack([np.where(tri == 1, o1, o0) for o0, o1 in
                     ((ncol, 1), (0, ncol + 1), (ncol + 1, 0))], -1).astype(np.int32)
    hdata = jnp.asarray(data, dt)
    z = hdata[(r0 * ncol + c0)[:, None] + offs] * s2                   # (P, 3), one gather
    ox = dx * (c0 + tri).astype(dt) - s0
    oy = dy * (r0 + tri).astype(dt) - s1
    sgn = (1 - 2 * tri).astype(dt)
    pl = (sgn * (lpos[0] - ox), sgn * (lpos[1] - oy), jnp.broadcast_to(lpos[2], ox.shape))
    pok = cell_ok & jnp.any(z >= zmin - margin, axis=1)
    # the heights, the centre and the prisms' flags stored (one reduction): LLVM
    # vectorises the contact's kernel then (with the gather in it, its loop stayed
    # scalar: the collider alone took 1.6x the time), and the window's per-pair values
    # are read by this kernel alone
    za, zb, zc, *pl, pok = reduce_shared(z[:, 0], z[:, 1], z[:, 2], *pl, pok)
    dist, nc_ = _sphere_canon((za, zb, zc), pl, dx, dy, s3, g2.size[0])
    hm = g1.mat
    n = (sgn * nc_[0], sgn * nc_[1], nc_[2])
    n = [n[0] * hm[i, 0] + n[1] * hm[i, 1] + n[2] * hm[i, 2] for i in range(3)]
    # the position from the sphere's centre (world frame): midway between the surfaces
    k = g2.size[0] + 0.5 * dist
    vals = reduce_shared(dist, *(g2.pos[i] - n[i] * k for i in range(3)), *n,
                         pok & (dist < margin))
    pos, n = jnp.stack(vals[1:4], -1), jnp.stack(vals[4:7], -1)
    dist, pos, n, valid = _first(vals[0], pos, n, vals[7])
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
